"""The writer: stored layout, metadata once per tag, windows, flushing, and its errors."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import summary_pb2

from tb_gradcheck import GradientWriter
from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags
from tb_gradcheck.tensorflow import statistics

COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}


def stats_events(logdir):
    """``(step, content, tensor)`` of every stats event; content from the first event of its tag."""
    contents, out = {}, []
    for step, tag, md, arr in events(logdir):
        if tag.startswith("gradients/stats/"):
            if md.plugin_data.content:
                contents.setdefault(tag, metadata.parse(md.plugin_data.content))
            out.append((step, contents[tag], arr))
    return out


def rows(content, arr, granularity):
    """The ``[A, R, C]`` block of one granularity."""
    return arr[:, metadata.rows_of(content, granularity)[1]]


def events(logdir):
    """Every summary value in the run's event files, as (step, tag, metadata, numpy)."""
    out = []
    for path in sorted(glob.glob(str(logdir / "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                out.append((event.step, value.tag, value.metadata, tf.make_ndarray(value.tensor)))
    return out


def two_layer_model():
    return tf.keras.Sequential(
        [tf.keras.Input((2,)), tf.keras.layers.Dense(2, name="a"), tf.keras.layers.Dense(1, name="b")], name="m"
    )


def test_layout_metadata_rides_on_the_first_event_of_each_tag_only(tmp_path):
    model = two_layer_model()
    variables = model.trainable_variables
    with GradientWriter(tmp_path) as writer:
        for step in range(3):
            writer.write([tf.ones_like(v) for v in variables], variables, step)
    written = [e for e in events(tmp_path) if e[1].startswith("gradients/")]
    assert [e[0] for e in written] == [0, 1, 2]  # one event per written step
    assert len({e[1] for e in written}) == 1
    first, later = written[0][2], written[1][2]
    for md in (first, later):
        assert md.plugin_data.plugin_name == "gradients"
        assert md.data_class == summary_pb2.DATA_CLASS_TENSOR
    content = metadata.parse(first.plugin_data.content)
    assert content["layer"] == {
        "rows": ["m/a", "m/b"],
        "sizes": [6, 3],
        "sparse_rows": [],
        "shapes": [[[2, 2], [2]], [[2, 1], [1]]],
    }
    assert content["variable"]["rows"] == ["m/a/kernel", "m/a/bias", "m/b/kernel", "m/b/bias"]
    assert content["variable"]["shapes"] == [[[2, 2]], [[2]], [[2, 1]], [[1]]]
    # Written every step: no onset columns (they would restate grad_norm and grad_nonfinite).
    assert content["columns"] == list(metadata.stored_columns(1)) and content["aggregates"] == ["last"]
    assert not set(metadata.ONSET_STAT_COLUMNS) & set(content["columns"])
    assert written[0][1] == tags.tag_for(content, 0)
    assert later.plugin_data.content == b""
    arr = written[2][3]
    assert arr.shape == (1, 2 + 4 + 1, len(metadata.stored_columns(1))) and arr.dtype == np.float32
    assert arr[0, 0, COL["grad_norm"]] == pytest.approx(np.sqrt(6))
    assert arr[0, 2, COL["grad_norm"]] == pytest.approx(2.0)  # m/a/kernel: ||ones(2, 2)||
    header = arr[0, metadata.header_row(content)]
    assert header[0] == 3 and not header[1:].any()  # the write counter


def test_record_if_false_does_not_use_up_the_full_metadata(tmp_path):
    v = tf.Variable([1.0], name="v")
    with GradientWriter(tmp_path) as writer:
        with tf.summary.record_if(False):
            writer.write([tf.ones(1)], [v], 0)
        writer.write([tf.ones(1)], [v], 1)
    written = [e for e in events(tmp_path) if e[1].startswith("gradients/")]
    assert [e[0] for e in written] == [1]
    assert written[0][2].plugin_data.content


def test_windowed_writes_keep_last_mean_max_min_and_sum(tmp_path):
    v = tf.Variable(np.ones(4, np.float32), name="v")
    values = [1.0, 2.0, 50.0, 3.0, 4.0, 5.0, 6.0]  # a spike at step 2
    with GradientWriter(tmp_path, every_n_steps=5) as writer:

        @tf.function
        def step_fn(g, step):
            writer.write([tf.fill([4], g)], [v], step)

        for step, g in enumerate(values):
            step_fn(tf.constant(g), tf.constant(step, tf.int64))
        assert step_fn.experimental_get_tracing_count() <= 2
    written = stats_events(tmp_path)
    # Writes at steps 0 and 5, and the partial window (step 6) at close().
    assert [e[0] for e in written] == [0, 5, 6]
    content = written[0][1]
    assert content["aggregates"] == list(metadata.AGGREGATES) and content["window"] == 5
    block = rows(content, written[1][2], "variable")
    agg = {a: block[i, 0] for i, a in enumerate(metadata.AGGREGATES)}
    norm, max_abs = COL["grad_norm"], COL["grad_max_abs"]
    window = 2.0 * np.array([2.0, 50.0, 3.0, 4.0, 5.0])  # steps 1..5: ||g * ones(4)|| = 2g
    assert agg["last"][norm] == 10.0
    assert agg["max"][norm] == 100.0  # the spike between writes is not lost
    assert agg["min"][norm] == 4.0
    assert agg["mean"][norm] == pytest.approx(np.mean(window))
    assert agg["sum"][norm] == pytest.approx(np.sum(window))
    # max |g| and the zero fraction are taken at the write step only.
    assert agg["last"][max_abs] == 5.0 and agg["last"][COL["grad_zero_fraction"]] == 0.0
    for a in ("mean", "max", "min", "sum"):
        assert agg[a][max_abs] == statistics.MISSING and agg[a][COL["grad_zero_fraction"]] == statistics.MISSING
    assert agg["last"][COL["weight_norm"]] == pytest.approx(2.0)
    tail = rows(content, written[2][2], "variable")  # close(): the partial window, norms only
    assert tail[0, 0, norm] == 12.0 and tail[0, 0, max_abs] == statistics.MISSING
    assert written[2][2][0, metadata.header_row(content), 0] == 3


def test_window_nan_shows_in_every_reduced_aggregate_and_counts_sum(tmp_path):
    v = tf.Variable(np.ones(2, np.float32), name="v")
    with GradientWriter(tmp_path, every_n_steps=4) as writer:
        for step, g in enumerate([[1.0, 1.0], [np.nan, 1.0], [np.nan, np.inf], [1.0, 1.0], [1.0, 1.0]]):
            writer.write([tf.constant(g, tf.float32)], [v], step)
    _, content, arr = stats_events(tmp_path)[1]
    block = rows(content, arr, "variable")
    agg = {a: block[i, 0] for i, a in enumerate(metadata.AGGREGATES)}
    # The window counts steps with a NaN or Inf (two of its four); its last slab, the elements (none at step 3).
    assert agg["sum"][COL["grad_nonfinite"]] == 2
    assert agg["max"][COL["grad_nonfinite"]] == 1 and agg["mean"][COL["grad_nonfinite"]] == 0.5
    for a in ("mean", "max", "min"):
        assert np.isnan(agg[a][COL["grad_norm"]]), a
    assert agg["last"][COL["grad_norm"]] == pytest.approx(np.sqrt(2))


def test_window_missing_gradient_stays_missing(tmp_path):
    a = tf.Variable([1.0], name="a")
    b = tf.Variable([1.0], name="b")
    with GradientWriter(tmp_path, every_n_steps=2) as writer:
        for step in range(3):
            writer.write([tf.ones(1), None], [a, b], step)
    _, content, arr = stats_events(tmp_path)[1]
    window = rows(content, arr, "variable")
    assert (window[:, 1, : len(metadata.GRADIENT_STAT_COLUMNS)] == statistics.MISSING).all()
    sum_slab = metadata.AGGREGATES.index("sum")
    norms = window[:, 0, COL["grad_norm"]]
    assert norms[sum_slab] == 2.0 and np.delete(norms, sum_slab).tolist() == [1.0] * 4


def test_existing_writer_is_used_and_left_open(tmp_path):
    v = tf.Variable([1.0], name="v")
    summary_writer = tf.summary.create_file_writer(str(tmp_path))
    with GradientWriter(writer=summary_writer) as writer:
        writer.write([tf.ones(1)], [v], 0)
    with summary_writer.as_default():
        tf.summary.scalar("still_open", 1.0, step=0)  # would raise if closed
    summary_writer.flush()
    assert {e[1].split("/")[1] for e in events(tmp_path) if e[1].startswith("gradients/")} == {"stats"}


def test_close_flushes_and_writing_after_close_raises(tmp_path):
    v = tf.Variable([1.0], name="v")
    writer = GradientWriter(tmp_path, flush_millis=10**9)
    writer.write([tf.ones(1)], [v], 0)
    writer.close()
    writer.close()  # twice is fine
    assert len(stats_events(tmp_path)) == 1
    with pytest.raises(ValueError, match="closed"):
        writer.write([tf.ones(1)], [v], 1)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({}, ValueError, "exactly one of `logdir` and `writer`"),
        ({"logdir": "x", "writer": "y"}, ValueError, "exactly one"),
        ({"writer": "not a writer"}, TypeError, "tf.summary.SummaryWriter.*Received: str"),
        ({"logdir": 3}, TypeError, "path. Received: int"),
        ({"logdir": "x", "every_n_steps": 0}, ValueError, "positive integer. Received: 0"),
        ({"logdir": "x", "every_n_steps": 2.5}, ValueError, "Received: 2.5"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        GradientWriter(**kwargs)


def test_write_rejects_bad_arguments(tmp_path):
    v = tf.Variable([1.0], name="v")
    with GradientWriter(tmp_path) as writer:
        with pytest.raises(TypeError, match="`step` to be an integer. Received: 1.5"):
            writer.write([tf.ones(1)], [v], 1.5)
        with pytest.raises(TypeError, match="float32 tensor"):
            writer.write([tf.ones(1)], [v], tf.constant(1.0))
        with pytest.raises(ValueError, match="non-negative"):
            writer.write([tf.ones(1)], [v], -1)
        with pytest.raises(TypeError, match="`step` to be an integer. Received: True"):
            writer.write([tf.ones(1)], [v], True)
        with pytest.raises(ValueError, match="non-empty list of variables"):
            writer.write([], [], 0)
        with pytest.raises(TypeError, match="`gradients` to be a list. Received: EagerTensor"):
            writer.write(tf.ones(1), [v], 0)
        with pytest.raises(ValueError, match="len\\(gradients\\)=2, len\\(variables\\)=1"):
            writer.write([tf.ones(1), tf.ones(1)], [v], 0)
    assert not [e for e in events(tmp_path) if "/stats/" in e[1]]  # nothing half-written


def test_eager_and_graph_writes_store_the_same_numbers(tmp_path):
    model = two_layer_model()
    variables = model.trainable_variables
    grads = [tf.random.stateless_normal(v.shape, seed=[i, 1]) for i, v in enumerate(variables)]
    with GradientWriter(tmp_path / "eager") as writer:
        writer.write(grads, variables, 0)
    with GradientWriter(tmp_path / "graph") as writer:
        tf.function(lambda: writer.write(grads, variables, 0))()
    eager = [e[3] for e in events(tmp_path / "eager") if "/stats/" in e[1]]
    graph = [e[3] for e in events(tmp_path / "graph") if "/stats/" in e[1]]
    for x, y in zip(eager, graph):
        np.testing.assert_array_equal(x, y)


def test_event_file_is_created_at_the_first_write_only(tmp_path):
    # The directory is made (and checked) when the writer is built; the event file only at its first write.
    v = tf.Variable([1.0], name="v")
    GradientWriter(tmp_path / "unused").close()
    assert os.listdir(tmp_path / "unused") == []  # e.g. a worker that never writes
    with GradientWriter(tmp_path / "used") as writer:
        assert os.listdir(tmp_path / "used") == []
        tf.function(lambda: writer.write([tf.ones(1)], [v], 0))()  # opened while tracing, outside the graph
    assert len(glob.glob(str(tmp_path / "used" / "events.out.tfevents.*"))) == 1
    assert [e[0] for e in events(tmp_path / "used") if "/stats/" in e[1]] == [0]


# -- write_check ------------------------------------------------------------------


def _checked_model():
    import check_models

    case = check_models.mlp((3, 4, 1), wrong_layer=0, factor=1.1).reseed(0)
    return case


def test_write_check_stores_one_row_per_layer_with_status_codes(tmp_path):
    from tb_gradcheck import check_gradients

    case = _checked_model()
    report = check_gradients(case.loss, case.variables, seed=0)
    with GradientWriter(tmp_path) as writer:
        writer.write_check(report, 7)
        writer.write_check(report, 8)
    check_events = [e for e in events(tmp_path) if e[1].startswith("gradients/check/")]
    assert [e[0] for e in check_events] == [7, 8]  # layers only: the report has no variable rows
    step, tag, md, arr = check_events[0]
    content = metadata.parse(md.plugin_data.content)
    assert tag == tags.tag_for(content) and tag.startswith("gradients/check/layer/")
    assert content["rows"] == ["mlp/dense_0", "mlp/dense_1"] and content["columns"] == list(metadata.CHECK_COLUMNS)
    assert md.data_class == summary_pb2.DATA_CLASS_TENSOR
    assert check_events[1][2].plugin_data.content == b""  # full metadata on the first event only
    assert arr.shape == (2, len(metadata.CHECK_COLUMNS)) and arr.dtype == np.float32
    col = {c: i for i, c in enumerate(metadata.CHECK_COLUMNS)}
    for i, row in enumerate(report.layers):
        assert metadata.CHECK_STATUSES[int(arr[i, col["status"]])] == row.status
        for name in ("analytic", "numeric", "relative_error", "noise_floor"):
            assert arr[i, col[name]] == np.float32(getattr(row, name)), name
    assert [r.status for r in report.layers] == ["mismatch", "ok"]


def test_write_check_of_a_per_variable_report_writes_both_granularities(tmp_path):
    from tb_gradcheck import check_gradients

    case = _checked_model()
    report = check_gradients(case.loss, case.variables, seed=0, granularity="variable")
    with GradientWriter(tmp_path) as writer:
        writer.write_check(report, 0)
    tags = sorted(e[1].rsplit("/", 1)[0] for e in events(tmp_path) if e[1].startswith("gradients/check/"))
    assert tags == ["gradients/check/layer", "gradients/check/variable"]
    variable = next(e for e in events(tmp_path) if e[1].startswith("gradients/check/variable/"))
    assert metadata.parse(variable[2].plugin_data.content)["rows"] == [r.name for r in report.variables]
    assert variable[3].shape == (4, len(metadata.CHECK_COLUMNS))


def test_write_check_rejects_what_is_not_a_report_and_graph_mode(tmp_path):
    from tb_gradcheck import check_gradients

    case = _checked_model()
    report = check_gradients(case.loss, case.variables, seed=0)
    with GradientWriter(tmp_path) as writer:
        with pytest.raises(TypeError, match="GradientCheckReport.*Received: dict"):
            writer.write_check(report.to_dict(), 0)
        with pytest.raises(ValueError, match="eagerly"):
            tf.function(lambda: writer.write_check(report, 0))()
        with pytest.raises(ValueError, match="non-negative"):
            writer.write_check(report, -1)
    with pytest.raises(ValueError, match="closed"):
        writer.write_check(report, 1)
    assert not [e for e in events(tmp_path) if e[1].startswith("gradients/check/")]


def test_window_keeps_first_nonfinite_step_and_largest_finite_norm(tmp_path):
    # A divergence inside a 10-step window: the norm grows 1e9-fold at steps
    # 12-13 and turns NaN at step 14. The window's grad_norm max is NaN, which
    # hides both; the onset columns keep them.
    v = tf.Variable(np.ones(4, np.float32), name="v")
    norms = {12: 1e4, 13: 1e9}
    with GradientWriter(tmp_path, every_n_steps=10) as writer:
        for step in range(10, 21):
            scale = np.nan if 14 <= step <= 17 else norms.get(step, 1.0)
            writer.write([tf.constant(np.full(4, scale / 2), tf.float32)], [v], step)  # ||.|| = scale
    written = stats_events(tmp_path)
    assert [e[0] for e in written] == [10, 20]
    _, content, arr = written[1]
    assert {"grad_norm_finite", "first_nonfinite_offset"} <= set(content["columns"])
    block = rows(content, arr, "variable")[:, 0]
    agg = {a: block[i] for i, a in enumerate(metadata.AGGREGATES)}
    assert np.isnan(agg["max"][COL["grad_norm"]])
    assert agg["max"][COL["grad_norm_finite"]] == pytest.approx(1e9, rel=1e-6)
    assert agg["min"][COL["grad_norm_finite"]] == pytest.approx(1.0)
    # Stored as an offset before the write step (20 - 14), in every slab.
    assert block[:, COL["first_nonfinite_offset"]].tolist() == [6.0] * len(metadata.AGGREGATES)
    _, _, first = written[0]  # the write at step 10 saw no NaN
    assert (rows(content, first, "variable")[:, 0, COL["first_nonfinite_offset"]] == statistics.MISSING).all()


def test_non_finite_finding_in_a_window_counts_writes_not_steps(tmp_path):
    # NaN at steps 14-17, written every 10 steps: one write holds them all.
    from tb_gradcheck.findings import diagnose
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    v = tf.Variable(np.ones(4, np.float32), name="v")
    with GradientWriter(tmp_path / "run", every_n_steps=10) as writer:
        for step in range(10, 21):
            scale = np.nan if 14 <= step <= 17 else 1.0
            writer.write([tf.constant(np.full(4, scale / 2), tf.float32)], [v], step)
    s, ctx, eid = store.local_store(str(tmp_path))
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, "run"), metadata.KIND_STATS, "layer")
    (finding,) = [f for f in diagnose.find("run", matrix) if f.kind == "non_finite"]
    evidence = finding.evidence["v"]
    assert evidence["first_step"] == 14 and evidence["writes_with_nonfinite"] == 1
    assert "(1 layer-write affected)" in finding.message


def test_every_step_writes_leave_the_onset_to_the_reader_with_the_same_findings(tmp_path):
    # Written every step, the onset columns are not stored: the findings fall
    # back to the write step itself and to grad_norm, which is exactly what
    # those columns would have held for a one-step window.
    from tb_gradcheck.findings import diagnose
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    v = tf.Variable(np.ones(2, np.float32), name="v")
    with GradientWriter(tmp_path / "run") as writer:
        for step, g in enumerate([[3.0, 4.0], [3e6, 4e6], [np.inf, 4.0], [3.0, 4.0]]):
            writer.write([tf.constant(g, tf.float32)], [v], step)
    (_, content, arr), *_ = stats_events(tmp_path / "run")
    assert content["columns"] == list(metadata.stored_columns(1)) and arr.shape[-1] == len(content["columns"])
    s, ctx, eid = store.local_store(str(tmp_path))
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, "run"), metadata.KIND_STATS, "layer")
    (finding,) = [f for f in diagnose.find("run", matrix) if f.kind == "non_finite"]
    evidence = finding.evidence["v"]
    assert evidence["first_step"] == 2 and evidence["last_step"] == 2
    assert evidence["max_finite_norm_before"] == pytest.approx(5e6)


@pytest.mark.parametrize("data_path", ["python", "rust"])
def test_new_columns_reach_readers_through_tensorboard(tmp_path, data_path):
    """dead_unit_fraction is a metric of the tab; the onset columns are stored, read by name, not offered."""
    import time

    from tensorboard import context

    from conftest import get_json
    from conftest import make_app
    from conftest import wait_for_steps
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store as store_module

    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4, name="d")], name="net")
    kernel, bias = model.trainable_variables
    with GradientWriter(tmp_path / "run", every_n_steps=5) as writer:
        for step in range(1, 11):
            # Units 1 and 3 get no gradient (dead); step 7 goes NaN after a spike at 6.
            g = np.tile(np.array([1.0, 0.0, 2.0, 0.0], np.float32), (3, 1)) * {6: 1e6, 7: np.nan}.get(step, 1.0)
            g[:, [1, 3]] = 0.0
            writer.write([tf.constant(g), tf.constant(g[0])], [kernel, bias], step)
    client, tb = make_app(tmp_path, data_path)
    entry = wait_for_steps(client, "run", 2)
    assert "dead_unit_fraction" in entry["metrics"]
    assert not {"grad_norm_finite", "first_nonfinite_offset"} & set(entry["metrics"])
    body = get_json(client, "/data/plugin/gradients/heatmap?run=run&metric=dead_unit_fraction")
    assert body["values"] == [[0.5], [0.5]]
    get_json(client, "/data/plugin/gradients/heatmap?run=run&metric=first_nonfinite_offset", status=404)

    # What diagnose.find reads: the store's matrix, columns by name.
    provider, _ = tb._make_data_provider()
    reader, ctx = store_module.Store(provider), context.RequestContext()
    deadline = time.time() + 60
    while True:
        index = reader.runs(ctx, "").get("run")
        matrix = index and queries.matrix(reader, ctx, "", index, metadata.KIND_STATS, "layer")
        if matrix is not None and len(matrix.steps) == 2 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert matrix.steps.tolist() == [5, 10]
    offset, missing = matrix.slab("first_nonfinite_offset", "last")
    assert missing.tolist() == [[True], [False]] and offset[1, 0] == 3.0  # 10 - 3 = step 7
    finite, _ = matrix.slab("grad_norm_finite", "max")
    assert finite[1, 0] == pytest.approx(1e6 * np.sqrt(4 * 5), rel=1e-6)  # step 6: 4 elements of 1e6, 4 of 2e6
    dead, _ = matrix.slab("dead_unit_fraction", "last")
    assert dead[:, 0].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("every, write_every, between", [(1, 1, False), (2, 1, False), (1, 3, False), (2, 2, True)])
def test_stash_in_an_xla_compiled_step_records_what_write_records(tmp_path, every, write_every, between):
    """The documented custom-loop pattern for tf.function(jit_compile=True).

    Written every step, the stash holds the last steps: write_stashed() every
    few steps writes them all, and close() what is left. With a window, the
    steps between writes may run a step function traced with
    ``between_writes=True``, which takes only what the window reduces.
    """
    model = tf.keras.Sequential(
        [
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(4, activation="relu", name="d"),
            tf.keras.layers.Dense(1, name="o"),
        ],
        name="net",
    )
    variables = model.trainable_variables
    x = tf.constant(np.random.default_rng(0).normal(size=(8, 3)), tf.float32)

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        return tape.gradient(loss, variables)

    with (
        GradientWriter(tmp_path / "xla", every_n_steps=every) as compiled,
        GradientWriter(tmp_path / "plain", every_n_steps=every) as plain,
    ):

        @tf.function(jit_compile=True)
        def xla_step(step, between_writes):
            compiled.stash(grads(), variables, step, between_writes=between_writes)

        @tf.function
        def plain_step(step):
            plain.write(grads(), variables, step)

        for step in range(1, 6):
            xla_step(tf.constant(step, tf.int64), between and step % every != 0)
            if step % write_every == 0:
                compiled.write_stashed()
                compiled.write_stashed()  # nothing new: writes nothing
            plain_step(tf.constant(step, tf.int64))
    xla, ref = stats_events(tmp_path / "xla"), stats_events(tmp_path / "plain")
    assert [e[0] for e in xla] == [e[0] for e in ref] == ([1, 2, 3, 4, 5] if every == 1 else [2, 4, 5])
    for (_, _, a), (_, _, b) in zip(xla, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)  # XLA may reorder float32 sums


def test_a_write_step_stashed_as_between_writes_keeps_only_the_window_columns(tmp_path):
    """A step wrongly taken for one between writes is written with what was measured, MISSING for the rest."""
    v = tf.Variable([3.0, -4.0], name="v")
    with GradientWriter(tmp_path, every_n_steps=2) as writer:

        @tf.function(jit_compile=True)
        def xla_step(step):
            writer.stash([tf.constant([3.0, -4.0])], [v], step, between_writes=True)

        for step in (1, 2):
            xla_step(tf.constant(step, tf.int64))
        writer.write_stashed()
    (event,) = stats_events(tmp_path)
    assert event[0] == 2
    last = event[2][metadata.AGGREGATES.index("last"), 0]
    column = {c: last[metadata.STORED_STAT_COLUMNS.index(c)] for c in metadata.STORED_STAT_COLUMNS}
    assert column["grad_norm"] == pytest.approx(5.0)
    assert column["grad_nonfinite"] == 0
    assert column["grad_max_abs"] == column["grad_zero_fraction"] == column["weight_norm"] == statistics.MISSING


def test_steps_stashed_between_writes_flag_nan_and_inf_as_steps_that_count_them(tmp_path):
    """Between writes a compiled step reads its NaN/Inf flag from the float64 norms, with no count of its own.

    The window stores the same rows as when every step counts: its sum, max
    and min count the steps with a non-finite element, the onset is the
    first of them. A float64 gradient's squares can overflow where its
    elements are finite (1e200 here), so it is counted, not flagged.
    """
    v32 = tf.Variable(tf.zeros([4], tf.float32), name="v32")
    v64 = tf.Variable(tf.zeros([2], tf.float64), name="v64")
    nan, inf = float("nan"), float("inf")
    steps = {
        1: ([1.0, 2.0, 0.0, -1.0], [1.0, 2.0]),
        2: ([nan, 2.0, 0.0, -1.0], [1.0, 2.0]),
        3: ([1.0, 2.0, 3.0, 0.0], [1.0, 2.0]),  # written
        4: ([inf, -inf, 1.0, 0.0], [1.0, 2.0]),
        5: ([1.0, 1.0, 1.0, 1.0], [1e200, 2.0]),
        6: ([1.0, 2.0, 3.0, 4.0], [0.5, 2.0]),  # written
        7: ([1.0, nan, 3.0, 4.0], [nan, 2.0]),  # left for close()
    }
    runs = {}
    for name, between in (("counted", False), ("flagged", True)):
        with GradientWriter(tmp_path / name, every_n_steps=3) as writer:

            @tf.function(jit_compile=True)
            def xla_step(g32, g64, step, between_writes, writer=writer):
                writer.stash([g32, g64], [v32, v64], step, between_writes=between_writes)

            for step, (g32, g64) in steps.items():
                xla_step(
                    tf.constant(g32),
                    tf.constant(g64, tf.float64),
                    tf.constant(step, tf.int64),
                    between and step % 3 != 0,
                )
                writer.write_stashed()
        runs[name] = stats_events(tmp_path / name)
    assert [e[0] for e in runs["flagged"]] == [e[0] for e in runs["counted"]] == [3, 6, 7]
    column = metadata.STORED_STAT_COLUMNS.index("grad_nonfinite")
    last = metadata.AGGREGATES.index("last")
    for k, ((_, _, a), (_, _, b)) in enumerate(zip(runs["flagged"], runs["counted"])):
        if k == 2:
            # Step 7, between writes, is the last slab of the partial window written at close: its NaN count was
            # not taken (v32 and v64 each had one NaN), the flags in every other slab were.
            counts = b[last, :, column]
            assert counts.max() == 1.0
            np.testing.assert_array_equal(a[last, :, column], np.where(counts > 0, statistics.MISSING, counts))
            a, b = np.delete(a, column, axis=-1), np.delete(b, column, axis=-1)
        np.testing.assert_array_equal(a, b)
    _, content, arr = runs["flagged"][1]  # steps 4 to 6
    sums = rows(content, arr, "variable")[metadata.AGGREGATES.index("sum"), :, column]
    assert sums.tolist() == [1.0, 0.0]  # one step of v32 with NaN/Inf elements; v64's 1e200 is finite


def test_a_write_step_stashed_as_between_writes_leaves_its_nan_count_missing(tmp_path):
    """A step wrongly taken for one between writes flagged its NaN, not counted it: its count reads MISSING."""
    v = tf.Variable([3.0, -4.0, 1.0], name="v")
    with GradientWriter(tmp_path, every_n_steps=2) as writer:

        @tf.function(jit_compile=True)
        def xla_step(g, step):
            writer.stash([g], [v], step, between_writes=True)

        xla_step(tf.constant([3.0, -4.0, 1.0]), tf.constant(1, tf.int64))
        xla_step(tf.constant([float("nan"), float("nan"), 1.0]), tf.constant(2, tf.int64))
        writer.write_stashed()
    (event,) = stats_events(tmp_path)
    stats = event[2]
    column = metadata.STORED_STAT_COLUMNS.index("grad_nonfinite")
    assert stats[metadata.AGGREGATES.index("last"), 0, column] == statistics.MISSING
    assert stats[metadata.AGGREGATES.index("sum"), 0, column] == 1.0  # one step with NaN/Inf elements


def test_between_writes_needs_a_window(tmp_path):
    v = tf.Variable([1.0], name="v")
    with GradientWriter(tmp_path) as writer:
        with pytest.raises(ValueError, match="every_n_steps > 1.*Received: every_n_steps=1"):
            writer.stash([tf.ones([1])], [v], 1, between_writes=True)
        with pytest.raises(TypeError, match="between_writes.*bool"):
            writer.stash([tf.ones([1])], [v], 2, between_writes="yes")


def test_stash_writes_a_step_stored_again_after_a_restart(tmp_path):
    """A loop that starts again at step 1 with the same writer is written again, as write() would."""
    v = tf.Variable([1.0, 2.0], name="v")
    with GradientWriter(tmp_path) as writer:

        @tf.function(jit_compile=True)
        def xla_step(step):
            writer.stash([tf.fill([2], tf.cast(step, tf.float32))], [v], step)

        for steps in ([1, 2, 3], [1, 2]):
            for step in steps:
                xla_step(tf.constant(step, tf.int64))
            writer.write_stashed()
    events = stats_events(tmp_path)
    assert [e[0] for e in events] == [1, 2, 3, 1, 2]
    norm = metadata.STORED_STAT_COLUMNS.index("grad_norm")
    assert [e[2][0, 0, norm] for e in events] == pytest.approx([s * np.sqrt(2) for s in (1, 2, 3, 1, 2)])


def test_a_logdir_that_cannot_hold_the_run_is_refused_when_the_writer_is_built(tmp_path):
    with pytest.raises(ValueError, match="tb_gradcheck.GradientWriter can write its run to. Received: '/proc/x'"):
        GradientWriter("/proc/x")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="Received: '.*file/run': it cannot be created \\(Not a directory\\)"):
        GradientWriter(tmp_path / "file" / "run")
    with pytest.raises(ValueError, match="every_n_steps"):  # a bad argument makes no directory
        GradientWriter(tmp_path / "never", every_n_steps=0)
    assert not (tmp_path / "never").exists()
    with GradientWriter(tmp_path / "run") as writer:
        assert writer.log_dir == str(tmp_path / "run")
