"""Scenarios for the optimizer findings (tb_gradcheck.optimizer_findings): real fits, read back through TensorBoard."""

import keras
import numpy as np
import pytest

from tb_gradcheck import queries
from tb_gradcheck import store
from tb_gradcheck.keras import GradientCallback

STEPS = 10


def fit(logdir, optimizer, first_scale=1.0, init_std=0.05, input_scale=1.0):
    """A 3-16-16-1 MLP fit for STEPS full-batch steps; returns its findings.

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
    model.fit(x, y, batch_size=32, epochs=STEPS, verbose=0, callbacks=[GradientCallback(logdir)])
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
    stuck = found["not_learning"]
    assert stuck.layers == ["net/first"] and stuck.metric == "update_to_weight"
    assert stuck.evidence["net/first"]["median_update_to_weight"] < 1e-7


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_healthy_layers_are_learning(tmp_path, optimizer):
    opt = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam(1e-3)
    assert "not_learning" not in kinds(fit(tmp_path, opt))
