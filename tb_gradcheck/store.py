"""Reads stored gradient summaries back through a TensorBoard data provider; numpy only.

Both the plugin and the command line read through this module, so the tab and
``tb-gradcheck report`` always see the same numbers. A run may hold several
layouts (tags) of one kind and granularity, when the model changed; they are
merged here by row name, never by position.
"""

import dataclasses
import threading

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
            for name in s.content["rows"]:
                names.setdefault(name, None)
        return list(names)

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
      columns: Column names (``metadata.STAT_COLUMNS`` or ``CHECK_COLUMNS``).
      aggregates: Slab names (stats) or ``[None]`` (check).
      steps: int64 ``[S]``, ascending.
      values: float64 ``[S, A, R, C]``.
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


class Store:
    """Reads and caches gradient data from a TensorBoard data provider.

    Decoded tensors are cached per (experiment, run, tag) and re-read only when
    the provider reports a new ``max_step`` or ``max_wall_time`` for the tag,
    so a heatmap request on a loaded run does no I/O.

    Args:
      data_provider: A ``tensorboard.data.provider.DataProvider``.
    """

    def __init__(self, data_provider):
        self._provider = data_provider
        self._lock = threading.Lock()
        self._cache = {}  # (eid, run, tag) -> (version, steps, values, problems)

    def runs(self, ctx, experiment_id):
        """Returns ``{run: RunIndex}`` for every run with gradient data."""
        listing = self._provider.list_tensors(ctx, experiment_id=experiment_id, plugin_name=metadata.PLUGIN_NAME)
        out = {}
        for run, tags in listing.items():
            series, problems = {}, []
            for tag, ts in tags.items():
                try:
                    content = metadata.parse(ts.plugin_content)
                except metadata.ContentError as e:
                    problems.append(Problem(tag, str(e)))
                    continue
                key = (content["kind"], content.get("granularity"))
                series.setdefault(key, []).append(Series(tag, content, ts.max_step, ts.max_wall_time))
            for layouts in series.values():
                layouts.sort(key=lambda s: (s.max_wall_time, s.tag))
            out[run] = RunIndex(run, series, problems)
        return out

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
        columns = list(metadata.STAT_COLUMNS if kind == metadata.KIND_STATS else metadata.CHECK_COLUMNS)
        aggregates = index.aggregates() if kind == metadata.KIND_STATS else [None]
        rows = index.rows(kind, granularity)
        parts = [(s, self._read(ctx, experiment_id, index.run, s)) for s in layouts]
        problems = [p for _, (_, _, probs) in parts for p in probs]
        steps = np.unique(np.concatenate([st for _, (st, _, _) in parts] or [np.zeros(0, np.int64)]))
        shape = (len(steps), len(aggregates), len(rows), len(columns))
        values = np.full(shape, np.nan)
        missing = np.ones(shape, bool)
        row_index = {name: i for i, name in enumerate(rows)}
        # Layouts are sorted by last write time: where two layouts share a
        # step and a row, the later writer wins.
        for s, (st, data, _) in parts:
            if not len(st):
                continue
            if kind == metadata.KIND_CHECK:
                data = data[:, None]  # one slab, so both kinds are [S, A, R, C]
            at = np.searchsorted(steps, st)
            r = [row_index[name] for name in s.content["rows"]]
            src_c = [i for i, name in enumerate(s.content["columns"]) if name in columns]
            c = [columns.index(s.content["columns"][i]) for i in src_c]
            for a, aggregate in enumerate(aggregates):
                src_a = _slab_for(s.content, aggregate)
                if src_a is None:
                    continue
                block = data[:, src_a][:, :, src_c]
                keep = ~_missing(kind, block, [s.content["columns"][i] for i in src_c])
                view_v, view_m = values[:, a], missing[:, a]
                ix = np.ix_(at, r, c)
                view_v[ix] = np.where(keep, block, view_v[ix])
                view_m[ix] = view_m[ix] & ~keep
        return Matrix(rows, columns, aggregates, steps, values, missing, problems)

    def total_writes(self, ctx, experiment_id, index):
        """The writer's progress counter at its last write (the M of "N of M"), or None."""
        total = None
        for s in index.layouts(metadata.KIND_PROGRESS, None):
            steps, data, _ = self._read(ctx, experiment_id, index.run, s)
            if len(steps):
                total = max(total or 0, int(data[-1]))
        return total

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


def _decode(series, data):
    """Stacks a tag's datums into ``(steps [S], values [S, ...], problems)``, skipping bad ones."""
    shape = metadata.shape_of(series.content)
    expected_dtype = np.int64 if series.content["kind"] == metadata.KIND_PROGRESS else np.float32
    good, bad = [], {}
    for d in data:
        arr = d.numpy
        if arr.shape != shape or arr.dtype != expected_dtype:
            bad_key = f"shape {arr.shape} {arr.dtype}"
            bad[bad_key] = bad.get(bad_key, 0) + 1
            continue
        good.append(d)
    problems = [
        Problem(series.tag, f"{n} of {len(data)} points have {what}; expected shape {shape} {np.dtype(expected_dtype)}")
        for what, n in bad.items()
    ]
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


def _slab_for(content, aggregate):
    """Index of the slab that answers ``aggregate`` in one layout, or None."""
    if content["kind"] == metadata.KIND_CHECK:
        return 0
    if aggregate in content["aggregates"]:
        return content["aggregates"].index(aggregate)
    # A one-step window's mean, max and min all equal its last value.
    if content["window"] == 1 and aggregate != "sum":
        return content["aggregates"].index("last")
    return None


def _missing(kind, block, columns):
    """Which stored cells mean "no value": -1 in stats, a NaN status in checks.

    ``columns`` names the block's columns, in the layout's own order (a
    layout written by another version may order or number them differently).
    """
    if kind == metadata.KIND_STATS:
        return block < 0
    if "status" not in columns:
        return np.ones(block.shape, bool)
    status = columns.index("status")
    return np.broadcast_to(np.isnan(block[..., status : status + 1]), block.shape)
