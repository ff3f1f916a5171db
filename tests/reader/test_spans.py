"""Span tags: writers roll a stats layout's tag over by steps, and readers read the spans of a layout as one tag.

A layout's points go to ``<tag>/<span>`` (``tags.tag_for``), so that a tag
stops growing and a poll re-reads one span per layout. What must not change
is what the tab shows: a run across several spans reads as the same run
written as one tag (what writers wrote before spans), on both of
TensorBoard's loaders, and a restart that rewinds drops the later spans'
stale points as TensorBoard drops them within one tag.
"""

import glob
import json
import os
import time

import numpy as np
import pytest

from conftest import get_json
from conftest import make_app
from conftest import next_second
from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import records
from tb_gradcheck.core import tags
from tb_gradcheck.reader import spans
from tests.reader.test_incremental import Training
from tests.reader.test_incremental import _answers

# --- the rule alone -----------------------------------------------------------


def _job(rng, writes, span):
    """A job's writes with restarts that rewind: ``(per tag: steps, times)``, as the reader holds them, and the
    points one tag would keep under TensorBoard's preemption (``{step: time}``)."""
    step, one_tag, tags = 0, {}, {}
    for t in range(writes):
        if rng.random() < 0.08 and step > 0:  # a restart from an earlier checkpoint
            step = int(rng.integers(0, step + 1))
        one_tag = {s: w for s, w in one_tag.items() if s < step}  # the Rust reservoir's preemption
        one_tag[step] = float(t)
        # One span tag, read back: the last point of each step, in step order.
        tags.setdefault(step // span, {})[step] = float(t)
        step += int(rng.integers(1, 3))
    keys = sorted(tags)
    steps = [np.array(sorted(tags[k]), np.int64) for k in keys]
    times = [np.array([tags[k][s] for s in sorted(tags[k])]) for k in keys]
    return steps, times, one_tag


@pytest.mark.parametrize("seed", range(20))
def test_the_spans_of_a_layout_keep_what_one_tag_keeps_under_preemption(seed):
    rng = np.random.default_rng(seed)
    steps, times, one_tag = _job(rng, 120, span=int(rng.integers(3, 30)))
    masks = spans.preempted(steps, times)
    kept = {}
    for s, t, mask in zip(steps, times, masks):
        keep = np.ones(len(s), bool) if mask is None else mask
        kept.update(zip(s[keep].tolist(), t[keep].tolist()))
    assert kept == one_tag


def test_nothing_is_dropped_from_a_run_that_never_rewound():
    steps = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 23)]
    times = [s * 1.0 for s in steps]
    assert spans.preempted(steps, times) == [None, None, None]
    # Spans listed out of order (the listing orders tags by newest write).
    assert spans.preempted(steps[::-1], times[::-1]) == [None, None, None]


# --- the tag names ------------------------------------------------------------


def _content(rows=3, window=1):
    from rawlogs import stats_content

    return stats_content([f"net/l{i}" for i in range(rows)], window=window)


def test_a_tag_names_its_span_and_a_reader_finds_its_layout():
    content = _content()
    span = tags.span_steps(content)
    # The production size: SPAN_BYTES of points, so thousands of small ones.
    assert span == tags.SPAN_BYTES // metadata.point_bytes(content) > 1000
    windowed = _content(window=5)
    assert tags.span_steps(windowed) == 5 * (tags.SPAN_BYTES // metadata.point_bytes(windowed))
    layout = tags.tag_for(content)
    for step, k in ((0, 0), (span - 1, 0), (span, 1), (7 * span + 3, 7)):
        tag = tags.tag_for(content, step)
        assert tag == f"{layout}/{k:06d}"
        assert tags.span_of(tag) == (layout, k)
    assert tags.span_of(layout) == (layout, None)  # written before spans
    check = metadata.check_layout("layer", ["a"])
    assert tags.tag_for(check, 10**9) == tags.tag_for(check)  # check tags are one tag
    for foreign in ("gradients/stats/x", "gradients/check/layer/00000a/12", "gradients/stats/x/½"):
        assert tags.span_of(foreign) == (foreign, None)
    huge = _content(rows=200_000)  # points of megabytes: still MIN_SPAN_WRITES writes a tag
    assert tags.span_steps(huge) == tags.MIN_SPAN_WRITES


def _events(run_dir):
    """``[(step, tag, has full metadata, tensor bytes)]`` of every gradient summary, in file order."""
    from tensorboard.backend.event_processing import event_file_loader

    out = []
    for path in sorted(glob.glob(os.path.join(str(run_dir), "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            for v in event.summary.value:
                if v.tag.startswith("gradients/"):
                    out.append((event.step, v.tag, bool(v.metadata.plugin_data.content), v.SerializeToString()))
    return out


def test_both_writers_write_each_step_to_its_span_with_the_layout_on_each_span_s_first_event(tmp_path):
    """The compiled TensorFlow writer computes the span in the graph; the framework-neutral core in Python."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    variables = [tf.Variable([1.0, 2.0], name="a"), tf.Variable([3.0], name="b")]
    with GradientWriter(tmp_path / "tf") as writer:

        @tf.function
        def write(step):
            writer.write([tf.ones([2]), tf.ones([1])], variables, step)

        content = None
        for step in [0, 1]:
            write(tf.constant(step, tf.int64))
        (first, *_) = _events(tmp_path / "tf")
        from conftest import stats_content

        content = stats_content(tmp_path / "tf")
        span = tags.span_steps(content)
        # Production spans; the steps need not be consecutive. A rewind into
        # an earlier span (span + 1) carries the layout again.
        steps = [span - 1, span, span + 2, 3 * span + 5, span + 1, span + 3]
        for step in steps:
            write(tf.constant(step, tf.int64))
    written = _events(tmp_path / "tf")
    assert [(s, t) for s, t, _, _ in written] == [(s, tags.tag_for(content, s)) for s in [0, 1] + steps]
    assert [full for _, _, full, _ in written] == [True, False, False, True, False, True, True, False]

    # The core (PyTorch and JAX writers) writes the same values for the same numbers.
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util

    log = eventlog.EventLog(tmp_path / "core")
    n = len(content["layer"]["rows"])
    for step, _, _, value in written:
        array = tensor_util.make_ndarray(summary_pb2.Summary.Value.FromString(value).tensor)
        log.stats(content, array[:, :n], array[:, n:-1], step)
    log.close()
    assert [v for *_, v in _events(tmp_path / "core")] == [v for *_, v in written]
    assert first[1] == tags.tag_for(content, 0)


# --- through TensorBoard: spans read as one tag -------------------------------


def _as_one_tag(src, dst):
    """The same event files with every span tag renamed to its layout's tag: the log a writer before spans wrote."""
    from tensorboard.compat.proto import event_pb2

    os.makedirs(dst, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(str(src), "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        out, at = [], 0
        while at < len(data):  # records: length, crc, data, crc
            length = int.from_bytes(data[at : at + 8], "little")
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for v in event.summary.value:
                v.tag = tags.span_of(v.tag)[0]
            out.append(records.record(event.SerializeToString()))
        with open(os.path.join(str(dst), os.path.basename(path)), "wb") as f:
            f.write(b"".join(out))


def _served(logdir, data_path, last_step, num_steps):
    """Every view of run ``live`` once the server shows ``last_step`` and ``num_steps``."""
    client, _ = make_app(logdir, data_path)
    deadline, entry = time.time() + 60, None
    while time.time() < deadline:  # the Rust data server loads in the background
        for entry in get_json(client, "/data/plugin/gradients/runs")["runs"]:
            layer = entry["granularities"].get("layer", {})
            if layer.get("last_step") == last_step and layer.get("num_steps") == num_steps:
                return _answers(client, ["live"])
        time.sleep(0.3)
    raise AssertionError(f"never served steps up to {last_step} ({num_steps}): {entry}")


@pytest.fixture
def small_spans(monkeypatch):
    """Spans of ``MIN_SPAN_WRITES`` (10) steps, so that a short run crosses several."""
    monkeypatch.setattr(tags, "SPAN_BYTES", 1)
    return tags.MIN_SPAN_WRITES


def test_a_run_across_spans_and_a_restart_into_an_earlier_span_read_as_one_tag_does(tmp_path, data_path, small_spans):
    run = tmp_path / "spans" / "live"
    job = Training(run)
    job.steps(0, 45)  # spans 0..4
    job.close()
    written = {t for _, t, _, _ in _events(run)}
    assert len(written) == 5 and all(tags.span_of(t)[1] is not None for t in written)
    _as_one_tag(run, tmp_path / "one" / "live")
    spanned = _served(tmp_path / "spans", data_path, 44, 45)
    assert spanned == _served(tmp_path / "one", data_path, 44, 45)

    # A restart from step 23 (span 2) that writes up to 30 (span 3): span 2
    # and 3 are rewound by the data server or the reader, span 4 only by the
    # reader; one tag is rewound whole.
    next_second()
    restarted = Training(run)
    restarted.steps(23, 31, nan_at=25)
    restarted.close()
    _as_one_tag(run, tmp_path / "one_restarted" / "live")
    spanned = _served(tmp_path / "spans", data_path, 30, 31)
    assert spanned == _served(tmp_path / "one_restarted", data_path, 30, 31)
    # What the restarted job wrote is what the run shows: its NaN at step 25
    # and its write counter (8 steps), not the abandoned run's 45.
    assert b"25" in spanned[("live", "findings")] and b"non" in spanned[("live", "findings")].lower()
    assert json.loads(spanned[("live", "runs")])["runs"][0]["total_steps"] == 8
