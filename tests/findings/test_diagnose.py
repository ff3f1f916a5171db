"""Findings on real training runs, through the HTTP route and through `tb-gradcheck report`."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps
from tb_gradcheck import GradientWriter
from tb_gradcheck import demo
from tb_gradcheck.findings import diagnose

SPIKE_STEP = 237
NAN_STEP = 30
NAN_LAYER = "mlp/dense_2"


def train(run_dir, steps, every_n_steps=1, spike_step=None, nan_layer=None, nan_step=None, seed=0):
    """A real custom loop on a small ReLU MLP; optionally one loss spike or one NaN gradient."""
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential(
        [tf.keras.Input((8,))]
        + [tf.keras.layers.Dense(16, activation="relu", name=f"dense_{i}") for i in range(4)]
        + [tf.keras.layers.Dense(1, name="out")],
        name="mlp",
    )
    optimizer = tf.keras.optimizers.SGD(1e-3)
    x = tf.random.normal([64, 8], seed=seed)
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    variables = model.trainable_variables
    nan_index = [i for i, v in enumerate(variables) if v.path.startswith(nan_layer + "/")] if nan_layer else []
    with GradientWriter(run_dir, every_n_steps=every_n_steps) as writer:

        @tf.function
        def step_fn(scale, poison):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2) * scale
            grads = tape.gradient(loss, variables)
            logged = [g + poison if i in nan_index else g for i, g in enumerate(grads)]
            writer.write(logged, variables, optimizer.iterations)
            # The log sees the raw gradients; training applies them clipped (as
            # careful loops do), so one spike does not wreck the run, and the
            # NaN goes to the log only, so the other layers stay finite.
            clipped, _ = tf.clip_by_global_norm(grads, 10.0)
            optimizer.apply_gradients(zip(clipped, variables))

        for step in range(steps):
            scale = 1e6 if step == spike_step else 1.0
            poison = np.nan if step == nan_step else 0.0
            step_fn(tf.constant(scale), tf.constant(poison))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("findings")
    demo.write_runs(str(path), steps=200)
    train(path / "spike", 500, every_n_steps=50, spike_step=SPIKE_STEP)
    train(path / "nan", 100, nan_layer=NAN_LAYER, nan_step=NAN_STEP)
    return path


def by_kind(findings):
    return {f["kind"]: f for f in findings}


def test_findings_route_names_the_right_layers_and_steps(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    wait_for_steps(client, "nan", 100)
    wait_for_steps(client, "spike", 11)

    sigmoid = by_kind(get_json(client, "/data/plugin/gradients/findings?run=sigmoid")["findings"])
    assert set(sigmoid) == {"vanishing"}
    vanishing = sigmoid["vanishing"]
    assert vanishing["layers"][0] == "mlp/dense_0" and "mlp/logits" not in vanishing["layers"]
    assert len(vanishing["layers"]) >= 4
    assert vanishing["evidence"]["mlp/dense_0"]["median_orders_below_later_layers"] > 3
    # From where its run of vanishing writes began, not from where the trailing window first made it sure.
    first = vanishing["evidence"]["mlp/dense_0"]
    assert first["first_step"] < first["confirmed_at_step"] and vanishing["steps"][0] == first["first_step"]
    assert get_json(client, "/data/plugin/gradients/findings?run=relu_he")["findings"] == []

    spike = by_kind(get_json(client, "/data/plugin/gradients/findings?run=spike")["findings"])
    assert "exploding" in spike
    window_end = 250  # the write that closes the window (200, 250] holding step 237
    assert spike["exploding"]["steps"][0] <= window_end <= spike["exploding"]["steps"][1]
    assert spike["exploding"]["aggregate"] == "max"

    nan = get_json(client, "/data/plugin/gradients/findings?run=nan")["findings"]
    non_finite = by_kind(nan)["non_finite"]
    assert non_finite["layers"] == [NAN_LAYER]
    assert non_finite["steps"] == [NAN_STEP, NAN_STEP]
    assert non_finite["severity"] == "error"


def test_max_aggregate_shows_the_spike_window(logdir):
    client, _ = make_app(logdir, "python")
    body = get_json(client, "/data/plugin/gradients/heatmap?run=spike&metric=grad_norm&aggregate=max")
    assert body["steps"] == list(range(0, 500, 50)) + [499]  # every 50 steps, and the tail at close()
    peak = np.array(body["values"], dtype=float).max(axis=1)
    assert body["steps"][int(np.argmax(peak))] == 250
    assert peak[body["steps"].index(250)] > 1e3 * np.median(peak)
    last = np.array(get_json(client, "/data/plugin/gradients/heatmap?run=spike&metric=grad_norm")["values"], float)
    assert last.max() < 1e3 * np.median(last)  # the last-step view alone would have missed it


def report(logdir, *args):
    out = subprocess.run(
        [sys.executable, "-m", "tb_gradcheck.cli", "report", str(logdir), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return out.returncode, out.stdout, out.stderr


def test_report_cli_exit_codes_and_json(logdir):
    code, out, _ = report(logdir, "--run", "relu_he")
    assert code == 0 and "run relu_he: healthy" in out
    code, out, _ = report(logdir, "--format", "json")
    assert code == 1
    body = json.loads(out)
    assert body["healthy"] is False and body["fail_on"] == "error" and body["failed"] is True
    kinds = {run: {f["kind"] for f in r["findings"]} for run, r in body["runs"].items()}
    assert kinds == {"nan": {"non_finite"}, "relu_he": set(), "sigmoid": {"vanishing"}, "spike": {"exploding"}}
    assert body["runs"]["nan"]["findings"][0]["layers"] == [NAN_LAYER]
    code, out, _ = report(logdir, "--run", "sigmoid", "--fail-on", "warning")
    assert code == 1 and "vanishing" in out and "mlp/dense_0" in out


def test_report_gate_fails_on_errors_by_default_and_as_asked(logdir):
    """The default gate fails on errors only; ``--fail-on`` moves it; the JSON keeps every finding whatever the gate."""
    gates = {}
    for gate in ("default", "error", "warning", "never"):
        args = () if gate == "default" else ("--fail-on", gate)
        gates[gate] = {run: report(logdir, "--run", run, *args)[0] for run in ("relu_he", "sigmoid", "nan")}
    # sigmoid: a vanishing warning; nan: a non-finite error.
    assert gates["default"] == gates["error"] == {"relu_he": 0, "sigmoid": 0, "nan": 1}
    assert gates["warning"] == {"relu_he": 0, "sigmoid": 1, "nan": 1}
    assert gates["never"] == {"relu_he": 0, "sigmoid": 0, "nan": 0}
    code, out, _ = report(logdir, "--run", "sigmoid", "--format", "json", "--fail-on", "never")
    body = json.loads(out)
    assert code == 0 and body["failed"] is False and body["healthy"] is False
    assert [f["severity"] for f in body["runs"]["sigmoid"]["findings"]] == ["warning"]
    code, _, err = report(logdir, "--fail-on", "info")
    assert code == 2 and "--fail-on" in err


def test_report_cli_usage_and_data_errors_exit_2(logdir, tmp_path):
    for args, message in [
        ((str(tmp_path / "nope"),), "no such log directory"),
        ((str(tmp_path),), "no gradient data"),
        ((str(logdir), "--run", "ghost"), "'ghost'"),
        ((str(logdir), "--threshold", "persistence"), "NAME=VALUE"),
        ((str(logdir), "--threshold", "persistence=lots"), "must be a number"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "tb_gradcheck.cli", "report", *args], capture_output=True, text=True, timeout=180
        )
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert message in out.stderr, (args, out.stderr)


def test_threshold_override_changes_the_verdict(logdir):
    code, out, _ = report(logdir, "--run", "sigmoid", "--threshold", "vanishing_orders=12", "--fail-on", "warning")
    assert code == 1 and "too small against its weights" in out  # the ratio floor still holds
    code, out, _ = report(
        logdir,
        "--run",
        "sigmoid",
        "--threshold",
        "vanishing_orders=12",
        "--threshold",
        "vanishing_ratio=0",
        "--fail-on",
        "warning",
    )
    assert code == 0, out


def test_export_cli_and_route_agree(logdir, tmp_path):
    target = tmp_path / "m.csv"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tb_gradcheck.cli",
            "export",
            str(logdir),
            "--run",
            "nan",
            "--metric",
            "grad_nonfinite",
            "-o",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    lines = target.read_text().splitlines()
    header = lines[0].split(",")
    assert header[0] == "step" and header[1:] == ["mlp/dense_0", "mlp/dense_1", "mlp/dense_2", "mlp/dense_3", "mlp/out"]
    assert len(lines) == 101
    row = lines[1 + NAN_STEP].split(",")
    assert row[0] == str(NAN_STEP) and float(row[3]) > 0 and float(row[1]) == 0
    client, _ = make_app(logdir, "python")
    response = client.get("/data/plugin/gradients/export?run=nan&metric=grad_nonfinite&format=csv")
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/csv")
    assert 'filename="nan-grad_nonfinite-layer-last.csv"' in response.headers["Content-Disposition"]
    assert response.data.decode() == target.read_text()


def test_compare_route_aligns_rows_by_name(logdir):
    client, _ = make_app(logdir, "python")
    body = get_json(client, "/data/plugin/gradients/compare?run=sigmoid&other=relu_he&metric=grad_norm")
    assert body["layers"][0] == "mlp/dense_0" and body["only_in_run"] == [] and body["only_in_other"] == []
    sig = get_json(client, "/data/plugin/gradients/heatmap?run=sigmoid&metric=grad_norm")
    relu = get_json(client, "/data/plugin/gradients/heatmap?run=relu_he&metric=grad_norm")
    np.testing.assert_allclose(body["values"][5][0], sig["values"][5][0] / relu["values"][5][0], rtol=1e-12)
    body = get_json(client, "/data/plugin/gradients/compare?run=sigmoid&other=nan&metric=grad_norm")
    assert "mlp/logits" in body["only_in_run"] and "mlp/out" in body["only_in_other"]
    assert get_json(client, "/data/plugin/gradients/compare?run=sigmoid&other=ghost&metric=grad_norm", 404)


def test_dead_layer_is_found_and_embeddings_are_exempt(tmp_path):
    dead = tf.Variable(np.ones((4, 4), np.float32), name="dead")
    table = tf.Variable(np.ones((1000, 4), np.float32), name="table")
    live = tf.Variable(np.ones(4, np.float32), name="live")
    with GradientWriter(tmp_path / "r") as writer:
        for step in range(20):
            sparse = tf.IndexedSlices(tf.ones([3, 4]), tf.constant([1, 5, 9]), tf.constant([1000, 4]))
            writer.write([tf.zeros([4, 4]), sparse, tf.ones(4)], [dead, table, live], step)
    client, _ = make_app(tmp_path, "python")
    findings = by_kind(get_json(client, "/data/plugin/gradients/findings?run=r")["findings"])
    assert findings["dead"]["layers"] == ["dead"]  # table's 99.7% zeros are sparsity, not death
    assert findings["dead"]["evidence"]["dead"]["median_dead_unit_fraction"] == 1.0
    # Dead from the first write, though the rule needs min_writes (5) to be sure.
    assert findings["dead"]["steps"] == [0, 19]
    assert findings["dead"]["evidence"]["dead"]["confirmed_at_step"] == 4  # the fifth write
    assert "vanishing" not in findings  # a dead layer is reported once, as dead


def test_thresholds_are_documented_dataclass_fields():
    # Each field is documented on the class that declares it (the optimizer
    # findings' on optimizer_findings.OptimizerThresholds, a base class).
    for cls in diagnose.Thresholds.__mro__:
        for field in vars(cls).get("__annotations__", {}):
            assert f"{field}:" in cls.__doc__, (cls.__name__, field)
    assert {"clip_fraction", "vanishing_orders"} <= set(diagnose.Thresholds.__dataclass_fields__)


def _verdicts(logdir, run):
    """``{kind: (steps, rows, flags)}`` of one run, read back through TensorBoard's Python data path."""
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    s, ctx, eid = store.local_store(logdir)
    index = s.run(ctx, eid, run)
    stats = queries.matrix(s, ctx, eid, index, "stats", "layer")
    return {kind: (stats.steps, stats.rows, v.flags) for kind, v in diagnose.verdicts(stats).items()}


def test_findings_about_the_first_steps_do_not_depend_on_run_length(tmp_path):
    # One seeded run (the demo's two nets) trained to 500, 1,000 and 2,000
    # steps. Every verdict about a step reads only the steps up to it and at
    # most sustained_writes after it, so the verdicts about the first 500
    # steps (less that margin) must be identical; with a whole-run median the
    # healthy relu_he run used to get an error at step 1 once it ran 1,000.
    lengths = (500, 1000, 2000)
    for n in lengths:
        demo.write_runs(str(tmp_path / str(n)), steps=n)
    margin = diagnose.Thresholds().sustained_writes
    for run in ("relu_he", "sigmoid"):
        seen = [_verdicts(tmp_path / str(n), run) for n in lengths]
        for kind in seen[0]:
            steps, rows, flags = seen[0][kind]
            keep = steps < lengths[0] - margin
            for other in seen[1:]:
                o_steps, o_rows, o_flags = other[kind]
                assert o_rows == rows
                np.testing.assert_array_equal(o_steps[: keep.sum()], steps[keep])
                np.testing.assert_array_equal(o_flags[: keep.sum()], flags[keep], err_msg=f"{run} {kind}")
        client, _ = make_app(tmp_path / str(lengths[-1]), "python")
        found = {f["kind"]: f for f in get_json(client, f"/data/plugin/gradients/findings?run={run}")["findings"]}
        if run == "relu_he":
            assert found == {}, found  # healthy at every length
        else:
            assert set(found) == {"vanishing"} and found["vanishing"]["layers"][0] == "mlp/dense_0"
            assert seen[0]["vanishing"][2].any()  # the 500-step run already says so


def test_describe_quotes_names_for_each_consumer(tmp_path):
    # A name with a right-to-left override and a newline: the tab gets it
    # bidi-isolated, a terminal gets it plain with both made visible.
    hostile = "evil\u202e\nlayer"
    var = tf.Variable(np.ones(4, np.float32), name=hostile)  # a plain variable is its own layer
    with GradientWriter(tmp_path / "r") as writer:
        for step in range(3):
            writer.write([tf.fill([4], np.float32(np.nan) if step == 1 else 1.0)], [var], step)
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    s, ctx, eid = store.local_store(tmp_path)
    index = s.run(ctx, eid, "r")
    (f,) = diagnose.find("r", queries.matrix(s, ctx, eid, index, "stats", "layer"))
    assert f.kind == "non_finite" and f.layers == [hostile] and f.steps == [1, 1]
    assert f.message == diagnose.describe(f) and "\u2068" + hostile + "\u2069" in f.message
    assert hostile in diagnose.describe(f, str) and "\u2068" not in diagnose.describe(f, str)


def _findings_of_norms(run_dir, norms):
    """Writes one variable whose gradient norm at step s is ``norms[s]`` (0: an all-zero gradient); its findings."""
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    var = tf.Variable(np.ones(4, np.float32), name="layer")
    with GradientWriter(run_dir) as writer:
        for step, norm in enumerate(norms):
            writer.write([tf.fill([4], np.float32(norm / 2.0))], [var], step)  # 4 elements of norm/2
    s, ctx, eid = store.local_store(run_dir.parent)
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, run_dir.name), "stats", "layer")
    return {f.kind: f for f in diagnose.find("r", matrix)}


def test_a_one_write_spike_must_clear_the_layers_own_recent_spread(tmp_path):
    """Mini-batch noise with heavy tails (tiny batches, a converged classifier's rare hard examples) is not a spike.

    Every seventh write 1.8 orders above the others is the layer's own
    spread; a write 2.3 orders up clears its median by more than rise_orders
    but that spread by less than spike_margin_orders: no finding. The same
    write over light noise is a one-write spike: a warning, recovered.
    """
    base = 1e-2 * (1 + 0.1 * np.sin(np.arange(100)))
    heavy = np.where(np.arange(100) % 7 == 3, base * 10**1.8, base)
    heavy[60] = light_spike = base[60] * 10**2.3
    assert "exploding" not in _findings_of_norms(tmp_path / "r", heavy)
    light = base.copy()
    light[60] = light_spike
    found = _findings_of_norms(tmp_path / "r2", light)["exploding"]
    assert found.severity == "warning" and found.steps == [60, 60]
    assert found.evidence["layer"]["outcome"] == "recovered"


def test_an_explosion_that_leaves_the_layer_without_gradient_is_an_error_that_says_so(tmp_path):
    """A rise that ends in a gradient of exactly zero wrecked the layer as surely as one that ends in NaN."""
    norms = np.full(60, 1e-2)
    norms[40] = 1e3
    norms[41:] = 0.0
    found = _findings_of_norms(tmp_path / "r", norms)["exploding"]
    assert found.severity == "error" and found.steps[0] == 40
    assert found.evidence["layer"]["outcome"] == "ends with no gradient at all"


def _findings_of_layers(run_dir, norms, weights=1.0):
    """Two plain variables, ``first`` then ``last`` (each its own layer), their gradient norms per step ``norms[s]``."""
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    first = tf.Variable(np.full(4, weights, np.float32), name="first")
    last = tf.Variable(np.ones(4, np.float32), name="last")
    with GradientWriter(run_dir) as writer:
        for step, (a, b) in enumerate(norms):
            writer.write([tf.fill([4], np.float32(a / 2.0)), tf.fill([4], np.float32(b / 2.0))], [first, last], step)
    s, ctx, eid = store.local_store(run_dir.parent)
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, run_dir.name), "stats", "layer")
    return {f.kind: f for f in diagnose.find("r", matrix)}


def test_a_layer_without_any_gradient_is_dead_within_min_writes_not_vanishing(tmp_path):
    """Exactly 0 is no gradient, not a small one; and no unit of a live layer is silent on five batches running."""
    found = _findings_of_layers(tmp_path / "r", [(1.0, 1.0)] * 10 + [(0.0, 1.0)] * 10)
    assert set(found) == {"dead"} and found["dead"].layers == ["first"]
    evidence = found["dead"].evidence["first"]
    assert evidence["first_step"] == 10 and evidence["confirmed_at_step"] == 14  # 5 writes, not a window of 20


def test_a_layer_with_nan_weights_is_not_dead_nor_vanishing(tmp_path):
    """Behind NaN weights a compiled ReLU gives 0: the gradient is 0 but says nothing of the layer's units."""
    found = _findings_of_layers(tmp_path / "r", [(0.0, 1.0)] * 20, weights=np.nan)
    assert "dead" not in found and "vanishing" not in found


def test_a_layer_that_no_gradient_reaches_is_left_to_the_dead_layer_after_it(tmp_path):
    """A saturated head or a dead layer passes nothing back: the layers before it are silent for its reason."""
    found = _findings_of_layers(tmp_path / "r", [(0.0, 0.0)] * 10)
    assert set(found) == {"dead"} and found["dead"].layers == ["last"]
    assert found["dead"].evidence["last"]["layers_cut_off_behind"] == 1
    assert found["dead"].message.endswith("no gradient reaches the 1 layer before it.")


def _findings_of_units(run_dir, silent, steps=80, size=1.0, units=8):
    """One Dense-like kernel ``[4, units]`` (its own layer); at step s the units ``silent(s)`` get a zero gradient.

    Every other element of the gradient is ``size``; the weights start at ones and grow by 1e-4 of themselves
    per step (a run whose weights never move is a finding of its own: ``still``). Returns ``{kind: [finding]}``.
    """
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    kernel = tf.Variable(np.ones((4, units), np.float32), name="layer")
    with GradientWriter(run_dir) as writer:
        for step in range(steps):
            g = np.full((4, units), size, np.float32)
            g[:, list(silent(step))] = 0.0
            writer.write([tf.constant(g)], [kernel], step)
            kernel.assign(kernel * 1.0001)
    s, ctx, eid = store.local_store(run_dir.parent)
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, run_dir.name), "stats", "layer")
    found = {}
    for f in diagnose.find("r", matrix):
        found.setdefault(f.kind, []).append(f)
    return found


def test_units_idle_from_the_start_are_information_not_a_warning(tmp_path):
    """A stable share without gradient from step 0 is a property of healthy ReLU networks: shown, never a problem."""
    (f,) = _findings_of_units(tmp_path / "r", lambda step: range(3))["dead"]  # 3 of 8 units, always
    assert f.severity == "info" and f.evidence["layer"]["state"] == "idle"
    assert f.steps == [0, 79] and "Idle units" in f.message and "not a problem" in f.message


def test_units_that_were_alive_and_stopped_are_dying_a_warning_from_where_they_stopped(tmp_path):
    (f,) = _findings_of_units(tmp_path / "r", lambda step: range(6) if step >= 30 else range(1))["dead"]
    evidence = f.evidence["layer"]
    assert f.severity == "warning" and evidence["state"] == "dying"
    assert evidence["start_dead_unit_fraction"] == 1 / 8 and evidence["median_dead_unit_fraction"] == 6 / 8
    # Sure once a whole window (20 writes) of it has passed; it started at 30.
    assert evidence["first_step"] == 30 and evidence["confirmed_at_step"] == 49 and f.steps == [30, 79]
    assert "up from 12% in the first writes" in f.message


def test_a_small_rise_of_the_idle_share_is_drift_not_dying(tmp_path):
    """1 of 8 idle at the start, 3 later: a quarter of the live units, under dying_share (0.4)."""
    (f,) = _findings_of_units(tmp_path / "r", lambda step: range(3) if step >= 30 else range(1))["dead"]
    assert f.severity == "info" and f.evidence["layer"]["state"] == "idle"


def test_a_dead_phase_that_recovered_is_information(tmp_path):
    found = _findings_of_units(tmp_path / "r", lambda step: range(6) if 10 <= step < 40 else ())
    (f,) = found["dead"]
    assert f.severity == "info" and f.evidence["layer"]["state"] == "recovered"
    assert f.steps == [10, 39] and f.evidence["layer"]["latest_dead_unit_fraction"] == 0.0
    # A phase too small to be dying (3 of 8 units, from a live start) is over too.
    (f,) = _findings_of_units(tmp_path / "r3", lambda step: range(3) if 10 <= step < 40 else ())["dead"]
    assert f.severity == "info" and f.evidence["layer"]["state"] == "recovered" and f.steps == [10, 39]
    assert "recovered" in f.message and "idle from the start" not in f.message
    # The same phase still going at the latest write is a warning.
    (f,) = _findings_of_units(tmp_path / "r2", lambda step: range(6) if step >= 10 else (), steps=40)["dead"]
    assert f.severity == "warning" and f.evidence["layer"]["state"] == "dying"


def test_an_almost_silent_layer_is_a_warning_whatever_it_had_at_the_start(tmp_path):
    """Silent from step 0 (a bias far below every pre-activation): no rise, but (almost) no gradient passes."""
    # 15 of 16 units silent, every one of them on every other batch.
    (f,) = _findings_of_units(tmp_path / "r", lambda step: range(16) if step % 2 else range(15), units=16)["dead"]
    assert f.severity == "warning" and f.evidence["layer"]["state"] == "silent" and f.steps[0] == 0
    assert f.message.startswith("Dead units in")  # one unit passed some gradient: units, not the whole path


def test_a_layer_no_gradient_passes_is_worded_for_either_cause(tmp_path):
    """Every unit without gradient at every write: dead ReLUs, or a path after the layer that multiplies by 0."""
    (f,) = _findings_of_units(tmp_path / "r", lambda step: range(16), units=16)["dead"]
    assert f.severity == "warning" and f.evidence["layer"]["state"] == "silent"
    assert f.message.startswith("No gradient through") and "multiplies the gradient by 0" in f.message


def test_an_explosion_from_the_first_step_is_found_without_a_past(tmp_path):
    """No rise to see: the gradient is 2e3 times the weights from step 0 (a step at lr 1e-3 moves them twice their size)."""
    found = _findings_of_layers(tmp_path / "r", [(4e3, 4e3)] * 30)
    f = found["exploding"]
    assert f.severity == "error" and f.steps[0] == 0 and f.layers == ["first", "last"]
    assert f.evidence["first"]["max_grad_to_weight"] == pytest.approx(2e3, rel=1e-6)
    assert (
        f.evidence["first"]["reason"] == "too large for its weights" and f.evidence["first"]["outcome"] == "sustained"
    )
    assert "times its weights' norm" in f.message
    assert "exploding" not in _findings_of_layers(tmp_path / "r2", [(4e1, 4e1)] * 30)  # 20 times: training


def test_one_layer_with_tiny_weights_is_no_explosion_when_the_network_is_not(tmp_path):
    """A LayerScale at 1e-6, a layer leaving zero: its own ratio is huge, the network's is not."""
    found = _findings_of_layers(tmp_path / "r", [(1.0, 1.0)] * 30, weights=1e-5)
    assert "exploding" not in found


def test_a_zero_initialised_layer_is_left_out_of_the_ratio(tmp_path):
    """Weights that start at exactly 0 and grow: their ratio says how far they came from zero, not how large the gradient is."""
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    var = tf.Variable(np.zeros(4, np.float32), name="head")
    with GradientWriter(tmp_path / "r") as writer:
        for step in range(30):
            writer.write([tf.fill([4], 0.5)], [var], step)
            var.assign_add(tf.fill([4], 1e-5))  # an Adam step at lr 1e-5 from zero
    s, ctx, eid = store.local_store(tmp_path)
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, "r"), "stats", "layer")
    assert [f.kind for f in diagnose.find("r", matrix)] == []


def test_what_follows_from_an_explosion_is_attached_to_it_not_listed(tmp_path):
    """One cause, one finding: the units without gradient in the exploding layer are its consequence."""
    found = _findings_of_units(tmp_path / "r", lambda step: range(7), size=1e4, steps=30)
    assert set(found) == {"exploding"}
    (f,) = found["exploding"]
    # 7 of 8 units without gradient at every write: most of the layer, a warning, attached all the same.
    assert f.severity == "error" and [(c.kind, c.severity, c.layers) for c in f.consequences] == [
        ("dead", "warning", ["layer"])
    ]
    assert "It explains what followed: dead units in \u2068layer\u2069 (steps 0-29)." in f.message
    assert f.to_dict()["consequences"][0]["evidence"]["layer"]["state"] == "mostly_dead"
