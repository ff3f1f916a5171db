"""A gradient tag's points as TensorBoard's data provider hands them over: checked, stacked, and how many one read may ask for.

``store.py`` reads; this decodes what it read. A point that does not match
its tag's layout is skipped with the reason as a ``Problem``, never raised,
so one bad point or tag does not hide the rest of a run.
"""

import dataclasses

import numpy as np

from tb_gradcheck import metadata

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


def point_bytes(content):
    """Bytes of one point (one step's float32 tensor) of a tag with this layout."""
    return 4 * int(np.prod(metadata.shape_of(content)))


def read_limit(content):
    """The most points of a tag with this layout that one read asks for (``READ_BUDGET_BYTES`` of them)."""
    return max(1, READ_BUDGET_BYTES // max(1, point_bytes(content)))


def write_count(series, values):
    """The write counter in the header row of the last point (stats tags), or None."""
    if series.content["kind"] != metadata.KIND_STATS:
        return None
    return float(values[-1, 0, metadata.header_row(series.content), 0])


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


def decode(series, data, limit=None):
    """Stacks a tag's datums into ``(steps [S], values [S, ...], problems)``, skipping bad ones.

    ``limit`` is the number of points the read asked for at most: a read that
    returned that many may have been cut (``Capped``) when the tag's write
    counter says more were written.
    """
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
            key = (
                "an unknown check status code",
                f"NaN or one of {codes.tolist()} ({', '.join(metadata.CHECK_STATUSES)})",
            )
        else:
            good.append(d)
            continue
        bad[key] = bad.get(key, 0) + 1
    problems = [
        Problem(series.tag, f"{n} of {len(data)} points have {what}; expected {want}")
        for (what, want), n in bad.items()
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
    if limit is not None and len(data) >= limit:
        # Cut, unless the writer's counter says this is all it wrote.
        count = write_count(series, values)
        if count is None or not np.isfinite(count) or count > len(steps):
            problems.append(_capped(series, len(steps), limit))
    return steps, values, problems


def _dtype_name(arr):
    # TensorBoard hands string tensors over as object arrays of bytes.
    return "string" if arr.dtype == object else str(arr.dtype)
