"""Compare by structure through the real stack: Keras models written by GradientWriter, read by TensorBoard.

Every model here is built in this one process, as a notebook comparing two
initialisations builds them, so Keras numbers their layers apart
(``sequential/dense`` and ``sequential_1/dense_4``). Both of TensorBoard's
data paths (the Python multiplexer and the Rust data server) serve them
through the plugin's real WSGI app. The tab in Chromium: test_browser_compare.py.
"""

import numpy as np
import pytest

from conftest import get_json
from conftest import make_app
from conftest import stats_content
from conftest import wait_for_steps
from rawlogs import stats_points
from rawlogs import write_raw
from tb_gradcheck.core import metadata

API = "/data/plugin/gradients/"
STEPS = 4
RUNS = ("twin_a", "twin_b", "inserted", "functional", "subclassed", "wide", "narrow")


def sequential(extra=False):
    """Dense, LayerNormalization, Dense, Dense, Dense; ``extra``: one more Dense(8) before the last two."""
    import tensorflow as tf

    layers = [tf.keras.Input((4,)), tf.keras.layers.Dense(8), tf.keras.layers.LayerNormalization()]
    layers += [tf.keras.layers.Dense(8) for _ in range(1 + extra)]
    return tf.keras.Sequential(layers + [tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])


def functional_and_subclassed():
    import tensorflow as tf

    inputs = tf.keras.Input((4,))
    functional = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Dense(8)(inputs)))

    class Twin(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = tf.keras.layers.Dense(8)
            self.out = tf.keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

    subclassed = Twin()
    subclassed(tf.zeros([1, 4]))
    return functional, subclassed


def named_sweep(width):
    """Two Dense layers named d0 and d1 of a model named net: the same names at any width."""
    import tensorflow as tf

    layers = [tf.keras.Input((4,)), tf.keras.layers.Dense(width, name="d0"), tf.keras.layers.Dense(1, name="d1")]
    return tf.keras.Sequential(layers, name="net")


def train(model, run_dir):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    x = tf.random.normal([16, 4], seed=1)
    with GradientWriter(str(run_dir)) as writer:
        for step in range(STEPS):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            writer.write(grads, model.trainable_variables, step)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    import tensorflow as tf

    tf.keras.backend.clear_session()  # Keras' layer numbering starts over, as in a fresh notebook
    tf.keras.utils.set_random_seed(3)
    root = tmp_path_factory.mktemp("compare")
    models = [sequential(), sequential(), sequential(extra=True), *functional_and_subclassed()]
    models += [named_sweep(16), named_sweep(8)]
    for run, model in zip(RUNS, models):
        train(model, root / run)
    # twin_a's model as a log written before layouts stored shapes: sizes only.
    content = stats_content(root / "twin_a")
    layer, variable = ({k: v for k, v in content[g].items() if k != "shapes"} for g in metadata.GRANULARITIES)
    old = metadata.stats_layout(layer, variable, ["last"], 1)
    old["layer"]["rows"] = [n.replace("sequential/", "legacy/") for n in old["layer"]["rows"]]
    old["variable"]["rows"] = [n.replace("sequential/", "legacy/") for n in old["variable"]["rows"]]
    write_raw(root / "legacy", stats_points(5, range(STEPS), value=2.0, n_variables=10), content=old)
    return root


@pytest.fixture(scope="module", params=["python", "rust"])
def client(request, logdir):
    c, _ = make_app(logdir, request.param)
    for run in RUNS + ("legacy",):
        wait_for_steps(c, run, STEPS)
    return c


def rows(client, run, granularity="layer"):
    runs = {e["run"]: e for e in get_json(client, API + "runs")["runs"]}
    return runs[run]["granularities"][granularity]["rows"]


def aligned(client, run, other, align="auto", granularity="layer"):
    return get_json(client, API + f"align?run={run}&other={other}&granularity={granularity}&align={align}")


def test_layouts_store_every_rows_variable_shapes(logdir):
    content = stats_content(logdir / "twin_a")
    assert content["layer"]["shapes"] == [[[4, 8], [8]], [[8], [8]], [[8, 8], [8]], [[8, 8], [8]], [[8, 1], [1]]]
    assert content["variable"]["shapes"][:3] == [[[4, 8]], [[8]], [[8]]]
    assert metadata.parse(metadata.encode(content)) == content


def test_sequential_twins_built_in_one_process_align_row_by_row(client):
    a, b = rows(client, "twin_a"), rows(client, "twin_b")
    assert a[0] == "sequential/dense" and b[0] == "sequential_1/dense_4"  # Keras numbered every layer
    by_name = get_json(client, API + "compare?run=twin_a&other=twin_b&metric=grad_norm")
    assert (by_name["alignment"], by_name["matched"], by_name["only_in_other"]) == ("name", 0, b)
    body = get_json(client, API + "compare?run=twin_a&other=twin_b&metric=grad_norm&align=structure")
    assert (body["alignment"], body["basis"], body["matched"]) == ("structure", "shapes", 5)
    assert body["layers"] == body["run_layers"] == a and body["other_layers"] == b
    assert body["only_in_run"] == body["only_in_other"] == []
    # The ratio divides each row by its partner, at every step.
    ha = get_json(client, API + "heatmap?run=twin_a&metric=grad_norm")
    hb = get_json(client, API + "heatmap?run=twin_b&metric=grad_norm")
    np.testing.assert_allclose(
        np.array(body["values"]), np.array(ha["values"], np.float64) / np.array(hb["values"], np.float64), rtol=1e-12
    )
    # Unless told, the tab's route picks structure here, and says so.
    auto = aligned(client, "twin_a", "twin_b")
    assert (auto["alignment"], auto["matched"], auto["other_layers"]) == ("structure", 5, b)


def test_variable_rows_align_inside_their_aligned_layers(client):
    a, b = rows(client, "twin_a", "variable"), rows(client, "twin_b", "variable")
    body = aligned(client, "twin_a", "twin_b", "structure", "variable")
    assert body["matched"] == 10 and body["run_layers"] == a and body["other_layers"] == b
    assert ("sequential/layer_normalization/gamma", "sequential_1/layer_normalization_1/gamma") in zip(a, b)
    ratio = get_json(client, API + "compare?run=twin_a&other=twin_b&metric=grad_norm&granularity=variable&align=auto")
    assert ratio["alignment"] == "structure" and ratio["other_layers"] == b


def test_one_inserted_layer_is_only_in_its_run_and_the_rest_stays_paired(client):
    a, b = rows(client, "twin_a"), rows(client, "inserted")
    assert len(b) == len(a) + 1
    body = get_json(client, API + "compare?run=twin_a&other=inserted&metric=grad_norm&align=auto&encoding=f32")
    assert (body["alignment"], body["matched"]) == ("structure", 5)
    (only,) = body["only_in_other"]
    # The extra Dense(8) sits among the three 8 x 8 layers, at its depth, not appended after the output layer.
    at = body["layers"].index(only)
    assert 2 <= at <= 4 and body["run_layers"][at] is None
    assert body["other_layers"][:2] == b[:2] and body["other_layers"][-1] == b[-1]
    assert body["run_layers"][-1] == a[-1] and body["layers"][-1] == a[-1]
    missing = np.unpackbits(np.frombuffer(__import__("base64").b64decode(body["missing_bits"]), np.uint8))
    missing = missing[: STEPS * 6].reshape(STEPS, 6)
    assert missing[:, at].all() and not np.delete(missing, at, axis=1).any()


def test_a_functional_model_aligns_with_its_subclassed_twin(client):
    a, b = rows(client, "functional"), rows(client, "subclassed")
    assert not set(a) & set(b)  # a functional model's variables have no root scope, the subclassed one's do
    body = aligned(client, "functional", "subclassed")
    assert (body["alignment"], body["matched"], body["other_layers"]) == ("structure", 2, b)
    variables = aligned(client, "functional", "subclassed", "structure", "variable")
    assert variables["matched"] == 4
    assert [x.rsplit("/", 1)[1] for x in variables["run_layers"]] == ["kernel", "bias", "kernel", "bias"]
    assert [x.rsplit("/", 1)[1] for x in variables["other_layers"]] == ["kernel", "bias", "kernel", "bias"]


def test_a_width_sweep_keeps_its_names_and_auto_aligns_by_name(client):
    # Same names, other shapes: by structure nothing pairs, by name everything does.
    assert aligned(client, "wide", "narrow", "structure")["matched"] == 0
    body = aligned(client, "wide", "narrow")
    assert (body["alignment"], body["matched"]) == ("name", 2)
    # One model against itself: names agree, nothing to explain.
    assert aligned(client, "twin_a", "twin_a")["alignment"] == "name"


def test_logs_without_shapes_still_align_by_sizes(client):
    body = aligned(client, "legacy", "twin_b")
    assert (body["alignment"], body["basis"], body["matched"]) == ("structure", "sizes", 5)
    assert body["other_layers"] == rows(client, "twin_b")


def test_align_route_errors(client):
    assert client.get(API + "align?run=twin_a&other=nope").status_code == 404
    assert client.get(API + "align?run=twin_a&other=twin_b&metric=check_error").status_code == 404  # no checks
    assert client.get(API + "align?run=twin_a").status_code == 400
    assert client.get(API + "align?run=twin_a&other=twin_b&align=diagonal").status_code == 400
    assert client.get(API + "compare?run=twin_a&other=twin_b&metric=grad_norm&align=sideways").status_code == 400


def layout(shapes):
    rows = {"rows": ["m/a", "m/b"], "sizes": [6, 2]}
    return metadata.stats_layout({**rows, "shapes": shapes}, rows, ["last"], 1)


@pytest.mark.parametrize(
    "shapes",
    [
        [[[2, 3]]],  # one row short
        [[[2, 3]], [[-1]]],  # a negative dimension
        [[[2, 3]], [[True]]],  # a bool is no dimension
        [[[2, 3]], [2]],  # a shape that is not a list
        [[[2, 3]], "2"],
        {"m/a": [[2, 3]]},
        [[[2, 3]], [[2.0]]],
    ],
)
def test_parse_refuses_shapes_that_are_not_one_list_of_shapes_per_row(shapes):
    content = layout([[[2, 3]], [[2]]])
    content["layer"]["shapes"] = shapes
    with pytest.raises(metadata.ContentError, match="layer shapes must be one list of shapes"):
        metadata.parse(metadata.encode(content))


def test_shapes_are_optional_and_a_layout_without_them_keeps_its_bytes():
    with_shapes = layout([[[2, 3]], [[2], []]])
    assert metadata.parse(metadata.encode(with_shapes))["layer"]["shapes"] == [[[2, 3]], [[2], []]]
    without = layout(None)
    assert "shapes" not in without["layer"] and "shapes" not in without["variable"]
    # The bytes (and so the tag) of a layout written before shapes existed.
    assert metadata.encode(without["layer"]) == b'{"rows":["m/a","m/b"],"sizes":[6,2],"sparse_rows":[]}'
    assert metadata.parse(metadata.encode(without)) == without
