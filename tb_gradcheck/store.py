"""Reads gradient tags through a TensorBoard data provider, with one bounded cache; numpy only.

This is the only module that talks to the data provider. It lists runs and
tags, parses each tag's layout, decodes its points (``points.py``: skipping
malformed ones, with the reason as a ``Problem``) and keeps what it decoded in one cache
bounded by bytes (``cache.Cache``), so the plugin's memory follows what the
tab is looking at, not the size of the logdir. Merging layouts is
``merge.py``'s job, answering requests ``queries.py``'s.
"""

import dataclasses
import time

import numpy as np

from tb_gradcheck import cache
from tb_gradcheck import merge
from tb_gradcheck import metadata
from tb_gradcheck import points
from tb_gradcheck.points import Problem

# Enough for the runs a tab shows at once (one run, or two compared) at
# 200 layers x 10,000 steps (about 80 MB of float32 each), with room for the
# small per-tag summaries of every run in a large logdir.
DEFAULT_CACHE_BYTES = 256 << 20


class NotFound(LookupError):
    """A run, metric or granularity that the data does not have (HTTP 404, exit code 2)."""


class BadRequest(ValueError):
    """A parameter outside what the data can answer (HTTP 400, exit code 2)."""


@dataclasses.dataclass
class Series:
    """One tag's layout and metadata as listed by the data provider."""

    tag: str
    content: dict
    max_step: int
    max_wall_time: float


@dataclasses.dataclass
class Summary:
    """What a listing needs of one tag, without its values.

    Attributes:
      steps: int64 ``[S]``, the readable points' steps.
      problems: ``Problem`` for every skipped point.
      count: Float, the write counter in the header row of the last point
        (stats tags), or None.
    """

    steps: np.ndarray
    problems: list
    count: object = None

    @property
    def capped(self):
        """Whether the read was cut to ``points.READ_BUDGET_BYTES`` and the tag holds more points than were read."""
        return any(isinstance(p, points.Capped) for p in self.problems)


@dataclasses.dataclass
class RunIndex:
    """What one run holds: its series by (kind, granularity), and unreadable tags."""

    run: str
    series: dict  # (kind, granularity) -> [Series], earliest written first
    problems: list

    def kinds(self):
        return {kind for kind, _ in self.series}

    def layouts(self, kind, granularity):
        return self.series.get((kind, granularity), [])

    def rows(self, kind, granularity):
        """Row names of every layout, merged by name in order of first appearance."""
        return merge.rows([s.content for s in self.layouts(kind, granularity)], granularity)

    def sparse_rows(self, granularity):
        """Rows any layout marks as having sparse (IndexedSlices) gradients."""
        return sorted(
            {
                n
                for s in self.layouts(metadata.KIND_STATS, granularity)
                for n in s.content[granularity].get("sparse_rows", [])
            }
        )

    def last_write(self):
        """Wall time of the run's newest point, or None: changes whenever new data arrives."""
        times = [s.max_wall_time for layouts in self.series.values() for s in layouts]
        return max(times) if times else None

    def version(self):
        """What changes whenever any tag of the run gets new points: part of a cache key."""
        return tuple(sorted((s.tag, *_version(s)) for layouts in self.series.values() for s in layouts))

    def read_bytes(self):
        """About what reading every tag of the run again costs: a miss's cost for ``cache.Cache``."""
        tags = {s.tag: s for layouts in self.series.values() for s in layouts}
        return sum(points.point_bytes(s.content) * (s.max_step + 1) for s in tags.values())

    def window(self):
        return max((s.content.get("window", 1) for s in self.layouts(metadata.KIND_STATS, "layer")), default=1)

    def aggregates(self):
        """Aggregates any stats layout of the run can answer, in canonical order."""
        return merge.aggregates([s.content for s in self.layouts(metadata.KIND_STATS, "layer")])


class Store:
    """Reads gradient data from a TensorBoard data provider through one bounded cache.

    Everything kept between requests lives in ``self.cache``: decoded tags
    (re-read only when the provider reports a new ``max_step`` or
    ``max_wall_time`` for the tag), each tag's small ``Summary``, parsed
    layouts, and run listings. A listing is reused for ``listing_ttl``
    seconds: the Rust data server answers ``list_tensors`` for a large run
    in tens of milliseconds, which would otherwise be most of every heatmap
    request, and TensorBoard reloads the logdir only every few seconds anyway.

    Args:
      data_provider: A ``tensorboard.data.provider.DataProvider``.
      cache_bytes: Int, the cache's budget, default ``DEFAULT_CACHE_BYTES``.
      listing_ttl: Seconds a run listing is reused, default 2.0; 0 disables.
    """

    def __init__(self, data_provider, cache_bytes=DEFAULT_CACHE_BYTES, listing_ttl=2.0):
        self._provider = data_provider
        self._listing_ttl = listing_ttl
        self.cache = cache.Cache(cache_bytes)

    def runs(self, ctx, experiment_id):
        """Returns ``{run: RunIndex}`` for every run with gradient data."""
        return {run: self._index(run, tags) for run, tags in self._listing(ctx, experiment_id).items()}

    def run(self, ctx, experiment_id, run):
        """The ``RunIndex`` of one run, listing that run only; raises NotFound if it has no gradient data."""
        tags = self._listing(ctx, experiment_id, run).get(run)
        if not tags:
            raise NotFound(f"no gradient data for run {run!r}")
        return self._index(run, tags)

    def parts(self, ctx, experiment_id, index, kind, granularity):
        """``([merge.Part], [Problem])``: every layout of ``kind``/``granularity`` in a run, decoded."""
        parts, problems = [], []
        for s in index.layouts(kind, granularity):
            steps, values, probs = self._read(ctx, experiment_id, index.run, s)
            parts.append(merge.Part(s.content, steps, values))
            problems += probs
        return parts, problems

    def summary(self, ctx, experiment_id, run, series):
        """The ``Summary`` of one tag: decoded once per version, then kept even when its values are dropped."""
        key = ("summary", experiment_id, run, series.tag)
        hit = self.cache.get(key)
        if hit is not None and hit[0] == _version(series):
            return hit[1]
        return _summarize(series, self._read(ctx, experiment_id, run, series))

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
            summary = self.summary(ctx, experiment_id, index.run, s)
            if summary.count is None:
                continue
            count = summary.count
            if np.isfinite(count) and count >= 1 and count == int(count):
                total = max(total or 0, int(count))
            else:
                problems.append(
                    Problem(
                        s.tag,
                        f"the write counter at step {int(summary.steps[-1])} is {count!r}, not a count of at "
                        "least 1; the number of steps written is unknown",
                    )
                )
        return total, problems

    def _listing(self, ctx, experiment_id, run=None):
        """``{run: {tag: TensorTimeSeries}}`` of every run, or of ``run`` only."""
        now = time.monotonic()
        for key in (("listing", experiment_id, None), ("listing", experiment_id, run)):
            hit = self.cache.get(key)
            if hit is not None and now - hit[0] < self._listing_ttl:
                return hit[1] if run is None or key[2] == run else {run: hit[1].get(run, {})}
        listing = self._provider.list_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            run_tag_filter=None if run is None else _filter(run, None),
        )
        size = sum(len(ts.plugin_content) + 256 for tags in listing.values() for ts in tags.values())
        return self.cache.put(("listing", experiment_id, run), (now, listing), size)[1]

    def _index(self, run, tags):
        series, problems = {}, []
        for tag, ts in tags.items():
            content, error = self._parse(bytes(ts.plugin_content))
            if error is not None:
                problems.append(Problem(tag, error))
                continue
            entry = Series(tag, content, ts.max_step, ts.max_wall_time)
            # A stats tag holds both granularities; a check tag one.
            stats = content["kind"] == metadata.KIND_STATS
            for granularity in metadata.GRANULARITIES if stats else [content["granularity"]]:
                series.setdefault((content["kind"], granularity), []).append(entry)
        for layouts in series.values():
            layouts.sort(key=lambda s: (s.max_wall_time, s.tag))
        return RunIndex(run, series, problems)

    def _parse(self, content_bytes):
        """``(content, None)`` or ``(None, reason)``, parsed once per distinct content.

        Every request lists tags, and a tag's content never changes
        (TensorBoard keeps its first metadata), so parsing, and refusing a
        hostile content such as 100,000 nested brackets, happens once while
        the content stays in the cache. Callers must not modify the dict.
        """
        key = ("content", content_bytes)
        hit = self.cache.get(key)
        if hit is None:
            try:
                hit = metadata.parse(content_bytes), None
            except metadata.ContentError as e:
                hit = None, str(e)
            # A parsed layout takes a few times its JSON text in Python objects.
            self.cache.put(key, hit, 4 * len(content_bytes) + 256)
        return hit

    def _read(self, ctx, experiment_id, run, series):
        """Decoded ``(steps, values, problems)`` of one tag, from the cache when unchanged."""
        key = ("tag", experiment_id, run, series.tag)
        version = _version(series)
        hit = self.cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        limit = points.read_limit(series.content)
        result = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            run_tag_filter=_filter(run, series.tag),
            downsample=limit,
        )
        decoded = points.decode(series, result.get(run, {}).get(series.tag, []), limit)
        steps, values, _ = decoded
        # The summary is put apart from the values: a listing of many runs
        # needs only summaries, which stay cached when the values are dropped
        # (a miss costs the whole tag, so the cache keeps them far longer).
        size = steps.nbytes + values.nbytes + 512
        self.cache.put(key, (version, decoded), size)
        self.cache.put(
            ("summary", experiment_id, run, series.tag),
            (version, _summarize(series, decoded)),
            steps.nbytes + 512,
            cost=size,
        )
        return decoded


def _summarize(series, decoded):
    steps, values, problems = decoded
    count = points.write_count(series, values) if len(steps) else None
    return Summary(steps, problems, count)


def _version(series):
    return series.max_step, series.max_wall_time


def _filter(run, tag):
    from tensorboard.data import provider  # light: pure Python, no TensorFlow

    return provider.RunTagFilter(runs=[run], tags=None if tag is None else [tag])


def local_store(logdir, cache_bytes=DEFAULT_CACHE_BYTES):
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
    return Store(provider, cache_bytes), context.RequestContext(), ""
