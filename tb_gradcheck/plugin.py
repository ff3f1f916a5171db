"""The TensorBoard plugin behind the Gradients tab: loader, routes, static files.

Loaded through the ``tensorboard_plugins`` entry point, so importing this
module must not import TensorFlow (an ImportError here would stop
TensorBoard from starting). Routes are documented in docs/http_api.md.
"""

import pathlib

import numpy as np
import werkzeug
from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin

from tb_gradcheck import binning
from tb_gradcheck import metadata
from tb_gradcheck.store import Store

# Points kept per tag when the user does not say: all of them. TensorBoard's
# defaults for an unknown plugin (10 in the Python path, 100 in the Rust one)
# would silently drop almost every step of a run. A user's
# --samples_per_plugin gradients=N still wins.
DEFAULT_SAMPLES = 0

_MAX_WIDTH = 100_000

_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}


def _frontend_dir():
    # Installed: the wheel carries frontend/ inside the package. Source
    # checkout: frontend/ sits beside the package.
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "frontend", here.parent / "frontend"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"tb_gradcheck's frontend files are missing: no {here / 'frontend'}")


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
        self._provider = context.data_provider
        self._store = Store(context.data_provider) if context.data_provider is not None else None
        flags = getattr(context, "flags", None)
        samples = getattr(flags, "samples_per_plugin", None) or {}
        self._samples = samples.get(metadata.PLUGIN_NAME, DEFAULT_SAMPLES)
        self._static = {p.name: p for p in _frontend_dir().iterdir() if p.suffix in _STATIC_TYPES}

    def get_plugin_apps(self):
        return {
            "/runs": self._serve_runs,
            "/heatmap": self._serve_heatmap,
            "/checks": self._serve_checks,
            "/static/*": self._serve_static,
        }

    def is_active(self):
        return False  # activity comes from data_plugin_names()

    def data_plugin_names(self):
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/static/index.js", tab_name="Gradients")

    # -- routes -------------------------------------------------------------

    @werkzeug.wrappers.Request.application
    def _serve_runs(self, request):
        ctx, eid = _context(request)
        return http_util.Respond(request, self.runs_impl(ctx, eid), "application/json")

    @werkzeug.wrappers.Request.application
    def _serve_heatmap(self, request):
        ctx, eid = _context(request)
        args = request.args
        body = self.heatmap_impl(
            ctx,
            eid,
            run=_required(args, "run"),
            metric=_required(args, "metric"),
            granularity=_choice(args, "granularity", metadata.GRANULARITIES, "layer"),
            aggregate=args.get("aggregate", "last"),
            width=_int(args, "width", 1, _MAX_WIDTH),
            reduce=_choice(args, "reduce", binning.REDUCERS, "max"),
        )
        return http_util.Respond(request, body, "application/json")

    @werkzeug.wrappers.Request.application
    def _serve_checks(self, request):
        ctx, eid = _context(request)
        args = request.args
        body = self.checks_impl(
            ctx,
            eid,
            run=_required(args, "run"),
            granularity=_choice(args, "granularity", metadata.GRANULARITIES, "layer"),
        )
        return http_util.Respond(request, body, "application/json")

    @werkzeug.wrappers.Request.application
    def _serve_static(self, request):
        name = request.path.rsplit("/static/", 1)[-1]
        path = self._static.get(name)
        if path is None:
            raise errors.NotFoundError(f"no static file {name!r}")
        return http_util.Respond(request, path.read_bytes(), _STATIC_TYPES[path.suffix])

    # -- logic --------------------------------------------------------------

    def runs_impl(self, ctx, experiment_id):
        """The body of ``GET runs`` (see docs/http_api.md)."""
        out = []
        for run, index in sorted(self._store.runs(ctx, experiment_id).items()):
            aggregates = _metric_aggregates(index)
            entry = {
                "run": run,
                "metrics": list(aggregates),
                "aggregates": aggregates,
                "window": index.window(),
                "granularities": {},
                "check_granularities": [g for g in metadata.GRANULARITIES if index.layouts(metadata.KIND_CHECK, g)],
                "total_steps": None,
                "sampled": False,
                "problems": [p.to_dict() for p in index.problems],
            }
            kept = 0
            for kind in (metadata.KIND_STATS, metadata.KIND_CHECK):
                for granularity in metadata.GRANULARITIES:
                    if granularity in entry["granularities"] or not index.layouts(kind, granularity):
                        continue
                    matrix = self._store.matrix(ctx, experiment_id, index, kind, granularity)
                    entry["problems"].extend(p.to_dict() for p in matrix.problems)
                    entry["granularities"][granularity] = _describe(matrix)
                    if kind == metadata.KIND_STATS:
                        kept = max(kept, len(matrix.steps))
            if metadata.KIND_STATS in index.kinds():
                entry["total_steps"] = self._store.total_writes(ctx, experiment_id, index)
                entry["sampled"] = entry["total_steps"] is not None and kept < entry["total_steps"]
            if entry["metrics"] or entry["problems"]:
                out.append(entry)
        return {"runs": out, "samples_per_plugin": self._samples}

    def heatmap_impl(self, ctx, experiment_id, *, run, metric, granularity="layer", aggregate="last",
                     width=None, reduce="max"):
        """The body of ``GET heatmap`` (see docs/http_api.md).

        Raises:
          errors.NotFoundError: Unknown run, or a metric or granularity the run lacks.
          errors.InvalidArgumentError: An aggregate the run does not have for the metric.
        """
        index = self._store.runs(ctx, experiment_id).get(run)
        if index is None:
            raise errors.NotFoundError(f"no gradient data for run {run!r}")
        allowed = _metric_aggregates(index).get(metric)
        if allowed is None:
            raise errors.NotFoundError(f"run {run!r} has no metric {metric!r}")
        if aggregate not in allowed:
            raise errors.InvalidArgumentError(
                f"aggregate must be one of {allowed} for metric {metric!r} of run {run!r}, got {aggregate!r}"
            )
        check = metric == metadata.CHECK_METRIC
        kind = metadata.KIND_CHECK if check else metadata.KIND_STATS
        if not index.layouts(kind, granularity):
            raise errors.NotFoundError(f"run {run!r} has no {granularity}-level {metric!r} data")
        matrix = self._store.matrix(ctx, experiment_id, index, kind, granularity)
        if check:
            values, missing = matrix.slab("relative_error")
            status, status_missing = matrix.slab("status")
        else:
            values, missing = matrix.slab(metric, aggregate)
        steps, step_ends, binned = matrix.steps, None, None
        if width is not None and len(steps) > width:
            first, step_ends, values, missing = binning.bin_steps(steps, values, missing, width, reduce)
            if check:
                # Status codes are ordered by severity: a bin shows its worst.
                _, _, status, status_missing = binning.bin_steps(steps, status, status_missing, width, "max")
            steps, binned = first, reduce
        return {
            "run": run,
            "metric": metric,
            "granularity": granularity,
            "aggregate": aggregate,
            "layers": matrix.rows,
            "steps": steps.tolist(),
            "step_ends": None if step_ends is None else step_ends.tolist(),
            "values": _json_matrix(values, missing),
            "status": _status_matrix(status, status_missing) if check else None,
            "num_steps": len(matrix.steps),
            "total_steps": None if check else self._store.total_writes(ctx, experiment_id, index),
            "reduce": binned,
        }


    def checks_impl(self, ctx, experiment_id, *, run, granularity="layer"):
        """The body of ``GET checks`` (see docs/http_api.md): the latest check and each row's record.

        Raises:
          errors.NotFoundError: Unknown run, or no check data at this granularity.
        """
        index = self._store.runs(ctx, experiment_id).get(run)
        if index is None:
            raise errors.NotFoundError(f"no gradient data for run {run!r}")
        if not index.layouts(metadata.KIND_CHECK, granularity):
            raise errors.NotFoundError(f"run {run!r} has no {granularity}-level gradient checks")
        matrix = self._store.matrix(ctx, experiment_id, index, metadata.KIND_CHECK, granularity)
        status, status_missing = matrix.slab("status")
        names = metadata.CHECK_STATUSES
        codes = np.where(status_missing, -1, np.nan_to_num(status, nan=-1)).astype(np.int64)
        latest = []
        if len(matrix.steps):
            for j, name in enumerate(matrix.rows):
                cell = {"name": name}
                for column in metadata.CHECK_COLUMNS:
                    values, missing = matrix.slab(column)
                    if column == "status":
                        cell[column] = None if codes[-1, j] < 0 else names[codes[-1, j]]
                    else:
                        cell[column] = None if missing[-1, j] else float(values[-1, j])
                latest.append(cell)
        mismatch = names.index("mismatch")
        history = []
        for j, name in enumerate(matrix.rows):
            column = codes[:, j]
            failed = np.nonzero(column == mismatch)[0]
            entry = {"name": name, "checks": int(np.sum(column >= 0))}
            entry.update({s: int(np.sum(column == i)) for i, s in enumerate(names)})
            entry["last_mismatch_step"] = int(matrix.steps[failed[-1]]) if len(failed) else None
            history.append(entry)
        # Worst first; a NaN relative error (non-finite analytic gradient) is the worst of all.
        failures = sorted((c for c in latest if c["status"] == "mismatch"), key=_worst_first)
        return {
            "run": run,
            "granularity": granularity,
            "step": int(matrix.steps[-1]) if len(matrix.steps) else None,
            "rows": latest,
            "failures": failures,
            "history": history,
            "num_steps": int(len(matrix.steps)),
            "problems": [p.to_dict() for p in matrix.problems],
        }


def _metric_aggregates(index):
    """``{metric: [aggregates]}`` a run can serve, metrics in display order."""
    out = {}
    if metadata.KIND_STATS in index.kinds():
        stored = index.aggregates()
        for m in metadata.STAT_COLUMNS:
            out[m] = [a for a in metadata.METRIC_AGGREGATES[m] if a in stored]
    if metadata.KIND_CHECK in index.kinds():
        out[metadata.CHECK_METRIC] = ["last"]
    return out


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


def _json_matrix(values, missing):
    """Nested lists with None for missing; Respond turns NaN/Inf into strings."""
    out = values.astype(np.float64).tolist()
    for i, j in zip(*np.nonzero(missing)):
        out[i][j] = None
    return out


def _context(request):
    return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)


def _required(args, name):
    value = args.get(name)
    if value is None or value == "":
        raise errors.InvalidArgumentError(f"missing required parameter {name!r}")
    return value


def _choice(args, name, choices, default):
    value = args.get(name, default)
    if value not in choices:
        raise errors.InvalidArgumentError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _int(args, name, low, high):
    raw = args.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgumentError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise errors.InvalidArgumentError(f"{name} must be between {low} and {high}, got {value}")
    return value
