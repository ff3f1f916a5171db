"""Scenarios for the optimizer findings (tb_gradcheck.findings.optimizer): real fits, read back through TensorBoard."""

import keras
import numpy as np
import pytest

from tb_gradcheck.keras import GradientCallback
from tb_gradcheck.reader import queries
from tb_gradcheck.reader import store

STEPS = 10


def fit(logdir, optimizer, first_scale=1.0, init_std=0.05, input_scale=1.0, steps=STEPS):
    """A 3-16-16-1 MLP fit for ``steps`` full-batch steps; returns its findings.

    ``init_std`` and ``first_scale``: the first layer's initial weights and a
    fixed factor on its output. Large weights scaled back down keep the
    forward pass the same as a healthy net while the first layer's gradient
    shrinks by the factor and its weights grow by its inverse: its relative
    update falls by their product.
    """
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(32, 3)) * input_scale).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(16, name="first", kernel_initializer=keras.initializers.RandomNormal(stddev=init_std)),
            keras.layers.Rescaling(first_scale, name="scale"),
            keras.layers.Activation("tanh"),
            keras.layers.Dense(16, activation="tanh", name="middle"),
            keras.layers.Dense(1, name="last"),
        ],
        name="net",
    )
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=32, epochs=steps, verbose=0, callbacks=[GradientCallback(logdir)])
    st, ctx, eid = store.local_store(logdir)
    return queries.findings(st, ctx, eid, "train")


def kinds(findings):
    return {f.kind: f for f in findings}


def test_clipping_that_binds_names_the_layer_that_drove_the_norm(tmp_path):
    # Inputs of scale 100: the first layer's kernel gradient (x^T delta) is
    # about 100x the others', so it alone carries the global norm.
    found = kinds(fit(tmp_path, keras.optimizers.SGD(0.01, global_clipnorm=0.01), input_scale=100.0))
    clip = found["clipping"]
    assert clip.layers == ["net/first"] and clip.metric == "grad_norm_before_clip"
    assert "100% of steps" in clip.message
    assert clip.evidence["net/first"]["share_of_squared_norm"] > 0.5


def test_clipping_that_never_binds_is_no_finding(tmp_path):
    assert "clipping" not in kinds(fit(tmp_path, keras.optimizers.SGD(0.01, global_clipnorm=1e6), input_scale=100.0))


def test_layer_with_frozen_relative_update_is_not_learning(tmp_path):
    # First layer weights 1e4x larger, output scaled by 1e-4: same forward
    # pass, relative update 1e-8 of the healthy one's.
    found = kinds(fit(tmp_path, keras.optimizers.SGD(0.1), first_scale=1e-4, init_std=500.0))
    # One cause, one finding: its gradient is too small to move its weights
    # (vanishing), and that is why it does not learn.
    assert "not_learning" not in found
    (stuck,) = [c for c in found["vanishing"].consequences if c.kind == "not_learning"]
    assert stuck.layers == ["net/first"] and stuck.metric == "update_to_weight"
    assert stuck.evidence["net/first"]["median_update_to_weight"] < 1e-7


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_healthy_layers_are_learning(tmp_path, optimizer):
    opt = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam(1e-3)
    # 30 steps: long enough for the whole network's pace to be judged too.
    assert "not_learning" not in kinds(fit(tmp_path, opt, steps=30))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_learning_rate_too_small_for_every_layer_is_not_learning(tmp_path, optimizer):
    """Layers about equally slow (none lags the rest by 3 orders), most above the float32 floor: the network's pace.

    Adam at 1e-7 moves every layer 3e-7 to 2e-6 of its weights per step;
    SGD at 1e-6 moves them 7e-8 (under the floor: that layer's own reason)
    to 2e-6.
    """
    opt = keras.optimizers.SGD(1e-6) if optimizer == "sgd" else keras.optimizers.Adam(1e-7)
    stuck = kinds(fit(tmp_path, opt, steps=30))["not_learning"]
    assert stuck.layers == ["net/first", "net/middle", "net/last"]
    network = [e for e in stuck.evidence.values() if "the whole network" in e["reason"]]
    assert len(network) >= 2 and "a learning rate too small" in stuck.message
    for e in network:
        assert e["network_pace"] < 1e-6
        # Slow from the first write; sure once 20 writes have moved.
        assert e["first_step"] == 1 and e["confirmed_at_step"] == 20 and e["last_step"] == 30


def test_a_head_outside_the_loss_is_no_finding(tmp_path):
    """An output with no loss gets no gradient and no update: no gradient is no finding, with the update bracket too."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(16, activation="tanh", name="hidden")(inputs)
    model = keras.Model(
        inputs, [keras.layers.Dense(1, name="main")(hidden), keras.layers.Dense(4, name="aux")(hidden)], name="net"
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=["mse", None])
    with pytest.warns(UserWarning, match="Gradients do not exist for variables"):  # Keras' own, once
        model.fit(x, y, batch_size=32, epochs=30, verbose=0, callbacks=[GradientCallback(tmp_path)])
    st, ctx, eid = store.local_store(tmp_path)
    matrix = queries.matrix(st, ctx, eid, st.run(ctx, eid, "train"), "stats", "layer")
    update, missing = matrix.slab("update_to_weight", "last")
    aux = matrix.rows.index("aux")
    assert not missing[:, aux].any() and (update[:, aux] == 0).all()  # the bracket saw it not move
    assert queries.findings(st, ctx, eid, "train") == []


def mixed_precision_fit(logdir, policy, nan_labels_from=None, steps=40):
    """A mixed_float16 fit whose summed loss overflows float16 at the default starting scale (2**15).

    ``policy``: the ``policy`` fixture, which restores float32 afterwards.
    ``nan_labels_from``: from this batch on the labels are NaN, so every
    gradient is NaN whatever the scale: the model's own NaN, not an overflow.
    """
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64 * steps, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, 1))).astype(np.float32) * 30.0
    if nan_labels_from is not None:
        y[64 * (nan_labels_from - 1) :] = np.nan
    policy("mixed_float16")
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(1, name="out", dtype="float32"),
        ],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.MeanSquaredError(reduction="sum"))
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[GradientCallback(logdir)])
    st, ctx, eid = store.local_store(logdir)
    refused = queries.heatmap(st, ctx, eid, "train", "refused_steps", "layer")
    scale = queries.heatmap(st, ctx, eid, "train", "loss_scale", "layer")
    return queries.findings(st, ctx, eid, "train"), refused, scale


def test_steps_the_loss_scaler_refuses_while_it_finds_its_scale_are_no_finding(tmp_path, policy):
    found, refused, scale = mixed_precision_fit(tmp_path, policy)
    assert np.nansum(refused.values[:, 0]) >= 2  # the premise: overflows were refused ...
    assert np.nanmin(scale.values[:, 0]) >= 1  # ... and a scale above 1 cured them
    assert "non_finite" not in kinds(found), [f.message for f in found]


def test_a_nan_no_loss_scale_cures_is_an_error_from_its_first_refused_step(tmp_path, policy):
    # From batch 20, after the scaler settled (refusing steps 1-10 on the way).
    found, refused, scale = mixed_precision_fit(tmp_path, policy, nan_labels_from=20)
    assert (refused.values[19:, 0] == 1).all() and np.nanmin(scale.values[:, 0]) < 1  # refused until below 1
    nan = kinds(found)["non_finite"]
    assert nan.severity == "error" and nan.steps[0] == 20
    assert "not finite even unscaled" in nan.message


def test_a_dead_layer_is_reported_once_as_dead_not_again_as_not_learning(tmp_path):
    # Its units never fire (bias -10 against pre-activations of about 1), so
    # its update is exactly 0: one cause. A skip around it keeps the layers
    # after it learning.
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    keras.utils.set_random_seed(4)
    inputs = keras.Input((8,))
    first = keras.layers.Dense(16, activation="relu", name="first")(inputs)
    dead = keras.layers.Dense(16, activation="relu", bias_initializer=keras.initializers.Constant(-10.0), name="dead")
    joined = keras.layers.Concatenate()([first, dead(first)])
    model = keras.Model(inputs, keras.layers.Dense(1, name="last")(joined), name="net")
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(x, y, batch_size=64, epochs=30, verbose=0, callbacks=[GradientCallback(tmp_path)])
    st, ctx, eid = store.local_store(tmp_path)
    found = kinds(queries.findings(st, ctx, eid, "train"))
    assert found["dead"].layers == ["dead"]  # a functional model's layers are named plainly
    assert "not_learning" not in found or "dead" not in found["not_learning"].layers


def test_clipping_that_bound_only_early_is_information(tmp_path):
    # Premise (measured without clipping): the global norm falls from 1.56 to 0.34 by step 4 and stays
    # within 0.18-0.23 from step 8 on. A bound of 0.3 binds in the first five steps (12% of 40) and,
    # with a margin of 25%, in none of the latter half: an early transient, information
    # (finding.settle_ended, as for every kind).
    found = kinds(fit(tmp_path, keras.optimizers.SGD(0.05, global_clipnorm=0.3), input_scale=3.0, steps=40))
    clip = found["clipping"]
    evidence = next(iter(clip.evidence.values()))
    assert evidence["writes_after_it"] >= 20 and clip.severity == "info", clip.message
    assert evidence["run_steps_bound"] >= 4 and clip.steps[1] < 20
    assert "a phase that is over" in clip.message
