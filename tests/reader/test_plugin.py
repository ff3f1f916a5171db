"""The plugin through TensorBoard's real WSGI app, over both data paths (Python multiplexer, Rust server)."""

import json

import numpy as np
import pytest

from conftest import get_json
from conftest import make_app
from conftest import synthetic_run
from conftest import wait_for_steps

STEPS = 2500  # TensorBoard's defaults for an unknown plugin keep 10 (Python) or 100 (Rust)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logs")
    sizes, scale = synthetic_run(logdir / "long", STEPS)
    return logdir, sizes, scale


def test_every_step_comes_back_with_exact_values(long_run, data_path):
    logdir, sizes, scale = long_run
    client, _ = make_app(logdir, data_path)
    entry = wait_for_steps(client, "long", STEPS)
    assert entry["granularities"]["layer"]["rows"] == ["net/dense", "net/dense_1", "net/dense_2"]
    assert entry["total_steps"] == STEPS and entry["sampled"] is False

    body = get_json(client, "/data/plugin/gradients/heatmap?run=long&metric=grad_norm")
    assert body["steps"] == list(range(STEPS))
    values = np.array(body["values"], dtype=np.float64)
    expected = np.array([[np.sqrt(sizes[j]) * scale(j, s) for j in range(3)] for s in range(STEPS)])
    np.testing.assert_allclose(values, expected, rtol=1e-6)  # float32 storage

    body = get_json(client, "/data/plugin/gradients/heatmap?run=long&metric=grad_max_abs&granularity=variable")
    assert body["layers"] == [
        "net/dense/kernel",
        "net/dense/bias",
        "net/dense_1/kernel",
        "net/dense_1/bias",
        "net/dense_2/kernel",
        "net/dense_2/bias",
    ]
    assert body["values"][9] == pytest.approx([10.0, 10.0, 1.0, 1.0, 0.1, 0.1], rel=1e-6)


def test_users_samples_flag_wins_and_runs_says_n_of_m(long_run, data_path):
    logdir, _, _ = long_run
    client, _ = make_app(logdir, data_path, ["--samples_per_plugin", "gradients=50"])
    entry = wait_for_steps(client, "long", 50)
    assert entry["granularities"]["layer"]["num_steps"] == 50
    assert entry["total_steps"] == STEPS and entry["sampled"] is True
    body = get_json(client, "/runs".join(["/data/plugin/gradients", ""]))
    assert body["samples_per_plugin"] == 50
    heat = get_json(client, "/data/plugin/gradients/heatmap?run=long&metric=grad_norm")
    assert len(heat["steps"]) == 50 and heat["steps"][-1] == STEPS - 1  # the last step is always kept
    assert heat["num_steps"] == 50 and heat["total_steps"] == STEPS


def test_width_bins_steps_and_keeps_a_single_spike(tmp_path, data_path):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    v = tf.Variable(np.ones(4, np.float32), name="w")
    with GradientWriter(tmp_path / "spiky") as writer:
        for step in range(1000):
            g = 1e3 if step == 637 else (np.nan if step == 901 else 1.0)
            writer.write([tf.fill([4], tf.constant(g, tf.float32))], [v], step)
    client, _ = make_app(tmp_path, data_path)
    wait_for_steps(client, "spiky", 1000)
    body = get_json(client, "/data/plugin/gradients/heatmap?run=spiky&metric=grad_max_abs&width=100")
    assert len(body["steps"]) == 100 and body["reduce"] == "max"
    assert body["steps"][0] == 0 and body["step_ends"][-1] == 999
    spike_bin = next(i for i, (a, b) in enumerate(zip(body["steps"], body["step_ends"])) if a <= 637 <= b)
    nan_bin = next(i for i, (a, b) in enumerate(zip(body["steps"], body["step_ends"])) if a <= 901 <= b)
    column = [row[0] for row in body["values"]]
    assert column[spike_bin] == 1e3 and column[nan_bin] == "NaN"
    assert all(c == 1.0 for i, c in enumerate(column) if i not in (spike_bin, nan_bin))
    mean = get_json(client, "/data/plugin/gradients/heatmap?run=spiky&metric=grad_max_abs&width=100&reduce=mean")
    assert [row[0] for row in mean["values"]][spike_bin] == pytest.approx((1e3 + 9) / 10)


def test_missing_gradient_is_null_and_nonfinite_is_a_string(tmp_path, data_path):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    a = tf.Variable([1.0, 1.0], name="a")
    b = tf.Variable([1.0], name="b")
    with GradientWriter(tmp_path / "r") as writer:
        writer.write([tf.constant([np.inf, 1.0]), None], [a, b], 0)
        writer.write([tf.constant([np.nan, 1.0]), tf.constant([2.0])], [a, b], 1)
    client, _ = make_app(tmp_path, data_path)
    wait_for_steps(client, "r", 2)
    body = get_json(client, "/data/plugin/gradients/heatmap?run=r&metric=grad_norm")
    assert body["layers"] == ["a", "b"]
    assert body["values"] == [["Infinity", None], ["NaN", 2.0]]
    count = get_json(client, "/data/plugin/gradients/heatmap?run=r&metric=grad_nonfinite")
    assert count["values"] == [[1.0, None], [1.0, 0.0]]


def test_changed_model_in_one_run_merges_rows_by_name(tmp_path, data_path):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    a = tf.Variable([1.0], name="a")
    b = tf.Variable([1.0], name="b")
    c = tf.Variable([1.0], name="c")
    with GradientWriter(tmp_path / "r") as writer:
        for step in range(3):
            writer.write([tf.constant([1.0]), tf.constant([2.0])], [a, b], step)
    with GradientWriter(tmp_path / "r") as writer:  # a different model, same run
        for step in range(3, 5):
            writer.write([tf.constant([3.0]), tf.constant([5.0])], [c, a], step)
    client, _ = make_app(tmp_path, data_path)
    entry = wait_for_steps(client, "r", 5)
    assert entry["granularities"]["layer"]["rows"] == ["a", "b", "c"]
    body = get_json(client, "/data/plugin/gradients/heatmap?run=r&metric=grad_norm")
    assert body["values"] == [[1.0, 2.0, None]] * 3 + [[5.0, None, 3.0]] * 2


def test_bad_parameters_answer_400_and_unknown_names_404(long_run, data_path):
    logdir, _, _ = long_run
    client, _ = make_app(logdir, data_path)
    wait_for_steps(client, "long", STEPS)
    base = "/data/plugin/gradients/heatmap"
    cases = {
        "": (400, "'run'"),
        "?run=long": (400, "'metric'"),
        "?run=nope&metric=grad_norm": (404, "'nope'"),
        "?run=long&metric=nope": (404, "'nope'"),
        "?run=long&metric=grad_norm&granularity=neuron": (400, "'neuron'"),
        "?run=long&metric=grad_norm&aggregate=max": (400, "'max'"),
        "?run=long&metric=grad_norm&width=0": (400, "0"),
        "?run=long&metric=grad_norm&width=ten": (400, "'ten'"),
        "?run=long&metric=grad_norm&width=100&reduce=median": (400, "'median'"),
        "?run=long&metric=check_error": (404, "'check_error'"),
    }
    for query, (status, fragment) in cases.items():
        text = get_json(client, base + query, status=status)
        assert fragment in text, (query, text)


def test_static_files_are_served_and_nothing_else(long_run):
    logdir, _, _ = long_run
    client, _ = make_app(logdir, "python")
    listing = get_json(client, "/data/plugins_listing")["gradients"]
    assert listing["enabled"] and listing["tab_name"] == "Gradients"
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/gradients/static/index.js"}
    response = client.get("/data/plugin/gradients/static/index.js")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/javascript")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert b"export function render" in response.data
    for name in ["../plugin.py", "..%2Fplugin.py", "%2e%2e/setup.py", "nope.js", "", "index.js/../../x"]:
        assert client.get("/data/plugin/gradients/static/" + name).status_code == 404, name


def test_empty_logdir_lists_no_runs(tmp_path, data_path):
    client, _ = make_app(tmp_path, data_path)
    assert get_json(client, "/data/plugin/gradients/runs")["runs"] == []
    assert json.loads(client.get("/data/plugins_listing").data)["gradients"]["enabled"]


def test_grad_to_weight_is_derived_and_missing_for_zero_weights(tmp_path, data_path):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    kernel = tf.Variable(np.full((2, 2), 0.5, np.float32), name="kernel")
    bias = tf.Variable(np.zeros(2, np.float32), name="bias")  # a fresh bias: ratio undefined
    with GradientWriter(tmp_path / "r") as writer:
        writer.write([tf.ones([2, 2]), tf.ones(2)], [kernel, bias], 0)
    client, _ = make_app(tmp_path, data_path)
    wait_for_steps(client, "r", 1)
    body = get_json(client, "/data/plugin/gradients/heatmap?run=r&metric=grad_to_weight")
    assert body["values"] == [[pytest.approx(2.0), None]]  # ||ones(2,2)|| / ||0.5 * ones(2,2)|| = 2 / 1


def test_f32_encoding_is_the_same_matrix_exactly(tmp_path, data_path):
    import base64

    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    a = tf.Variable([1.0, 1.0], name="a")
    b = tf.Variable([1.0], name="b")
    with GradientWriter(tmp_path / "r") as writer:
        writer.write([tf.constant([np.inf, 1.0]), None], [a, b], 0)
        writer.write([tf.constant([np.nan, 1.0]), tf.constant([0.1])], [a, b], 1)
        writer.write([tf.constant([3e-20, 0.0]), tf.constant([2.5])], [a, b], 2)
    client, _ = make_app(tmp_path, data_path)
    wait_for_steps(client, "r", 3)
    base = "/data/plugin/gradients/heatmap?run=r&metric=grad_norm"
    as_json = get_json(client, base)
    packed = get_json(client, base + "&encoding=f32")
    assert packed["values"] is None and packed["encoding"] == "f32" and as_json["encoding"] == "json"
    values = np.frombuffer(base64.b64decode(packed["values_f32"]), "<f4").reshape(3, 2)
    missing = np.unpackbits(np.frombuffer(base64.b64decode(packed["missing_bits"]), np.uint8))[:6].reshape(3, 2)
    decoded = [
        [None if m else ("NaN" if np.isnan(v) else "Infinity" if v == np.inf else float(v)) for v, m in zip(vr, mr)]
        for vr, mr in zip(values, missing)
    ]
    assert decoded == as_json["values"]
    assert values[1, 1] == np.float32(0.1) and values[2, 0] == np.float32(3e-20)
    assert get_json(client, base + "&encoding=png", 400)
