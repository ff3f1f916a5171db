"""A gradient tag's points as TensorBoard's data provider hands them over: checked, stacked, and how many one read may ask for.

``store.py`` reads; this decodes what it read. A point that does not match
its tag's layout is skipped with the reason as a ``Problem``, never raised,
so one bad point or tag does not hide the rest of a run. The provider
returns every point of a tag at each read; when a run grows, only the points
after the previous read are decoded (``decode``), and ``tag_blocks.py`` appends them
to what the store keeps.
"""

import dataclasses

import numpy as np

from tb_gradcheck.core import metadata

# read_tensors takes a sampling hint and returns at most that many points. The
# plugin keeps every point by default (see plugin.py), so it asks for all of
# them, up to the bound below; a hint of 0 would return nothing at all.
#
# TensorBoard's client refuses an answer from its Rust data server over 256 MiB
# (tensorboard/data/server_ingester.py sets grpc.max_receive_message_length),
# and one read_tensors answer carries every point of a tag. A tag larger than
# that (2,000 layers x 10,000 steps is 1.28 GB) made every read of it fail,
# and with it the listing of every run. So a read asks for at most this many
# bytes of points, leaving room for the answer's framing; the data server
# then sends a uniform sample of the tag. The Python path gets the same bound,
# which also bounds the plugin's memory per tag.
READ_BUDGET_BYTES = 192 << 20


@dataclasses.dataclass
class Problem:
    """A tag that could not be read, and why."""

    tag: str
    reason: str

    def to_dict(self):
        return {"tag": self.tag, "reason": self.reason}


point_bytes = metadata.point_bytes


def read_limit(content):
    """The most points of a tag with this layout that one read asks for (``READ_BUDGET_BYTES`` of them)."""
    return max(1, READ_BUDGET_BYTES // max(1, point_bytes(content)))


def write_count(series, values):
    """The write counter in the header row of the last point (stats tags), or None.

    Args:
      series: The tag's ``runs.Series``.
      values: Its points, ``[S, ...]`` or a list of them, the last one latest.
    """
    if series.content["kind"] != metadata.KIND_STATS:
        return None
    return float(values[-1][0, metadata.header_row(series.content), 0])


def write_counts(series, values):
    """float64 ``[S]``: the write counter of every point (stats tags; NaN for check tags)."""
    if series.content["kind"] != metadata.KIND_STATS:
        return np.full(len(values), np.nan)
    header = metadata.header_row(series.content)
    return np.fromiter((v[0, header, 0] for v in values), np.float64, len(values))


class Capped(Problem):
    """A tag with more points than one read may carry: a uniform sample of them was read."""


def _capped(series, read, limit):
    shape = metadata.shape_of(series.content)
    return Capped(
        series.tag,
        f"{read:,} of its points were read, a uniform sample: each point is {point_bytes(series.content) / 1024:,.0f} KiB "
        f"({' x '.join(map(str, shape))} float32) and TensorBoard's data server sends at most 256 MiB per "
        f"read, so at most {limit:,} points of this layout can be shown. Writing with every_n_steps "
        "keeps a whole run readable (each write then covers N steps)",
    )


@dataclasses.dataclass
class Summary:
    """What one tag's points say without their values, and what the next read is checked against.

    Attributes:
      steps: int64 ``[S]``, the readable points' steps, ascending.
      problems: ``Problem`` for every skipped point (and a ``Capped`` read).
      count: Float, the write counter in the header row of the last readable
        point (stats tags), or None.
      seen_steps: int64 ``[N]``, the step of every point the read returned,
        readable or not, in the provider's order.
      seen_times: float64 ``[N]``, their wall times.
      bad: ``{(what, expected): count}`` of the skipped points, in order of
        first appearance.
      times: float64 ``[S]``, the wall times of the readable points of
        ``steps`` (of the last point of a step written twice): what tells
        which of two points was written later (``spans.preempted``).
      counts: float64 ``[S]``, their write counters (``write_counts``):
        the count at the last point that stands (``Store.progress``).
    """

    steps: np.ndarray
    problems: list
    count: object = None
    seen_steps: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    seen_times: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float64))
    bad: dict = dataclasses.field(default_factory=dict)
    times: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float64))
    counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float64))

    @property
    def capped(self):
        """Whether the read was cut to ``READ_BUDGET_BYTES`` and the tag holds more points than were read."""
        return any(isinstance(p, Capped) for p in self.problems)

    @property
    def nbytes(self):
        return sum(a.nbytes for a in (self.steps, self.times, self.counts, self.seen_steps, self.seen_times))


def decode(series, data, limit=None, previous=None):
    """Decodes a tag's datums: ``(Summary, fresh, arrays)``, skipping bad points.

    A read returns every point of the tag, old and new. Given the ``Summary``
    of an earlier read, only the points after it are decoded when the earlier
    points came back unchanged (the same steps and wall times in the same
    order) and the new readable ones all come later in steps: a growing run.
    Anything else (a restart that rewound the tag, a sampled read, a step
    written twice) is decoded whole, so both ways give the same result.

    Args:
      series: The tag's ``runs.Series``.
      data: The provider's ``TensorDatum`` list, in its order.
      limit: The number of points the read asked for at most: a read that
        returned that many may have been cut (``Capped``) when the tag's
        write counter says more were written. Such a read is a sample, and
        always decoded whole.
      previous: The ``Summary`` of an earlier read of the same tag, or None.

    Returns:
      ``(summary, fresh, arrays)``: ``arrays`` are the points of
      ``summary.steps[fresh:]`` (float32, each of the layout's shape; not
      stacked: what is kept of them is cut out first, ``stack``); ``fresh``
      is 0 for a whole decode, ``len(previous.steps)`` when only new points
      were.
    """
    seen_steps = np.fromiter((d.step for d in data), np.int64, len(data))
    seen_times = np.fromiter((d.wall_time for d in data), np.float64, len(data))
    sampled = limit is not None and len(data) >= limit
    if previous is not None and not sampled:
        old = len(previous.seen_steps)
        if (
            old <= len(data)
            and np.array_equal(seen_steps[:old], previous.seen_steps)
            and np.array_equal(seen_times[:old], previous.seen_times)
        ):
            good, bad = _check(series, data[old:], dict(previous.bad))
            new_steps = np.fromiter((d.step for d in good), np.int64, len(good))
            after = previous.steps[-1] if len(previous.steps) else np.iinfo(np.int64).min
            if not len(new_steps) or (new_steps[0] > after and np.all(np.diff(new_steps) > 0)):
                arrays = [d.numpy for d in good]
                count = write_count(series, arrays) if arrays else previous.count
                steps, times, counts = previous.steps, previous.times, previous.counts
                if len(new_steps):
                    steps = np.concatenate([steps, new_steps])
                    times = np.concatenate([times, np.fromiter((d.wall_time for d in good), np.float64, len(good))])
                    counts = np.concatenate([counts, write_counts(series, arrays)])
                problems = _problems(series, bad, len(data))
                summary = Summary(steps, problems, count, seen_steps, seen_times, bad, times, counts)
                return summary, len(previous.steps), arrays
    good, bad = _check(series, data, {})
    # The provider returns points in step order; keep the last point of a
    # step that appears twice (a rewritten step after a restart).
    by_step = {}
    for d in good:
        by_step[d.step] = d
    steps = np.array(sorted(by_step), dtype=np.int64)
    times = np.array([by_step[s].wall_time for s in steps], dtype=np.float64)
    arrays = [by_step[s].numpy for s in steps]
    problems = _problems(series, bad, len(data))
    count = write_count(series, arrays) if arrays else None
    if len(steps) and sampled:
        # Cut, unless the writer's counter says this is all it wrote.
        if count is None or not np.isfinite(count) or count > len(steps):
            problems.append(_capped(series, len(steps), limit))
    counts = write_counts(series, arrays)
    return Summary(steps, problems, count, seen_steps, seen_times, bad, times, counts), 0, arrays


def _check(series, data, bad):
    """``(good datums, bad)``: ``bad`` counts the skipped ones by ``(what, expected)``, added to the one given."""
    shape = metadata.shape_of(series.content)
    expected_dtype = np.float32
    expected = f"shape {shape} {np.dtype(expected_dtype)}"
    kind = series.content["kind"]
    if kind == metadata.KIND_CHECK:
        status = series.content["columns"].index("status")
        codes = np.arange(len(metadata.CHECK_STATUSES))
    good = []
    for d in data:
        arr = d.numpy
        if arr.shape != shape or arr.dtype != expected_dtype:
            key = (f"shape {arr.shape} {_dtype_name(arr)}", expected)
        elif kind == metadata.KIND_CHECK and not np.all(np.isnan(arr[:, status]) | np.isin(arr[:, status], codes)):
            key = (
                "an unknown check status code",
                f"NaN or one of {codes.tolist()} ({', '.join(metadata.CHECK_STATUSES)})",
            )
        else:
            good.append(d)
            continue
        bad[key] = bad.get(key, 0) + 1
    return good, bad


def _problems(series, bad, read):
    return [
        Problem(series.tag, f"{n} of {read} points have {what}; expected {want}") for (what, want), n in bad.items()
    ]


def stack(arrays, shape):
    """Decoded points as one float32 array ``[k, *shape]``."""
    if not arrays:
        return np.zeros((0,) + tuple(shape), np.float32)
    return np.stack(arrays)


def _dtype_name(arr):
    # TensorBoard hands string tensors over as object arrays of bytes.
    return "string" if arr.dtype == object else str(arr.dtype)
