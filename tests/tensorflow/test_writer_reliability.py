"""The writer never crashes training with an obscure error, and never loses a written step.

Bad input: a TypeError or ValueError naming what was expected and what was
received, and nothing half-written. NaN/Inf: data. Closed writers: a clear
error from Python, a skipped write (and one warning) from a graph traced
before close(). Killed processes: a real child process, a real SIGKILL, and
TensorBoard's real data paths reading what it left.
"""

import glob
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_file_loader

from conftest import ROOT
from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps
from tb_gradcheck import GradientWriter

BASE = "/data/plugin/gradients/"


def stats_events(logdir):
    """``[(step, tag, array)]`` of every stats summary in a run directory, in file order."""
    out = []
    for path in sorted(glob.glob(str(logdir / "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.tag.startswith("gradients/stats/"):
                    out.append((event.step, value.tag, tf.make_ndarray(value.tensor)))
    return out


# -- bad input ----------------------------------------------------------------


def cases():
    v = tf.Variable([1.0, 2.0], name="v")
    ints = tf.Variable([1, 2], name="ints")
    g = tf.ones(2)
    return v, [
        # (gradients, variables, step), error, message
        (([g, g], [v], 0), ValueError, r"one gradient per variable. Received: len\(gradients\)=2, len\(variables\)=1"),
        (([g], [v, tf.Variable([1.0])], 0), ValueError, r"len\(gradients\)=1, len\(variables\)=2"),
        (([], [], 0), ValueError, "non-empty list of variables. Received: an empty list"),
        (([], [v], 0), ValueError, "non-empty list of gradients. Received: an empty list"),
        (
            ([tf.constant([1, 2])], [v], 0),
            TypeError,
            "floating-point gradients. Received: gradients\\[0\\] with dtype int32 for variable 'v'",
        ),
        ((["x"], [v], 0), TypeError, "floating-point gradients. Received: gradients\\[0\\] with dtype string"),
        (
            ([object()], [v], 0),
            TypeError,
            "a tensor, a tf.IndexedSlices or None. Received: gradients\\[0\\] of type object",
        ),
        (
            ([tf.IndexedSlices(tf.constant([[1, 2]]), tf.constant([0]))], [tf.Variable([[1.0, 2.0]])], 0),
            TypeError,
            "floating-point gradients. Received: gradients\\[0\\] with dtype int32",
        ),
        (
            ([tf.ones(2)], [ints], 0),
            TypeError,
            "floating-point variables .* Received: variables\\[0\\] 'ints' with dtype int32",
        ),
        (([g], "v", 0), TypeError, "`variables` to be a list. Received: str"),
        (([g], ["v"], 0), TypeError, "tf.Variable or keras.Variable objects .* Received: variables\\[0\\] of type str"),
        (
            ([g], [np.ones(2)], 0),
            TypeError,
            "tf.Variable or keras.Variable objects .* Received: variables\\[0\\] of type ndarray",
        ),
        (({"v": g}, [v], 0), TypeError, "`gradients` to be a list. Received: dict"),
        ((g, [v], 0), TypeError, "`gradients` to be a list. Received: EagerTensor"),
        (
            ([tf.ones(3)], [v], 0),
            ValueError,
            "its variable's shape. Received: gradients\\[0\\] of shape \\(3,\\) for variable 'v'",
        ),
        (([g], [v], 1.5), TypeError, "`step` to be an integer. Received: 1.5 of type float"),
        (([g], [v], "3"), TypeError, "`step` to be an integer. Received: '3' of type str"),
        (([g], [v], None), TypeError, "`step` to be an integer. Received: None"),
        (([g], [v], True), TypeError, "`step` to be an integer. Received: True"),
        (([g], [v], tf.constant(1.0)), TypeError, "`step` to be an integer. Received: a float32 tensor"),
        (([g], [v], np.float64(2.0)), TypeError, "`step` to be an integer. Received: a float64 tensor"),
        (([g], [v], tf.constant([1, 2])), ValueError, "`step` to be a scalar. Received: shape \\(2,\\)"),
        (([g], [v], -1), ValueError, "non-negative int64 .* Received: -1"),
        (([g], [v], 2**63), ValueError, "non-negative int64 .* Received: 9223372036854775808"),
        (([g], [v], tf.constant(-4, tf.int64)), ValueError, "`step` to be non-negative. Received: -4"),
    ]


def test_bad_input_raises_a_clear_error_and_writes_nothing(tmp_path):
    v, bad = cases()
    with GradientWriter(tmp_path) as writer:
        for (gradients, variables, step), error, message in bad:
            with pytest.raises(error, match=message):
                writer.write(gradients, variables, step)
        writer.write([tf.ones(2)], [v], 7)  # the writer still works after all that
    assert [s for s, _, _ in stats_events(tmp_path)] == [7]  # one stats event per written step


@pytest.mark.parametrize("flush_millis", [0, -5, 2.5, "10", True])
def test_constructor_rejects_a_flush_interval_that_is_not_a_positive_integer(tmp_path, flush_millis):
    with pytest.raises(ValueError, match=f"`flush_millis` to be a positive integer. Received: {flush_millis!r}"):
        GradientWriter(tmp_path, flush_millis=flush_millis)


def test_bad_input_inside_tf_function_fails_at_trace_time_with_the_same_error(tmp_path):
    v = tf.Variable([1.0, 2.0], name="v")
    with GradientWriter(tmp_path) as writer:

        @tf.function
        def step_fn(step):
            writer.write([tf.ones(2), tf.ones(2)], [v], step)

        with pytest.raises(ValueError, match=r"len\(gradients\)=2, len\(variables\)=1"):
            step_fn(tf.constant(0, tf.int64))

        @tf.function
        def float_step(step):
            writer.write([tf.ones(2)], [v], step)

        with pytest.raises(TypeError, match="`step` to be an integer. Received: a float32 tensor"):
            float_step(tf.constant(0.0))


def test_nan_and_inf_gradients_are_counted_and_written_in_graph_and_eager(tmp_path):
    a = tf.Variable(np.ones(4, np.float32), name="a")
    b = tf.Variable(np.ones(2, np.float32), name="b")
    bad = tf.constant([np.nan, np.inf, -np.inf, 1.0], tf.float32)
    with GradientWriter(tmp_path / "r") as writer:
        writer.write([bad, tf.ones(2)], [a, b], 0)
        graph = tf.function(lambda g, s: writer.write([g, tf.fill([2], np.float32(np.nan))], [a, b], s))
        graph(bad, tf.constant(1, tf.int64))
    client, _ = make_app(tmp_path, "python")
    wait_for_steps(client, "r", 2)
    count = get_json(client, BASE + "heatmap?run=r&metric=grad_nonfinite")
    assert count["values"] == [[3.0, 0.0], [3.0, 2.0]]
    norm = get_json(client, BASE + "heatmap?run=r&metric=grad_norm")
    assert norm["values"] == [["NaN", pytest.approx(np.sqrt(2))], ["NaN", "NaN"]]
    findings = get_json(client, BASE + "findings?run=r")["findings"]
    assert findings[0]["kind"] == "non_finite" and findings[0]["layers"] == ["a", "b"]


# -- closed writers -------------------------------------------------------------


def test_write_after_close_raises_and_a_graph_traced_before_close_skips_with_one_warning(tmp_path, capfd):
    v = tf.Variable([1.0, 2.0], name="v")
    writer = GradientWriter(tmp_path)

    @tf.function
    def train_step(step):
        writer.write([tf.ones(2)], [v], step)
        return step + 1  # the rest of the training step

    for step in range(3):
        train_step(tf.constant(step, tf.int64))
    writer.close()
    capfd.readouterr()
    # Traced before close(), run after it: the training step goes on.
    results = [int(train_step(tf.constant(step, tf.int64))) for step in range(3, 6)]
    assert results == [4, 5, 6]
    err = capfd.readouterr().err
    assert err.count("tb_gradcheck: GradientWriter.write() ran at step 3 after close()") == 1, err
    assert "step 4" not in err and "step 5" not in err  # warned once
    # Python code after close(): a clear error, eagerly and when tracing.
    with pytest.raises(ValueError, match="Cannot write: this GradientWriter is closed"):
        writer.write([tf.ones(2)], [v], 6)
    with pytest.raises(ValueError, match="Cannot write: this GradientWriter is closed"):
        tf.function(lambda s: writer.write([tf.ones(2)], [v], s))(tf.constant(7, tf.int64))
    assert sorted({s for s, _, _ in stats_events(tmp_path)}) == [0, 1, 2]


def test_a_users_writer_is_not_written_by_a_graph_run_after_close(tmp_path):
    v = tf.Variable([1.0], name="v")
    users = tf.summary.create_file_writer(str(tmp_path))
    writer = GradientWriter(writer=users)
    step_fn = tf.function(lambda s: writer.write([tf.ones(1)], [v], s))
    step_fn(tf.constant(0, tf.int64))
    writer.close()
    step_fn(tf.constant(1, tf.int64))
    users.flush()
    assert sorted({s for s, _, _ in stats_events(tmp_path)}) == [0]


# -- the model changing under one run ---------------------------------------------


def test_a_different_model_in_the_same_run_gets_its_own_rows_merged_by_name(tmp_path, data_path):
    a3 = tf.keras.Sequential(
        [tf.keras.Input((2,)), tf.keras.layers.Dense(3, name="a"), tf.keras.layers.Dense(1, name="out")], name="m"
    )
    # Same layer names, different shapes, one more layer: a new layout.
    a5 = tf.keras.Sequential(
        [
            tf.keras.Input((2,)),
            tf.keras.layers.Dense(5, name="a"),
            tf.keras.layers.Dense(4, name="mid"),
            tf.keras.layers.Dense(1, name="out"),
        ],
        name="m",
    )
    with GradientWriter(tmp_path / "r") as writer:
        for step in range(3):
            writer.write([tf.ones_like(v) for v in a3.trainable_variables], a3.trainable_variables, step)
        for step in range(3, 5):
            writer.write([2 * tf.ones_like(v) for v in a5.trainable_variables], a5.trainable_variables, step)
    client, _ = make_app(tmp_path, data_path)
    entry = wait_for_steps(client, "r", 5)
    assert entry["granularities"]["layer"]["rows"] == ["m/a", "m/out", "m/mid"]
    assert entry["total_steps"] == 5 and entry["sampled"] is False and entry["problems"] == []
    body = get_json(client, BASE + "heatmap?run=r&metric=grad_max_abs")
    assert body["values"] == [[1.0, 1.0, None]] * 3 + [[2.0, 2.0, 2.0]] * 2


def test_two_models_written_at_the_same_steps_are_not_reported_as_sampled(tmp_path, data_path):
    generator = [tf.Variable([1.0], name="gen/w")]
    critic = [tf.Variable([1.0], name="critic/w")]
    with GradientWriter(tmp_path / "gan") as writer:
        step_fn = tf.function(
            lambda s: (writer.write([tf.ones(1)], generator, s), writer.write([3 * tf.ones(1)], critic, s))
        )
        for step in range(4):
            step_fn(tf.constant(step, tf.int64))
    client, _ = make_app(tmp_path, data_path)
    entry = wait_for_steps(client, "gan", 4)
    assert entry["total_steps"] == 4 and entry["sampled"] is False
    body = get_json(client, BASE + "heatmap?run=gan&metric=grad_norm")
    assert body["layers"] == ["gen/w", "critic/w"] and body["values"] == [[1.0, 3.0]] * 4


# -- nothing lost -----------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    from tb_gradcheck import GradientWriter

    logdir, mode = sys.argv[1], sys.argv[2]
    variables = [tf.Variable(tf.ones([8, 8]), name=f"layer{i}") for i in range(3)]
    # No time-based flush during the test: only write() itself, flush() and exit may flush.
    writer = GradientWriter(logdir, flush_millis=10**6)

    @tf.function
    def train_step(step):
        grads = [tf.fill([8, 8], tf.cast(step + 1, tf.float32)) for _ in variables]
        writer.write(grads, variables, step)

    def run(first, last):
        for step in range(first, last + 1):
            train_step(tf.constant(step, tf.int64))

    if mode == "kill":
        run(0, 19)
        writer.flush()
        print("flushed 19", flush=True)
        run(20, 29)  # 30 more events, under the queue's 100, and no flush() call
        print("wrote 29", flush=True)
        time.sleep(600)  # the parent kills us here, mid-run
    elif mode == "queue":
        run(0, 49)
        print("wrote 49", flush=True)
        time.sleep(600)
    elif mode == "busy":
        step = 0
        while True:  # killed while writing, possibly mid-record
            run(step, step + 49)
            step += 50
            print(f"wrote {step - 1}", flush=True)
    elif mode == "exit":
        run(0, 24)  # no close(), no flush(): interpreter exit must flush
    elif mode == "exception":
        run(0, 24)
        raise RuntimeError("training crashed")
    elif mode == "sys_exit":
        run(0, 24)
        sys.exit(3)
    """
)


def start_child(logdir, mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(logdir), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    # stdout lines arrive through a thread, so a wait for one has a timeout
    # and two lines printed together are not lost in a buffer.
    child.lines = queue.Queue()
    threading.Thread(target=lambda: [child.lines.put(line.strip()) for line in child.stdout], daemon=True).start()
    return child


def read_line(child, expected, timeout=120):
    """Waits for the child's next stdout line, which must be ``expected``."""
    try:
        line = child.lines.get(timeout=timeout)
    except queue.Empty:
        line = None
    if line != expected:
        child.kill()
        child.wait(30)
        raise AssertionError(f"child said {line!r}, expected {expected!r}: {child.stderr.read()[-3000:]}")


def served_steps(logdir, run, data_path, at_least):
    client, _ = make_app(logdir, data_path)
    entry = wait_for_steps(client, run, at_least)
    assert entry["problems"] == [], entry["problems"]
    heat = get_json(client, BASE + f"heatmap?run={run}&metric=grad_max_abs")
    for step, row in zip(heat["steps"], heat["values"]):
        assert row == [float(step + 1)] * 3, (step, row)  # every served step is whole and right
    assert get_json(client, BASE + f"findings?run={run}")["run"] == run
    return heat["steps"], entry


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Logdirs of children SIGKILLed mid-run: asleep after a flush, asleep with no flush, and busy writing."""
    root = tmp_path_factory.mktemp("killed")
    children = {mode: start_child(root / mode, mode) for mode in ("kill", "queue", "busy")}
    try:
        read_line(children["kill"], "flushed 19")
        read_line(children["kill"], "wrote 29")
        read_line(children["queue"], "wrote 49")
        for last in (49, 99, 149, 199):
            read_line(children["busy"], f"wrote {last}")
    finally:
        for child in children.values():
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    assert [c.returncode for c in children.values()] == [-signal.SIGKILL] * 3
    return root


def test_sigkill_after_flush_loses_no_flushed_step(killed, data_path):
    steps, entry = served_steps(killed, "kill", data_path, at_least=30)
    # Every step up to the flush, and also those written after it: each
    # write() flushes its own events (the flush policy in writer.py).
    assert steps == list(range(30)) and entry["total_steps"] == 30, steps


def test_sigkill_without_any_flush_call_loses_no_written_step(killed, data_path):
    # 150 events written, 100 allowed in the tf.summary writer's queue, a
    # flush interval of 1000 s and no flush() call: still all of them.
    steps, entry = served_steps(killed, "queue", data_path, at_least=50)
    assert steps == list(range(50)) and entry["total_steps"] == 50, steps


def test_sigkill_while_writing_serves_a_whole_prefix_of_the_run(killed, data_path):
    # Killed at any point of the loop, maybe mid-record: TensorBoard reads
    # every complete record, and each served step is whole (served_steps
    # checks every value). At least the 200 steps announced are there.
    steps, entry = served_steps(killed, "busy", data_path, at_least=200)
    assert steps == list(range(len(steps))) and len(steps) >= 200, steps[-5:]
    assert entry["total_steps"] in (len(steps), len(steps) - 1)  # the last progress record may be cut


@pytest.mark.parametrize("mode, returncode", [("exit", 0), ("exception", 1), ("sys_exit", 3)])
def test_interpreter_exit_flushes_every_step(tmp_path, mode, returncode):
    child = start_child(tmp_path / mode, mode)
    _, err = child.communicate(timeout=180)
    assert child.returncode == returncode, err[-3000:]
    steps, entry = served_steps(tmp_path, mode, "python", at_least=25)
    assert steps == list(range(25)) and entry["total_steps"] == 25
