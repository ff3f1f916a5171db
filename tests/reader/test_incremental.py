"""Incremental reading: a run that grows while the server is up answers as a fresh server on the final logs.

The data provider returns every point of a tag at each read; the store
decodes only the points after its previous read (``points.decode``) and
appends them to what it keeps (``growing_arrays.Stack``). These tests hold that
against starting over: first on the decoder alone, then through TensorBoard
itself, on both data paths (the Python multiplexer and the Rust data
server), with a run written by the real ``GradientWriter`` in stages while
the server serves it: plain growth, a malformed point, a second layout, a
restart that rewinds, and a windowed run.
"""

import time

import numpy as np
import pytest

from conftest import get_json
from conftest import make_app
from rawlogs import stats_content
from rawlogs import stats_points
from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags
from tb_gradcheck.reader import growing_arrays
from tb_gradcheck.reader import merge
from tb_gradcheck.reader import points
from tb_gradcheck.reader import runs
from tb_gradcheck.reader import store

# --- the decoder alone --------------------------------------------------------


class Datum:
    """A ``TensorDatum`` as the provider hands it over."""

    def __init__(self, step, wall_time, numpy):
        self.step, self.wall_time, self.numpy = step, wall_time, numpy


def _series(rows=2):
    content = stats_content([f"m/l{i}" for i in range(rows)])
    return runs.Series(tags.tag_for(content), content, 0, 0.0)


def _datums(steps, t0=100.0, value=None):
    series = _series()
    return [
        Datum(int(s), t0 + i, arr if value is None else arr * 0 + value)
        for i, (s, arr) in enumerate(stats_points(2, [int(v) for v in steps], value=1.0))
    ], series


def _whole(series, data, limit=None):
    summary, fresh, arrays = points.decode(series, data, limit)
    assert fresh == 0
    return summary, points.stack(arrays, metadata.shape_of(series.content))


def _same(a, b):
    (sa, va), (sb, vb) = a, b
    assert sa.steps.tobytes() == sb.steps.tobytes() and va.tobytes() == vb.tobytes()
    assert [p.to_dict() for p in sa.problems] == [p.to_dict() for p in sb.problems]
    assert sa.count == sb.count or (np.isnan(sa.count) and np.isnan(sb.count))
    assert sa.bad == sb.bad and sa.capped == sb.capped


def _in_two(series, data, cut, limit=None):
    """Decodes ``data[:cut]``, then all of ``data`` given that: ``(summary, values, fresh)``."""
    first, _, arrays = points.decode(series, data[:cut], limit)
    summary, fresh, more = points.decode(series, data, limit, first)
    shape = metadata.shape_of(series.content)
    if fresh:
        values = np.concatenate([points.stack(arrays, shape), points.stack(more, shape)])
    else:
        values = points.stack(more, shape)
    return summary, values, fresh


def test_decoding_only_new_points_gives_what_decoding_all_of_them_gives():
    data, series = _datums(range(0, 60, 3))
    bad = Datum(61, 500.0, np.zeros((1, 2), np.float32))  # a malformed point among the new ones
    data = data[:12] + [bad] + data[12:]
    for cut in (0, 1, 5, 12, 13, len(data)):
        summary, values, fresh = _in_two(series, data, cut)
        assert fresh == len([d for d in data[:cut] if d is not bad])  # only the new points were decoded
        _same((summary, values), _whole(series, data))
    assert "1 of 21 points have shape (1, 2) float32" in summary.problems[0].reason


@pytest.mark.parametrize(
    "change",
    ["rewound", "rewritten", "out_of_order", "repeated_step", "sampled", "shrunk"],
)
def test_a_read_that_is_not_a_grown_copy_of_the_last_is_decoded_whole(change):
    data, series = _datums(range(20))
    before, after, limit = data[:10], data, None
    if change == "rewound":  # a restart from step 5: the provider dropped steps 5..9 and holds new ones
        new, _ = _datums(range(5, 15), t0=900.0)
        after = data[:5] + new
    elif change == "rewritten":  # the same steps, written again (new wall times)
        after = data[:3] + [Datum(d.step, d.wall_time + 1000, d.numpy) for d in data[3:]]
    elif change == "out_of_order":  # a new point below the last one read (no purge)
        after = data[:10] + [Datum(4, 999.0, data[4].numpy * 2)] + data[10:]
    elif change == "repeated_step":  # the new points repeat the last step read
        after = data[:10] + [Datum(9, 999.0, data[9].numpy * 3)] + data[10:]
    elif change == "sampled":  # a read that hit its limit is a sample, which changes between reads
        limit = len(data)
    else:  # fewer points than last time
        before, after = data[:15], data[:10]
    first, _, _ = points.decode(series, before, limit)
    summary, fresh, arrays = points.decode(series, after, limit, first)
    assert fresh == 0
    _same((summary, points.stack(arrays, metadata.shape_of(series.content))), _whole(series, after, limit))


def test_a_stack_grows_without_changing_a_view_handed_out():
    stack = growing_arrays.Stack(np.arange(6, dtype=np.float32).reshape(3, 2))
    before = stack.view()
    for k in range(5):
        stack.extend(np.full((4, 2), k, np.float32))
    assert before.tolist() == [[0, 1], [2, 3], [4, 5]] and not before.flags.writeable
    after = stack.view()
    assert len(after) == 23 and after[:3].tolist() == before.tolist() and after[-1].tolist() == [4, 4]
    assert stack.nbytes >= after.nbytes  # room to spare is counted


class Source:
    """What the store keeps a block in (merge.Block.source): known to merge.grow by identity only."""


def _block(steps, names, seed, source):
    rng = np.random.default_rng(seed)
    data = rng.random((len(steps), len(names))).astype(np.float32)
    data[rng.random(data.shape) < 0.2] = -1  # no gradient
    data[rng.random(data.shape) < 0.05] = np.nan
    return merge.Block(np.asarray(steps, np.int64), list(names), *merge.stats_cells(data), source)


def _cut(b, n):
    return merge.Block(b.steps[:n], b.names, b.data[:n], b.keep[:n], b.source)


def test_a_laid_out_column_grows_into_what_laying_out_every_block_gives():
    rows = ["a", "b", "c", "d"]
    one, two = Source(), Source()
    full = [_block(range(0, 60), ["a", "b"], 1, one), _block(range(0, 60, 2), ["c", "d"], 2, two)]
    stages = [
        ([_cut(full[0], 10), _cut(full[1], 5)], False),  # the first look
        ([_cut(full[0], 25), _cut(full[1], 12)], True),  # both layouts grew
        ([_cut(full[0], 25), _cut(full[1], 12)], True),  # nothing new
        ([_cut(full[0], 40), _cut(full[1], 12)], True),  # one grew, the other lags behind
        ([_cut(full[0], 40), _cut(full[1], 25)], False),  # the lagging one wrote steps already laid out
        (
            [_cut(full[0], 40), _cut(full[1], 25), _block(range(100, 110), ["a", "d"], 3, Source())],
            True,
        ),  # a new layout after them
        ([_cut(full[0], 40), _block(range(0, 60, 2)[:26], ["c", "d"], 4, Source())], False),  # a layout rewritten
    ]
    laid = None
    for blocks, extended in stages:
        before = laid
        laid = merge.grow(laid, blocks, rows)
        assert (laid is before) == extended
        want = merge.lay_out(blocks, rows)
        for got, expected in zip(laid.views(), want):
            assert got.tobytes() == expected.tobytes()
            assert not got.flags.writeable


# --- through TensorBoard, while the run grows ---------------------------------

ROWS = ("net/a", "net/b", "net/c")
BASE = "/data/plugin/gradients/"


def _views(run):
    """Every request whose answer must not depend on how the run was read: (name, url)."""
    heat = f"{BASE}heatmap?run={run}&encoding=f32"
    return [
        ("runs", f"{BASE}runs"),
        ("grad_norm", f"{heat}&metric=grad_norm"),
        ("grad_norm binned", f"{heat}&metric=grad_norm&width=7"),
        ("grad_norm mean", f"{heat}&metric=grad_norm&aggregate={'mean' if run == 'windowed' else 'last'}&width=5"),
        ("grad_norm reduce", f"{heat}&metric=grad_norm&aggregate={'max' if run == 'windowed' else 'last'}&reduce=mean"),
        ("grad_max_abs variable", f"{heat}&metric=grad_max_abs&granularity=variable"),
        ("grad_to_weight", f"{heat}&metric=grad_to_weight&width=9"),
        ("zero fraction json", f"{BASE}heatmap?run={run}&metric=grad_zero_fraction"),
        ("findings", f"{BASE}findings?run={run}"),
        ("export", f"{BASE}export?run={run}&metric=grad_norm&format=csv"),
    ]


def _answers(client, runs):
    out = {}
    for run in runs:
        for name, url in _views(run):
            response = client.get(url)
            assert response.status_code == 200, (url, response.data[:300])
            out[(run, name)] = response.data
    return out


class Training:
    """A training job's GradientWriter, kept open between stages as a running job keeps it.

    Its events go through one ``tf.summary`` file writer of the job's own,
    which also carries the malformed point of one test stage: TensorBoard's
    Python loader reads a run's event files one after another and does not
    go back to a file once a newer one exists.
    """

    def __init__(self, run_dir, every_n_steps=1, rows=ROWS):
        import tensorflow as tf

        from tb_gradcheck import GradientWriter

        self.tf = tf
        self.variables = [tf.Variable([1.0, 2.0], name=r) for r in rows]
        self.file = tf.summary.create_file_writer(str(run_dir))
        self.writer = GradientWriter(writer=self.file, every_n_steps=every_n_steps)

    def steps(self, first, last, nan_at=None):
        tf = self.tf
        for step in range(first, last):
            grads = [tf.constant([np.float32((step + 1) * 10.0**-i), 0.0]) for i in range(len(self.variables))]
            grads[-1] = None if step % 7 == 3 else grads[-1]  # a row without a gradient at some steps
            if step == nan_at:
                grads[0] = tf.constant([np.nan, 1.0])
            self.writer.write(grads, self.variables, step)

    def malformed(self, tag, step):
        """A point of the wrong shape under the stats tag, as a damaged or foreign writer leaves one."""
        from rawlogs import md_bytes

        with self.file.as_default():
            self.tf.summary.write(tag, np.zeros((2, 2), np.float32), step=step, metadata=md_bytes(b""))
        self.file.flush()

    def close(self):
        self.writer.close()
        self.file.close()


def _reload(tb, data_path, client, run, last_step):
    """Lets the server see what was written: the Python path reloads on demand, the Rust one every second."""
    if data_path == "python":
        tb._ingester.deprecated_multiplexer.Reload()
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.3 if data_path == "rust" else 2.1)  # past the store's listing reuse (2 s)
        for entry in get_json(client, BASE + "runs")["runs"]:
            if entry["run"] == run and entry["granularities"]["layer"]["last_step"] == last_step:
                return
    raise AssertionError(f"the server never showed step {last_step} of {run!r}: {entry}")


@pytest.fixture
def decodes(monkeypatch):
    """Every decode the store makes, ``[(tag, fresh, points decoded)]``, and every heatmap column laid out, ``[("laid", extended)]``."""
    seen = []
    decode, grow = points.decode, merge.grow

    def decoding(series, data, limit=None, previous=None):
        out = decode(series, data, limit, previous)
        seen.append((series.tag, out[1], len(out[2])))
        return out

    def growing_(previous, blocks, row_names):
        out = grow(previous, blocks, row_names)
        seen.append(("laid", out is previous))
        return out

    monkeypatch.setattr(points, "decode", decoding)
    monkeypatch.setattr(merge, "grow", growing_)
    return seen


def test_a_run_that_grows_while_the_server_is_up_answers_as_a_fresh_server(tmp_path, data_path, decodes, monkeypatch):
    # Spans of 10 writes (tags.MIN_SPAN_WRITES), so that the run grows
    # across span tags (new tags while the server is up) and the restart
    # below rewinds into an earlier span.
    monkeypatch.setattr(tags, "SPAN_BYTES", 1)
    logdir = tmp_path / "logs"
    job = Training(logdir / "live")
    windowed = Training(logdir / "windowed", every_n_steps=3)
    job.steps(0, 20)
    windowed.steps(0, 13)  # written at multiples of 3
    client, tb = make_app(logdir, data_path, ["--reload_interval", "1"] if data_path == "rust" else [])
    _reload(tb, data_path, client, "live", 19)
    _reload(tb, data_path, client, "windowed", 12)
    _answers(client, ["live", "windowed"])  # the tab's first look: every view read and kept
    read = {d[0] for d in decodes}

    # Plain growth across span tags, a NaN among the new steps: only the new
    # points of a tag read before are decoded, a new span's whole.
    del decodes[:]
    job.steps(20, 45, nan_at=31)
    windowed.steps(13, 31)
    _reload(tb, data_path, client, "live", 44)
    _reload(tb, data_path, client, "windowed", 30)
    _answers(client, ["live", "windowed"])
    assert [d for d in decodes if d[0] in read and d[1] > 0], decodes
    assert [d for d in decodes if d[0] != "laid" and d[0] not in read], decodes  # new spans
    assert not [d for d in decodes if d[0] in read and d[1] == 0 and d[2] > 0], decodes  # nothing decoded whole again
    # Every heatmap column was extended by the new steps, none laid out anew.
    laid = [d[1] for d in decodes if d[0] == "laid"]
    assert laid and all(laid), decodes

    # A malformed point under the stats tag, then more steps: still only new points.
    st, ctx, eid = store.local_store(logdir)
    series = st.run(ctx, eid, "live").layouts(metadata.KIND_STATS, "layer")[-1]  # the newest span
    del decodes[:]
    job.malformed(series.tag, 45)
    job.steps(46, 50)
    _reload(tb, data_path, client, "live", 49)
    answers = _answers(client, ["live"])
    assert b"1 of 10 points have shape (2, 2) float32" in answers[("live", "runs")]
    assert [d for d in decodes if d[0] == series.tag and d[1] > 0], decodes

    # A second layout (the model gained a layer), then a restart of it that
    # rewinds to step 40. The Rust data server drops that tag's steps from 40
    # on; the Python loader keeps them (it purges only at a SessionLog.START,
    # which tf.summary does not write), and the reader drops them by the same
    # rule (spans.preempted): both show the old layout's last step, 49.
    job.close()
    grown = Training(logdir / "live", rows=ROWS + ("net/d",))
    grown.steps(50, 56)
    grown.close()
    _reload(tb, data_path, client, "live", 55)
    _answers(client, ["live"])
    del decodes[:]
    restarted = Training(logdir / "live", rows=ROWS + ("net/d",))
    restarted.steps(40, 48)
    restarted.close()
    windowed.close()
    _reload(tb, data_path, client, "live", 49)
    live = _answers(client, ["live", "windowed"])
    assert [d for d in decodes if d[0] != "laid" and d[1] == 0 and d[2] > 0], decodes  # a rewound tag: decoded whole

    fresh_client, _ = make_app(logdir, data_path)
    deadline = time.time() + 60
    while True:  # the Rust data server loads in the background
        fresh = _answers(fresh_client, ["live", "windowed"])
        if fresh[("live", "runs")] == live[("live", "runs")] or time.time() > deadline:
            break
        time.sleep(0.5)
    for key in fresh:
        assert live[key] == fresh[key], key
