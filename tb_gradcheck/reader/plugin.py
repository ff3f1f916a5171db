"""The TensorBoard plugin behind the Gradients tab: loader, routes, static files.

Loaded through the ``tensorboard_plugins`` entry point, so importing this
module must not import TensorFlow (an ImportError here would stop
TensorBoard from starting). Routes are documented in docs/http_api.md.
"""

import functools
import json
import pathlib

import werkzeug
from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin

from tb_gradcheck.core import metadata
from tb_gradcheck.reader import align
from tb_gradcheck.reader import binning
from tb_gradcheck.reader import export
from tb_gradcheck.reader import queries
from tb_gradcheck.reader import store
from tb_gradcheck.reader import wire

# Points kept per tag when the user does not say: all of them. TensorBoard's
# defaults for an unknown plugin (10 in the Python path, 100 in the Rust one)
# would silently drop almost every step of a run. A user's
# --samples_per_plugin gradients=N still wins.
DEFAULT_SAMPLES = 0

_MAX_WIDTH = 100_000
_MAX_INDEX = 2**62

_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}

# JSON, under a media type TensorBoard does not gzip (see _respond_json).
PACKED_TYPE = "application/vnd.tb-gradcheck+json"
_STATIC_ROUTE = f"/data/plugin/{metadata.PLUGIN_NAME}/static/"


def _frontend_dir():
    # Installed: the wheel carries frontend/ inside the package. Source
    # checkout: frontend/ sits beside the package.
    package = pathlib.Path(__file__).resolve().parents[1]
    for candidate in (package / "frontend", package.parent / "frontend"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"tb_gradcheck's frontend files are missing: no {package / 'frontend'}")


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
            "/align": self._serve_align,
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
            ctx,
            eid,
            _required(args, "run"),
            _required(args, "metric"),
            *_selection(args),
            *_binning(args),
            window=_window(args),
        )
        return _respond_json(request, body)

    @_route
    def _serve_compare(self, request):
        ctx, eid = _context(request)
        args = request.args
        body = self.compare_impl(
            ctx,
            eid,
            _required(args, "run"),
            _required(args, "other"),
            _required(args, "metric"),
            *_selection(args),
            *_binning(args),
            window=_window(args),
            align=_choice(args, "align", align.REQUESTS, align.NAME),
        )
        return _respond_json(request, body)

    @_route
    def _serve_align(self, request):
        ctx, eid = _context(request)
        args = request.args
        body = self.align_impl(
            ctx,
            eid,
            _required(args, "run"),
            _required(args, "other"),
            _choice(args, "granularity", metadata.GRANULARITIES, "layer"),
            _choice(args, "align", align.REQUESTS, align.AUTO),
            _one(args, "metric") == metadata.CHECK_METRIC,
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
        body, name = self.export_impl(
            ctx, eid, _required(args, "run"), _required(args, "metric"), *_selection(args), fmt
        )
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
        name = request.path[len(_STATIC_ROUTE) :] if request.path.startswith(_STATIC_ROUTE) else request.path
        path = self._static.get(name)
        if path is None:
            raise errors.NotFoundError(f"no static file {name!r}")
        return http_util.Respond(request, path.read_bytes(), _STATIC_TYPES[path.suffix])

    # -- logic --------------------------------------------------------------

    def runs_impl(self, ctx, experiment_id):
        """The body of ``GET runs`` (see docs/http_api.md)."""
        return {"runs": queries.runs(self._store, ctx, experiment_id), "samples_per_plugin": self._samples}

    def heatmap_impl(
        self,
        ctx,
        experiment_id,
        run,
        metric,
        granularity="layer",
        aggregate="last",
        width=None,
        reduce="max",
        encoding="json",
        window=None,
    ):
        """The body of ``GET heatmap`` (built by ``wire.heatmap_body``)."""
        heat = queries.heatmap(self._store, ctx, experiment_id, run, metric, granularity, aggregate)
        return wire.heatmap_body(heat, width, reduce, encoding, window)

    def compare_impl(
        self,
        ctx,
        experiment_id,
        run,
        other,
        metric,
        granularity="layer",
        aggregate="last",
        width=None,
        reduce="max",
        encoding="json",
        window=None,
        align=align.NAME,
    ):
        """The body of ``GET compare``: ``run`` over ``other``, rows aligned by name or by structure."""
        a, b, found = queries.compare(
            self._store, ctx, experiment_id, run, other, metric, granularity, aggregate, align
        )
        return wire.compare_body(a, b, found, width, reduce, encoding, window)

    def align_impl(self, ctx, experiment_id, run, other, granularity="layer", request=align.AUTO, check=False):
        """The body of ``GET align``: which rows of ``run`` are which rows of ``other``."""
        kind = metadata.KIND_CHECK if check else metadata.KIND_STATS
        found = queries.alignment(self._store, ctx, experiment_id, run, other, granularity, request, kind)
        return {"run": run, "other": other, "granularity": granularity, **wire.alignment_body(found)}

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
        body["failures"] = sorted(body["failures"], key=wire.worst_first)
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
        _choice(args, "encoding", wire.ENCODINGS, "json"),
    )


def _window(args):
    """The ``wire.Window`` of ``first_step``, ``last_step``, ``row_start`` and ``row_end``."""
    first, last = _int(args, "first_step", 0, _MAX_INDEX), _int(args, "last_step", 0, _MAX_INDEX)
    start, end = _int(args, "row_start", 0, _MAX_INDEX), _int(args, "row_end", 0, _MAX_INDEX)
    if first is not None and last is not None and first > last:
        raise errors.InvalidArgumentError(f"first_step must not exceed last_step, got {first} > {last}")
    start = 0 if start is None else start
    if end is not None and end < start:
        raise errors.InvalidArgumentError(f"row_end must not be below row_start, got {end} < {start}")
    return wire.Window(first, last, start, end)


def _respond_json(request, body, headers=None):
    """``http_util.Respond`` of a JSON body, encoded by the C encoder when it can be.

    Respond walks every value in Python to turn NaN and infinities into
    strings (json_util.Cleanse): for a 2,000 x 200 heatmap that is most of
    the request, and under 16 concurrent clients it is what they queue on.
    Matrices already hold those strings (``_json_matrix``), so a body with
    no float NaN/Inf left is encoded directly, to the same text; any other
    body takes Respond's own path.

    A packed matrix (``encoding=f32``, ``wire.PACKED``) goes out as it is,
    under ``PACKED_TYPE``: base64 of float32 gzips by a quarter only, and
    TensorBoard's gzip of it (level 3, in Respond) took 0.4 s per 10 MB on a
    2-core machine (2,000 rows x 1,000 steps), most of such a request and
    more than the quarter saves on links faster than about 50 Mbit/s. Its
    base64 text needs no escapes, so it is joined to the JSON text of the
    rest instead of scanned by the encoder (80 ms per 10 MB).
    """
    packed = {k: body[k] for k in wire.PACKED if isinstance(body.get(k), str)}
    if packed:
        body = {k: v for k, v in body.items() if k not in packed}
    try:
        text = json.dumps(body, allow_nan=False, ensure_ascii=False)
    except (ValueError, TypeError):
        return http_util.Respond(request, dict(body, **packed), "application/json", headers=headers)
    if not packed:
        return http_util.Respond(request, text, "application/json", headers=headers)
    fields = ", ".join(f'"{k}": "{v}"' for k, v in packed.items())
    text = text[:-1] + (", " if body else "") + fields + "}"
    return http_util.Respond(request, text, PACKED_TYPE, headers=headers)


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
