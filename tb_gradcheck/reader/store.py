"""Reads gradient tags through a TensorBoard data provider, with one bounded cache; numpy only.

This is the only module that talks to the data provider. It lists runs and
tags, parses each tag's layout, decodes its points (``points.py``: skipping
malformed ones, with the reason as a ``Problem``) and keeps what it decoded in one cache
bounded by bytes (``cache.Cache``), so the plugin's memory follows what the
tab is looking at, not the size of the logdir. Merging layouts is
``merge.py``'s job, answering requests ``queries.py``'s.

The provider has no read of "the steps after s": each read of a tag returns
all of its points. What the store controls is the rest: a tag is read once
per change (one request at a time), only its new points are decoded, and
they are appended to what is kept of it (``tag_blocks.py``); docs/benchmarks.md
measures both parts.
"""

import threading
import time

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.reader import cache
from tb_gradcheck.reader import growing_arrays
from tb_gradcheck.reader import merge
from tb_gradcheck.reader import points
from tb_gradcheck.reader import runs
from tb_gradcheck.reader import spans
from tb_gradcheck.reader import tag_blocks
from tb_gradcheck.reader.points import Problem

# Enough for the runs a tab shows at once (one run, or two compared) at
# 200 layers x 10,000 steps (about 80 MB of float32 each), with room for the
# small per-tag summaries of every run in a large logdir.
DEFAULT_CACHE_BYTES = 256 << 20


class NotFound(LookupError):
    """A run, metric or granularity that the data does not have (HTTP 404, exit code 2)."""


class BadRequest(ValueError):
    """A parameter outside what the data can answer (HTTP 400, exit code 2)."""


Summary = points.Summary


class Store:
    """Reads gradient data from a TensorBoard data provider through one bounded cache.

    Everything kept between requests lives in ``self.cache``: each tag's
    small ``Summary`` and its products (``tag_blocks.py``: its values, or one
    column's block), read again only when the provider reports a new
    ``max_step`` or ``max_wall_time`` for the tag, parsed layouts, and run
    listings. A listing is reused for ``listing_ttl``
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
        self._locks = {}  # key -> its lock (see lock)
        self._locks_lock = threading.Lock()

    def runs(self, ctx, experiment_id):
        """Returns ``{run: runs.RunIndex}`` for every run with gradient data."""
        return {run: self._index(run, tags) for run, tags in self._listing(ctx, experiment_id).items()}

    def run(self, ctx, experiment_id, run):
        """The ``runs.RunIndex`` of one run, listing that run only; raises NotFound if it has no gradient data."""
        tags = self._listing(ctx, experiment_id, run).get(run)
        if not tags:
            raise NotFound(f"no gradient data for run {run!r}")
        return self._index(run, tags)

    def parts(self, ctx, experiment_id, index, kind, granularity):
        """``([merge.Part], [Problem])``: every layout of ``kind``/``granularity`` in a run, decoded."""
        parts, problems = [], []
        # A run whose values would take most of the cache (2,000 rows x 10,000
        # steps: 960 MB) is read for the caller and not kept: kept, its tags
        # would only push out what the tab shows (its heatmap's blocks).
        keep = index.read_bytes() <= self.cache.max_bytes // 2
        layouts = index.layouts(kind, granularity)
        summaries = []
        for s in layouts:
            summary, [((values,), _)] = self._tag(ctx, experiment_id, index.run, s, [tag_blocks.VALUES], keep)
            summaries.append(summary)
            parts.append(merge.Part(s.content, summary.steps, values))
            problems += summary.problems
        for i, stands in enumerate(spans.standing(layouts, summaries)):
            if stands is not None:
                parts[i] = merge.Part(parts[i].content, parts[i].steps[stands], parts[i].values[stands])
        return parts, problems

    def blocks(self, ctx, experiment_id, index, kind, granularity, column, aggregate):
        """``[merge.Block]``: one stored column of one aggregate in every layout of ``kind``/``granularity``.

        What a heatmap reads. Each layout's block is kept apart from its
        tag's values: it is a share of them (one column of one granularity,
        a twelfth of a tag written every step), so it stays cached where the
        tag would not, and a read of a grown tag appends its new points.
        """
        out, summaries = [], []
        layouts = index.layouts(kind, granularity)
        for s in layouts:
            product = tag_blocks.block_product(s.content, granularity, column, aggregate)
            if product is None:  # this layout does not store that column or aggregate
                summary, _ = self._tag(ctx, experiment_id, index.run, s)
                out.append(merge.Block(summary.steps, metadata.rows_of(s.content, granularity)[0]))
            else:
                summary, [((data, keep), source)] = self._tag(ctx, experiment_id, index.run, s, [product])
                out.append(merge.Block(summary.steps, metadata.rows_of(s.content, granularity)[0], data, keep, source))
            summaries.append(summary)
        for i, stands in enumerate(spans.standing(layouts, summaries)):
            if stands is not None:
                # Copies of what stands, from the same kept arrays (the same
                # source): merge.grow extends a laid-out column only while
                # the steps it laid out stay the first ones, so a rewind lays
                # the column out again, and growth after it is appended.
                b = out[i]
                cut = (None if a is None else a[stands] for a in (b.data, b.keep))
                out[i] = merge.Block(b.steps[stands], b.names, *cut, b.source)
        return out

    def summary(self, ctx, experiment_id, run, series):
        """The ``Summary`` of one tag: read once per version, then kept even when its values are dropped."""
        return self._tag(ctx, experiment_id, run, series)[0]

    def progress(self, ctx, experiment_id, index):
        """``(total, problems)``: the write counter at the last write (or None), and why it is unknown.

        The counter lives in the header row of every stats tensor and counts
        the writes of one writer. A layout's counter is the one at its last
        step that stands (``spans.last_counts``); with several layouts the
        largest is taken, which undercounts only runs that are both
        restarted and sampled. A counter that is not a count (NaN, below 1,
        fractional) is reported, never read as a number of steps: it would
        make "N of M steps" lie.
        """
        total, problems = None, []
        layouts = index.layouts(metadata.KIND_STATS, "layer")
        summaries = [self.summary(ctx, experiment_id, index.run, s) for s in layouts]
        for s, last in zip(layouts, spans.last_counts(layouts, summaries)):
            if last is None:
                continue
            step, count = last
            if np.isfinite(count) and count >= 1 and count == int(count):
                total = max(total or 0, int(count))
            else:
                problems.append(
                    Problem(
                        s.tag,
                        f"the write counter at step {step} is {count!r}, not a count of at "
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
            entry = runs.Series(tag, content, ts.max_step, ts.max_wall_time)
            # A stats tag holds both granularities; a check tag one.
            stats = content["kind"] == metadata.KIND_STATS
            for granularity in metadata.GRANULARITIES if stats else [content["granularity"]]:
                series.setdefault((content["kind"], granularity), []).append(entry)
        for layouts in series.values():
            layouts.sort(key=lambda s: (s.max_wall_time, s.tag))
        return runs.RunIndex(run, series, problems)

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

    def _tag(self, ctx, experiment_id, run, series, wanted=(), keep=True):
        """``(Summary, [(views, source)])`` of one tag at its listed version and each wanted product.

        ``views`` are read-only views of the product's arrays, as many rows as
        the summary has steps; ``source`` is the object they are kept in,
        which stays the same while the product only grows (``merge.grow``).

        A product is what is kept of a tag's values: ``tag_blocks.VALUES`` (every
        readable point, ``[S, ...]``) or a block (``tag_blocks.block_product``: one
        column's data and keep, ``[S, r]`` each). Each is a cache entry of its
        own, next to the tag's small ``Summary``. The provider is read at most
        once per call, and only when the listed version moved on or a wanted
        product is not held; one request at a time reads a given tag, and the
        others then find what it read. ``keep=False`` makes the wanted
        products for this call only, without putting them in the cache.
        """
        base = (experiment_id, run, series.tag)
        version = runs.series_version(series)
        with self.lock(("tag", *base)):
            state = self.cache.get(("summary", *base))
            if state is not None and state[0] == version:
                held = [self._held(base, product, version) for product in wanted]
                if all(h is not None for h in held):
                    return state[1], [_views(h) for h in held]
            return self._refresh(ctx, experiment_id, run, series, state, wanted, keep)

    def _refresh(self, ctx, experiment_id, run, series, state, wanted, keep=True):
        """Reads a tag and brings its summary and products up to date; see ``_tag``.

        The provider returns every point of the tag; when the tag grew since
        the last read, only the new points are decoded and appended to each
        product still held (``points.decode``). A product that cannot be
        brought forward is made again from this read if wanted, else dropped.
        """
        base = (experiment_id, run, series.tag)
        version = runs.series_version(series)
        limit = points.read_limit(series.content)
        result = self._provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            run_tag_filter=_filter(run, series.tag),
            downsample=limit,
        )
        data = result.get(run, {}).get(series.tag, [])
        # Same version, a product missing: the decode starts over, for that product.
        previous = state if state is not None and state[0] != version else None
        summary, fresh, arrays = points.decode(series, data, limit, previous and previous[1])
        whole = arrays if fresh == 0 else None
        read_back = points.point_bytes(series.content) * max(1, len(summary.steps))
        made = set(wanted) | tag_blocks.opening_products(series.content)
        products = made | set(state[2] if state is not None else ())
        # Read again at the same version because a product was missing: the
        # products still held stand, if the points are the ones they were made of.
        same = previous is None and state is not None and _same_points(state[1], summary)
        views = {}
        for product in sorted(products, key=repr):
            held = self._held(base, product, version) if same else None
            if held is None and previous is not None and fresh:
                held = self._held(base, product, previous[0])
                if held is not None and len(held[0]) == fresh:
                    for stack, rows in zip(held, tag_blocks.rows(series.content, product, arrays)):
                        stack.extend(rows)
                else:
                    held = None
            if held is None and (product in made or whole is not None):
                if whole is None:
                    whole = points.decode(series, data, limit)[2]
                rows = tag_blocks.rows(series.content, product, whole)
                held = tuple(growing_arrays.Stack(np.ascontiguousarray(r)) for r in rows)
            if held is None:  # neither held nor wanted: not worth decoding the whole tag for
                self.cache.pop((product, *base))
                products.discard(product)
                continue
            views[product] = _views(held)
            if not keep and product in wanted:
                self.cache.pop((product, *base))
                products.discard(product)
                continue
            nbytes = sum(stack.nbytes for stack in held) + 256
            # A decoded tag's values cost what they take; a block, a share of
            # them, costs the whole tag to read back, so it outlives them.
            self.cache.put(
                (product, *base), (version, held), nbytes, cost=nbytes if product == tag_blocks.VALUES else read_back
            )
        self.cache.put(
            ("summary", *base), (version, summary, frozenset(products)), summary.nbytes + 512, cost=read_back
        )
        return summary, [views[product] for product in wanted]

    def _held(self, base, product, version):
        """The product's stacks if the cache holds them at ``version``, else None."""
        hit = self.cache.get((product, *base))
        return hit[1] if hit is not None and hit[0] == version else None

    def lock(self, key):
        """The lock of ``key``: work on a cache entry that one request at a time should do (a read, a merge)."""
        with self._locks_lock:
            return self._locks.setdefault(key, threading.Lock())


def _views(held):
    """``(views, source)`` of a product's stacks: read-only views, and what ``merge.grow`` knows them by."""
    return tuple(stack.view() for stack in held), held[0]


def _same_points(a, b):
    """Whether two summaries were decoded from the same points."""
    return np.array_equal(a.seen_steps, b.seen_steps) and np.array_equal(a.seen_times, b.seen_times)


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
