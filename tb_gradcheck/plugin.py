"""The TensorBoard plugin behind the Gradients tab: loader, routes, static files.

Loaded through the ``tensorboard_plugins`` entry point, so importing this
module must not import TensorFlow (an ImportError here would stop
TensorBoard from starting). Routes are documented in docs/http_api.md.
"""

import base64
import functools
import json
import pathlib

import numpy as np
import werkzeug
from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin

from tb_gradcheck import binning
from tb_gradcheck import export
from tb_gradcheck import metadata
from tb_gradcheck import queries
from tb_gradcheck import store

# Points kept per tag when the user does not say: all of them. TensorBoard's
# defaults for an unknown plugin (10 in the Python path, 100 in the Rust one)
# would silently drop almost every step of a run. A user's
# --samples_per_plugin gradients=N still wins.
DEFAULT_SAMPLES = 0

_MAX_WIDTH = 100_000
_ENCODINGS = ("json", "f32")

_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
_STATIC_ROUTE = f"/data/plugin/{metadata.PLUGIN_NAME}/static/"


def _frontend_dir():
    # Installed: the wheel carries frontend/ inside the package. Source
    # checkout: frontend/ sits beside the package.
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "frontend", here.parent / "frontend"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"tb_gradcheck's frontend files are missing: no {here / 'frontend'}")


def _route(handler):
    """A WSGI route whose query errors become TensorBoard's 404 and 400 responses."""

    @functools.wraps(handler)
    def wrapped(self, request):
        try:
            return handler(self, request)
        except queries.NotFound as e:
            raise errors.NotFoundError(str(e)) from None
        except queries.BadRequest as e:
            raise errors.InvalidArgumentError(str(e)) from None

    return werkzeug.wrappers.Request.application(wrapped)


class GradientsLoader(base_plugin.TBLoader):
    """Sets the plugin's sampling default before TensorBoard builds its data ingester."""

    def fix_flags(self, flags):
        samples = getattr(flags, "samples_per_plugin", None)
        if isinstance(samples, dict):
            samples.setdefault(metadata.PLUGIN_NAME, DEFAULT_SAMPLES)

    def load(self, context):
        return GradientsPlugin(context)


class GradientsPlugin(base_plugin.TBPlugin):
    """Serves per-layer gradient heatmaps from ``context.data_provider``."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context):
        self._store = store.Store(context.data_provider)
        flags = getattr(context, "flags", None)
        samples = getattr(flags, "samples_per_plugin", None) or {}
        self._samples = samples.get(metadata.PLUGIN_NAME, DEFAULT_SAMPLES)
        self._static = {p.name: p for p in _frontend_dir().iterdir() if p.suffix in _STATIC_TYPES}

    def get_plugin_apps(self):
        return {
            "/runs": self._serve_runs,
            "/heatmap": self._serve_heatmap,
            "/compare": self._serve_compare,
            "/findings": self._serve_findings,
            "/export": self._serve_export,
            "/checks": self._serve_checks,
            "/static/*": self._serve_static,
        }

    def is_active(self):
        # Asked only when no run has gradient data yet. Stay listed, so the
        # tab can say how to write some instead of vanishing into "inactive".
        return True

    def data_plugin_names(self):
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/static/index.js", tab_name="Gradients")

    # -- routes -------------------------------------------------------------

    @_route
    def _serve_runs(self, request):
        ctx, eid = _context(request)
        return _respond_json(request, self.runs_impl(ctx, eid))

    @_route
    def _serve_heatmap(self, request):
        ctx, eid = _context(request)
        args = request.args
        body = self.heatmap_impl(
            ctx, eid, _required(args, "run"), _required(args, "metric"), *_selection(args), *_binning(args)
        )
        return _respond_json(request, body)

    @_route
    def _serve_compare(self, request):
        ctx, eid = _context(request)
        args = request.args
        body = self.compare_impl(
            ctx, eid, _required(args, "run"), _required(args, "other"), _required(args, "metric"),
            *_selection(args), *_binning(args),
        )
        return _respond_json(request, body)

    @_route
    def _serve_findings(self, request):
        ctx, eid = _context(request)
        return _respond_json(request, self.findings_impl(ctx, eid, _required(request.args, "run")))

    @_route
    def _serve_export(self, request):
        ctx, eid = _context(request)
        args = request.args
        fmt = _choice(args, "format", export.FORMATS, "csv")
        body, name = self.export_impl(ctx, eid, _required(args, "run"), _required(args, "metric"), *_selection(args), fmt)
        headers = [("Content-Disposition", export.content_disposition(name))]
        if fmt == "json":
            return _respond_json(request, body, headers=headers)
        return http_util.Respond(request, body, "text/csv", headers=headers)

    @_route
    def _serve_checks(self, request):
        ctx, eid = _context(request)
        args = request.args
        granularity = _choice(args, "granularity", metadata.GRANULARITIES, "layer")
        return _respond_json(request, self.checks_impl(ctx, eid, _required(args, "run"), granularity))

    @_route
    def _serve_static(self, request):
        # TensorBoard's middleware has already moved --path_prefix and
        # /experiment/<id> into SCRIPT_NAME, so the path starts with the
        # route itself; what follows must be one of our file names exactly.
        name = request.path[len(_STATIC_ROUTE):] if request.path.startswith(_STATIC_ROUTE) else request.path
        path = self._static.get(name)
        if path is None:
            raise errors.NotFoundError(f"no static file {name!r}")
        return http_util.Respond(request, path.read_bytes(), _STATIC_TYPES[path.suffix])

    # -- logic --------------------------------------------------------------

    def runs_impl(self, ctx, experiment_id):
        """The body of ``GET runs`` (see docs/http_api.md)."""
        return {"runs": queries.runs(self._store, ctx, experiment_id), "samples_per_plugin": self._samples}

    def heatmap_impl(self, ctx, experiment_id, run, metric, granularity="layer", aggregate="last", width=None,
                     reduce="max", encoding="json"):
        """The body of ``GET heatmap``."""
        heat = queries.heatmap(self._store, ctx, experiment_id, run, metric, granularity, aggregate)
        return _heatmap_body(heat, width, reduce, encoding)

    def compare_impl(self, ctx, experiment_id, run, other, metric, granularity="layer", aggregate="last",
                     width=None, reduce="max", encoding="json"):
        """The body of ``GET compare``: ``run`` over ``other``, rows aligned by name."""
        heat, only_run, only_other = queries.compare(
            self._store, ctx, experiment_id, run, other, metric, granularity, aggregate)
        body = _heatmap_body(heat, width, reduce, encoding)
        body.update(other=other, only_in_run=only_run, only_in_other=only_other)
        return body

    def findings_impl(self, ctx, experiment_id, run):
        """The body of ``GET findings``."""
        findings = queries.findings(self._store, ctx, experiment_id, run)
        return {"run": run, "findings": [f.to_dict() for f in findings]}

    def export_impl(self, ctx, experiment_id, run, metric, granularity, aggregate, fmt):
        """``(body, filename)`` of ``GET export``: the unbinned matrix as CSV text or a JSON-able dict."""
        return queries.export(self._store, ctx, experiment_id, run, metric, granularity, aggregate, fmt)

    def checks_impl(self, ctx, experiment_id, run, granularity="layer"):
        """The body of ``GET checks``: the latest check of every row, its failures, and each row's record."""
        body = queries.checks(self._store, ctx, experiment_id, run, granularity)
        # Worst first; a NaN relative error (non-finite analytic gradient) is the worst of all.
        body["failures"] = sorted(body["failures"], key=_worst_first)
        return body


def _selection(args):
    """``(granularity, aggregate)`` from the query, validated where the queries cannot."""
    aggregate = _one(args, "aggregate")
    return _choice(args, "granularity", metadata.GRANULARITIES, "layer"), "last" if aggregate is None else aggregate


def _binning(args):
    """``(width, reduce, encoding)`` from the query."""
    return (
        _int(args, "width", 1, _MAX_WIDTH),
        _choice(args, "reduce", binning.REDUCERS, "max"),
        _choice(args, "encoding", _ENCODINGS, "json"),
    )


def _heatmap_body(heat, width=None, reduce="max", encoding="json"):
    """The JSON of ``GET heatmap`` for a ``queries.Heatmap``, binned to ``width`` columns when given.

    ``encoding="f32"`` sends the matrix as base64 little-endian float32
    (``values_f32``, row-major steps x rows, NaN and infinities as themselves)
    plus a bitmap of missing cells (``missing_bits``, numpy.packbits order),
    instead of nested lists: exact, a third of the bytes, and ~100x cheaper to
    encode than JSON numbers, which is what keeps a 10,000-step heatmap quick.
    """
    values, missing, status, status_missing = heat.values, heat.missing, heat.status, heat.status_missing
    steps, step_ends, binned = heat.steps, None, None
    if width is not None and len(steps) > width:
        first, step_ends, values, missing = binning.bin_steps(steps, values, missing, width, reduce)
        if status is not None:
            # Status codes are ordered by severity: a bin shows its worst.
            _, _, status, status_missing = binning.bin_steps(steps, status, status_missing, width, "max")
        steps, binned = first, reduce
    return {
        "run": heat.run,
        "metric": heat.metric,
        "granularity": heat.granularity,
        "aggregate": heat.aggregate,
        "layers": heat.rows,
        "steps": steps.tolist(),
        "step_ends": None if step_ends is None else step_ends.tolist(),
        **_encode_matrix(values, missing, encoding),
        "status": None if status is None else _status_matrix(status, status_missing),
        "num_steps": len(heat.steps),
        "total_steps": heat.total_steps,
        "reduce": binned,
    }


def _worst_first(cell):
    error = cell["relative_error"]
    return -np.inf if error is None or np.isnan(error) else -error


def _describe(matrix):
    steps = matrix.steps
    return {
        "rows": matrix.rows,
        "num_steps": int(len(steps)),
        "first_step": int(steps[0]) if len(steps) else None,
        "last_step": int(steps[-1]) if len(steps) else None,
    }


def _status_matrix(status, missing):
    names = metadata.CHECK_STATUSES
    return [
        [None if m or not 0 <= v < len(names) else names[int(v)] for v, m in zip(row_v, row_m)]
        for row_v, row_m in zip(status.tolist(), missing.tolist())
    ]


def _encode_matrix(values, missing, encoding):
    if encoding == "f32":
        return {
            "values": None,
            "encoding": "f32",
            "values_f32": base64.b64encode(np.ascontiguousarray(values, "<f4").tobytes()).decode("ascii"),
            "missing_bits": base64.b64encode(np.packbits(missing, axis=None).tobytes()).decode("ascii"),
        }
    return {"values": _json_matrix(values, missing), "encoding": "json"}


def _json_matrix(values, missing):
    """Nested lists: None for missing, "NaN", "Infinity", "-Infinity" for non-finite values."""
    values = values.astype(np.float64)
    out = values.tolist()
    for i, j in zip(*np.nonzero(~missing & ~np.isfinite(values))):
        v = values[i, j]
        out[i][j] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    for i, j in zip(*np.nonzero(missing)):
        out[i][j] = None
    return out


def _respond_json(request, body, headers=None):
    """``http_util.Respond`` of a JSON body, encoded by the C encoder when it can be.

    Respond walks every value in Python to turn NaN and infinities into
    strings (json_util.Cleanse): for a 2,000 x 200 heatmap that is most of
    the request, and under 16 concurrent clients it is what they queue on.
    Matrices already hold those strings (``_json_matrix``), so a body with
    no float NaN/Inf left is encoded directly, to the same text; any other
    body takes Respond's own path.
    """
    try:
        text = json.dumps(body, allow_nan=False, ensure_ascii=False)
    except (ValueError, TypeError):
        return http_util.Respond(request, body, "application/json", headers=headers)
    return http_util.Respond(request, text, "application/json", headers=headers)


def _context(request):
    return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)


def _one(args, name):
    """The value of a query parameter, or None; a parameter given twice is ambiguous (400)."""
    values = args.getlist(name)
    if len(values) > 1:
        raise errors.InvalidArgumentError(f"parameter {name!r} given {len(values)} times: {values!r}")
    return values[0] if values else None


def _required(args, name):
    value = _one(args, name)
    if value is None or value == "":
        raise errors.InvalidArgumentError(f"missing required parameter {name!r}")
    return value


def _choice(args, name, choices, default):
    value = _one(args, name)
    value = default if value is None else value
    if value not in choices:
        raise errors.InvalidArgumentError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _int(args, name, low, high):
    raw = _one(args, name)
    if raw is None or raw == "":
        return None
    # ASCII digits only: int() would also take " 7", "1_000" and "\u0663".
    if not (raw.isascii() and raw.lstrip("-").isdigit()) or len(raw) > 20:
        raise errors.InvalidArgumentError(f"{name} must be an integer, got {raw[:100]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise errors.InvalidArgumentError(f"{name} must be between {low} and {high}, got {value}")
    return value
