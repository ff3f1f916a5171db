"""Reads stored gradient summaries back through a TensorBoard data provider; numpy only.

Both the plugin and the command line read through this module, so the tab and
``tb-gradcheck report`` always see the same numbers. A run may hold several
layouts (tags) of one kind and granularity, when the model changed; they are
merged here by row name, never by position.
"""

import dataclasses
import functools
import threading
import time

import numpy as np

from tb_gradcheck import metadata

# read_tensors takes a sampling hint and returns at most that many points. The
# plugin keeps every point by default (see plugin.py), so ask for all of them;
# a hint of 0 would return nothing at all.
_READ_ALL = 1 << 30


@dataclasses.dataclass
class Problem:
    """A tag that could not be read, and why."""

    tag: str
    reason: str

    def to_dict(self):
        return {"tag": self.tag, "reason": self.reason}


@dataclasses.dataclass
class Series:
    """One tag's layout and metadata as listed by the data provider."""

    tag: str
    content: dict
    max_step: int
    max_wall_time: float


@dataclasses.dataclass
class RunIndex:
    """What one run holds: its series by (kind, granularity), and unreadable tags."""

    run: str
    series: dict  # (kind, granularity) -> [Series]
    problems: list

    def kinds(self):
        return {kind for kind, _ in self.series}

    def layouts(self, kind, granularity):
        return self.series.get((kind, granularity), [])

    def rows(self, kind, granularity):
        """Row names of every layout, merged by name in order of first appearance."""
        names = {}
        for s in self.layouts(kind, granularity):
            for name in metadata.rows_of(s.content, granularity)[0]:
                names.setdefault(name, None)
        return list(names)

    def sparse_rows(self, granularity):
        """Rows any layout marks as having sparse (IndexedSlices) gradients."""
        return sorted({n for s in self.layouts(metadata.KIND_STATS, granularity)
                       for n in s.content[granularity].get("sparse_rows", [])})

    def last_write(self):
        """Wall time of the run's newest point, or None: changes whenever new data arrives."""
        times = [s.max_wall_time for layouts in self.series.values() for s in layouts]
        return max(times) if times else None

    def window(self):
        return max((s.content.get("window", 1) for s in self.layouts(metadata.KIND_STATS, "layer")), default=1)

    def aggregates(self):
        """Aggregates any stats layout of the run can answer, in canonical order."""
        found = set()
        for s in self.layouts(metadata.KIND_STATS, "layer"):
            found.update(s.content["aggregates"])
        return [a for a in metadata.AGGREGATES if a in found]


@dataclasses.dataclass
class Matrix:
    """A run's merged data for one kind and granularity.

    Attributes:
      rows: Row names, merged in order of first appearance.
      columns: Column names (``metadata.STAT_COLUMNS``, grad_to_weight derived,
        or ``CHECK_COLUMNS``).
      aggregates: Slab names (stats) or ``[None]`` (check).
      steps: int64 ``[S]``, ascending.
      values: float32 ``[S, A, R, C]``.
      missing: bool ``[S, A, R, C]``: no value (no gradient, row absent from
        that step's layout, or an aggregate the layout did not store).
      problems: ``Problem`` for every point or tag that was skipped.
    """

    rows: list
    columns: list
    aggregates: list
    steps: np.ndarray
    values: np.ndarray
    missing: np.ndarray
    problems: list

    def slab(self, column, aggregate=None):
        """``(values [S, R], missing [S, R])`` of one column and aggregate."""
        a = 0 if aggregate is None else self.aggregates.index(aggregate)
        c = self.columns.index(column)
        return self.values[:, a, :, c], self.missing[:, a, :, c]


class NotFound(LookupError):
    """A run, metric or granularity that the data does not have (HTTP 404, exit code 2)."""


class BadRequest(ValueError):
    """A parameter outside what the data can answer (HTTP 400, exit code 2)."""


@dataclasses.dataclass
class Heatmap:
    """One metric of one run as a steps x rows matrix (see docs/http_api.md ``GET heatmap``).

    Attributes:
      rows: Row names in depth order.
      steps: int64 ``[S]``.
      values: float ``[S, R]``.
      missing: bool ``[S, R]``.
      status: float ``[S, R]`` check status codes (index into
        ``metadata.CHECK_STATUSES``) for ``check_error``, else None.
      status_missing: bool ``[S, R]`` or None.
      total_steps: Writes the writer made (progress counter), or None.
    """

    run: str
    metric: str
    granularity: str
    aggregate: str
    rows: list
    steps: np.ndarray
    values: np.ndarray
    missing: np.ndarray
    status: object = None
    status_missing: object = None
    total_steps: object = None


def metric_aggregates(index):
    """``{metric: [aggregates]}`` a run can serve, metrics in display order."""
    out = {}
    if metadata.KIND_STATS in index.kinds():
        stored = index.aggregates()
        # Optimizer columns are optional in a layout: offered where one stores them.
        present = {c for s in index.layouts(metadata.KIND_STATS, "layer") for c in s.content["columns"]}
        for m in metadata.METRICS:  # served metrics only; onset columns are stored, not offered
            if m in metadata.OPTIMIZER_STAT_COLUMNS and m not in present:
                continue
            out[m] = [a for a in metadata.METRIC_AGGREGATES[m] if a in stored]
    if metadata.KIND_CHECK in index.kinds():
        out[metadata.CHECK_METRIC] = ["last"]
    return out


class Store:
    """Reads and caches gradient data from a TensorBoard data provider.

    Decoded tensors are cached per (experiment, run, tag) and re-read only when
    the provider reports a new ``max_step`` or ``max_wall_time`` for the tag,
    so a heatmap request on a loaded run does no I/O.

    The run listing itself is reused for ``listing_ttl`` seconds: the Rust
    data server answers ``list_tensors`` for a large run in tens of
    milliseconds, which would otherwise be most of every heatmap request,
    and TensorBoard reloads the logdir only every few seconds anyway.

    Args:
      data_provider: A ``tensorboard.data.provider.DataProvider``.
      listing_ttl: Seconds a run listing is reused, default 2.0; 0 disables.
    """

    def __init__(self, data_provider, listing_ttl=2.0):
        self._provider = data_provider
        self._listing_ttl = listing_ttl
        self._listings = {}  # experiment id -> (monotonic time, listing)
        self._lock = threading.Lock()
        self._cache = {}  # (eid, run, tag) -> (version, steps, values, problems)
        self._merged = {}  # (eid, run, kind, granularity) -> (versions, Matrix)

    def runs(self, ctx, experiment_id):
        """Returns ``{run: RunIndex}`` for every run with gradient data."""
        listing = self._listing(ctx, experiment_id)
        out = {}
        for run, tags in listing.items():
            series, problems = {}, []
            for tag, ts in tags.items():
                content, error = _parse(bytes(ts.plugin_content))
                if error is not None:
                    problems.append(Problem(tag, error))
                    continue
                entry = Series(tag, content, ts.max_step, ts.max_wall_time)
                # A stats tag holds both granularities; a check tag one.
                granularities = metadata.GRANULARITIES if content["kind"] == metadata.KIND_STATS else [content["granularity"]]
                for granularity in granularities:
                    series.setdefault((content["kind"], granularity), []).append(entry)
            for layouts in series.values():
                layouts.sort(key=lambda s: (s.max_wall_time, s.tag))
            out[run] = RunIndex(run, series, problems)
        return out

    def _listing(self, ctx, experiment_id):
        now = time.monotonic()
        with self._lock:
            hit = self._listings.get(experiment_id)
        if hit is not None and now - hit[0] < self._listing_ttl:
            return hit[1]
        listing = self._provider.list_tensors(ctx, experiment_id=experiment_id, plugin_name=metadata.PLUGIN_NAME)
        with self._lock:
            self._listings[experiment_id] = (now, listing)
        return listing

    def matrix(self, ctx, experiment_id, index, kind, granularity):
        """Reads and merges every layout of ``kind``/``granularity`` in a run.

        Args:
          ctx: The request context.
          experiment_id: Experiment of the request.
          index: The run's ``RunIndex`` (from ``runs``).
          kind: ``metadata.KIND_STATS`` or ``metadata.KIND_CHECK``.
          granularity: ``"layer"`` or ``"variable"``.

        Returns:
          A ``Matrix``; its ``steps`` may be empty.
        """
        layouts = index.layouts(kind, granularity)
        key = (experiment_id, index.run, kind, granularity)
        version = tuple((s.tag, s.max_step, s.max_wall_time) for s in layouts)
        with self._lock:
            hit = self._merged.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        matrix = self._merge(ctx, experiment_id, index, kind, granularity, layouts)
        with self._lock:
            self._merged[key] = (version, matrix)
        return matrix

    def _merge(self, ctx, experiment_id, index, kind, granularity, layouts):
        stats = kind == metadata.KIND_STATS
        columns = list(metadata.STAT_COLUMNS if stats else metadata.CHECK_COLUMNS)
        stored = [c for c in columns if c in metadata.STORED_STAT_COLUMNS + metadata.OPTIMIZER_STAT_COLUMNS] if stats else columns
        aggregates = index.aggregates() if stats else [None]
        rows = index.rows(kind, granularity)
        parts = [(s, self._read(ctx, experiment_id, index.run, s)) for s in layouts]
        problems = [p for _, (_, _, probs) in parts for p in probs]
        steps = np.unique(np.concatenate([st for _, (st, _, _) in parts] or [np.zeros(0, np.int64)]))
        shape = (len(steps), len(aggregates), len(rows), len(columns))
        values = np.full(shape, np.nan, np.float32)
        missing = np.ones(shape, bool)
        row_index = {name: i for i, name in enumerate(rows)}
        # Layouts are sorted by last write time: where two layouts share a
        # step and a row, the later writer wins.
        for s, (st, data, _) in parts:
            if not len(st):
                continue
            if not stats:
                data = data[:, None]  # one slab, so both kinds are [S, A, R, C]
            names, row_slice = metadata.rows_of(s.content, granularity)
            data = data[:, :, row_slice]
            at = np.searchsorted(steps, st)
            r = [row_index[name] for name in names]
            src_c = [i for i, name in enumerate(s.content["columns"]) if name in stored]
            c = [columns.index(s.content["columns"][i]) for i in src_c]
            for a, aggregate in enumerate(aggregates):
                src_a = _slab_for(s.content, aggregate)
                if src_a is None:
                    continue
                block = data[:, src_a][:, :, src_c]
                keep = ~_missing(kind, block, [columns[j] for j in c])
                view_v, view_m = values[:, a], missing[:, a]
                ix = np.ix_(at, r, c)
                view_v[ix] = np.where(keep, block, view_v[ix])
                view_m[ix] = view_m[ix] & ~keep
        if stats:
            _derive_grad_to_weight(values, missing, columns)
        return Matrix(rows, columns, aggregates, steps, values, missing, problems)

    def run(self, ctx, experiment_id, run):
        """The ``RunIndex`` of one run; raises NotFound if it has no gradient data."""
        index = self.runs(ctx, experiment_id).get(run)
        if index is None:
            raise NotFound(f"no gradient data for run {run!r}")
        return index

    def heatmap(self, ctx, experiment_id, run, metric, granularity="layer", aggregate="last"):
        """One metric of one run, merged over its layouts.

        Raises:
          NotFound: Unknown run, or a metric or granularity the run lacks.
          BadRequest: An aggregate the run does not have for the metric.
        """
        index = self.run(ctx, experiment_id, run)
        allowed = metric_aggregates(index).get(metric)
        if allowed is None:
            raise NotFound(f"run {run!r} has no metric {metric!r}")
        if aggregate not in allowed:
            raise BadRequest(f"aggregate must be one of {allowed} for metric {metric!r} of run {run!r}, got {aggregate!r}")
        check = metric == metadata.CHECK_METRIC
        kind = metadata.KIND_CHECK if check else metadata.KIND_STATS
        if not index.layouts(kind, granularity):
            raise NotFound(f"run {run!r} has no {granularity}-level {metric!r} data")
        matrix = self.matrix(ctx, experiment_id, index, kind, granularity)
        out = Heatmap(run, metric, granularity, aggregate, matrix.rows, matrix.steps, None, None)
        if check:
            out.values, out.missing = matrix.slab("relative_error")
            out.status, out.status_missing = matrix.slab("status")
        else:
            out.values, out.missing = matrix.slab(metric, aggregate)
            out.total_steps = self.total_writes(ctx, experiment_id, index)
        return out

    def compare(self, ctx, experiment_id, run, other, metric, granularity="layer", aggregate="last"):
        """``run`` over ``other``: the ratio of one metric, rows aligned by name, at the steps both have.

        Returns:
          ``(heatmap, only_in_run, only_in_other)``: a ``Heatmap`` of ratios
          (rows of both runs, ``run``'s order first; missing where either
          run has no value), and the row names each run alone has.
        """
        if metric == metadata.CHECK_METRIC:
            raise BadRequest(f"compare takes a statistic, not {metric!r}")
        a = self.heatmap(ctx, experiment_id, run, metric, granularity, aggregate)
        b = self.heatmap(ctx, experiment_id, other, metric, granularity, aggregate)
        rows = a.rows + [r for r in b.rows if r not in set(a.rows)]
        steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
        values = np.full((len(steps), len(rows)), np.nan)
        missing = np.ones((len(steps), len(rows)), bool)
        ja = {r: j for j, r in enumerate(a.rows)}
        jb = {r: j for j, r in enumerate(b.rows)}
        for k, row in enumerate(rows):
            if row in ja and row in jb:
                va = a.values[ia, ja[row]].astype(np.float64)
                vb = b.values[ib, jb[row]].astype(np.float64)
                with np.errstate(divide="ignore", invalid="ignore"):
                    values[:, k] = va / vb
                missing[:, k] = a.missing[ia, ja[row]] | b.missing[ib, jb[row]]
        heat = Heatmap(run, metric, granularity, aggregate, rows, steps, values, missing)
        return heat, [r for r in a.rows if r not in jb], [r for r in b.rows if r not in ja]

    def findings(self, ctx, experiment_id, run, thresholds=None):
        """``diagnose.find`` over one run's layer-level stats and checks."""
        from tb_gradcheck import diagnose

        index = self.run(ctx, experiment_id, run)
        layer = "layer"
        stats = checks = None
        if index.layouts(metadata.KIND_STATS, layer):
            stats = self.matrix(ctx, experiment_id, index, metadata.KIND_STATS, layer)
        if index.layouts(metadata.KIND_CHECK, layer):
            checks = self.matrix(ctx, experiment_id, index, metadata.KIND_CHECK, layer)
        return diagnose.find(run, stats, checks, thresholds, sparse_rows=index.sparse_rows(layer))

    def total_writes(self, ctx, experiment_id, index):
        """The writer's write counter at its last write (the M of "N of M"), or None."""
        return self.progress(ctx, experiment_id, index)[0]

    def progress(self, ctx, experiment_id, index):
        """``(total, problems)``: the write counter at the last write (or None), and why it is unknown.

        The counter lives in the header row of every stats tensor and counts
        the writes of one writer; with several layouts (a restart) the
        largest is taken, which undercounts only runs that are both
        restarted and sampled. A counter that is not a count (NaN, below 1,
        fractional) is reported, never read as a number of steps: it would
        make "N of M steps" lie.
        """
        total, problems = None, []
        for s in index.layouts(metadata.KIND_STATS, "layer"):
            steps, data, _ = self._read(ctx, experiment_id, index.run, s)
            if not len(steps):
                continue
            count = float(data[-1, 0, metadata.header_row(s.content), 0])
            if np.isfinite(count) and count >= 1 and count == int(count):
                total = max(total or 0, int(count))
            else:
                problems.append(Problem(
                    s.tag, f"the write counter at step {int(steps[-1])} is {count!r}, not a count of at least 1; "
                    "the number of steps written is unknown"))
        return total, problems

    def _read(self, ctx, experiment_id, run, series):
        """Decoded ``(steps, values, problems)`` of one tag, from cache when unchanged."""
        key = (experiment_id, run, series.tag)
        version = (series.max_step, series.max_wall_time)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1:]
        result = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            run_tag_filter=_filter(run, series.tag),
            downsample=_READ_ALL,
        )
        data = result.get(run, {}).get(series.tag, [])
        decoded = _decode(series, data)
        with self._lock:
            self._cache[key] = (version,) + decoded
        return decoded


def _filter(run, tag):
    from tensorboard.data import provider  # light: pure Python, no TensorFlow

    return provider.RunTagFilter(runs=[run], tags=[tag])


@functools.lru_cache(maxsize=4096)
def _parse(content_bytes):
    """``(content, None)`` or ``(None, reason)``: parsed once per distinct content.

    Every request lists every tag, and a tag's content never changes
    (TensorBoard keeps its first metadata), so parsing, and refusing a
    hostile content such as 100,000 nested brackets, happens once. Callers
    must not modify the returned dict.
    """
    try:
        return metadata.parse(content_bytes), None
    except metadata.ContentError as e:
        return None, str(e)


def _decode(series, data):
    """Stacks a tag's datums into ``(steps [S], values [S, ...], problems)``, skipping bad ones."""
    shape = metadata.shape_of(series.content)
    expected_dtype = np.float32
    expected = f"shape {shape} {np.dtype(expected_dtype)}"
    kind = series.content["kind"]
    if kind == metadata.KIND_CHECK:
        status = series.content["columns"].index("status")
        codes = np.arange(len(metadata.CHECK_STATUSES))
    good, bad = [], {}  # bad: (what, expected) -> count
    for d in data:
        arr = d.numpy
        if arr.shape != shape or arr.dtype != expected_dtype:
            key = (f"shape {arr.shape} {_dtype_name(arr)}", expected)
        elif kind == metadata.KIND_CHECK and not np.all(np.isnan(arr[:, status]) | np.isin(arr[:, status], codes)):
            key = ("an unknown check status code", f"NaN or one of {codes.tolist()} ({', '.join(metadata.CHECK_STATUSES)})")
        else:
            good.append(d)
            continue
        bad[key] = bad.get(key, 0) + 1
    problems = [Problem(series.tag, f"{n} of {len(data)} points have {what}; expected {want}")
                for (what, want), n in bad.items()]
    # The provider returns points in step order; keep the last point of a
    # step that appears twice (a rewritten step after a restart).
    by_step = {}
    for d in good:
        by_step[d.step] = d
    steps = np.array(sorted(by_step), dtype=np.int64)
    if not len(steps):
        return steps, np.zeros((0,) + shape, expected_dtype), problems
    values = np.stack([by_step[s].numpy for s in steps])
    return steps, values, problems


def _derive_grad_to_weight(values, missing, columns):
    """Fills grad_to_weight = grad_norm / weight_norm in place.

    Missing where the gradient is missing or the weights are all zero (a
    fresh bias: the ratio is undefined, not Inf); NaN stays NaN.
    """
    norm, weight, ratio = (columns.index(c) for c in ("grad_norm", "weight_norm", "grad_to_weight"))
    defined = ~missing[..., norm] & ~missing[..., weight] & (values[..., weight] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        values[..., ratio] = np.where(defined, values[..., norm] / values[..., weight], np.nan)
    missing[..., ratio] = ~defined


def _dtype_name(arr):
    # TensorBoard hands string tensors over as object arrays of bytes.
    return "string" if arr.dtype == object else str(arr.dtype)


def _slab_for(content, aggregate):
    """Index of the slab that answers ``aggregate`` in one layout, or None."""
    if content["kind"] == metadata.KIND_CHECK:
        return 0
    if aggregate in content["aggregates"]:
        return content["aggregates"].index(aggregate)
    # A one-step window's mean, max and min all equal its last value.
    if content["window"] == 1 and aggregate != "sum" and "last" in content["aggregates"]:
        return content["aggregates"].index("last")
    return None


def _missing(kind, block, names):
    """Which stored cells mean "no value": -1 in stats, a NaN status in checks.

    ``names`` are the column names of ``block``'s last axis, in its order (a
    layout may store its columns in any order).
    """
    if kind == metadata.KIND_STATS:
        return block < 0
    status = names.index("status")  # metadata.parse guarantees a check layout has one
    return np.broadcast_to(np.isnan(block[..., status : status + 1]), block.shape)


def local_store(logdir):
    """A ``Store`` over a log directory, read the way TensorBoard's Python path reads it.

    Every point is kept (samples_per_plugin gradients=0), as the plugin keeps
    them. Returns ``(store, ctx, experiment_id)``.
    """
    from tensorboard import context
    from tensorboard.backend.event_processing import data_ingester
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer

    guidance = dict(data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE)
    guidance[metadata.PLUGIN_NAME] = 0
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE, tensor_size_guidance=guidance
    )
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    return Store(provider), context.RequestContext(), ""
