"""A TensorFlow run and a PyTorch run of the same network, weights and data: the same rows and numbers in one logdir.

Keras ``Dense`` kernels are ``[in, out]`` and ``nn.Linear`` weights
``[out, in]``: the torch model gets the transposed kernels, so both compute
the same function, the same gradients (transposed) and, by every
statistic's definition (units: one per output), the same rows. Read back
through TensorBoard's two loaders and the plugin's routes, as a user sees
them, and set against each other by ``compare``.
"""

import collections

import numpy as np
import pytest
import torch

from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps

STEPS = 6
# Two float32 implementations of the same forward and backward pass (oneDNN
# and PyTorch's CPU kernels) sum in different orders: float32 rounding,
# ~1e-7 relative per operation, compounded over a few layers and SGD steps.
RTOL = 2e-5
METRICS = ("grad_norm", "grad_max_abs", "grad_zero_fraction", "dead_unit_fraction", "weight_norm", "update_norm")
WIDTHS = (8, 16, 16, 1)
# One intra-op thread: these models are tiny, and on a shared 2-core machine PyTorch's thread pool made
# each step tens of times slower than one thread.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter as TFWriter
    from tb_gradcheck.torch import GradientWriter as TorchWriter

    root = tmp_path_factory.mktemp("both")
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, 32, WIDTHS[0])).astype(np.float32)
    y = rng.normal(size=(STEPS, 32, 1)).astype(np.float32)
    layers = [tf.keras.Input((WIDTHS[0],))]
    for i, width in enumerate(WIDTHS[1:]):
        last = i == len(WIDTHS) - 2
        layers.append(tf.keras.layers.Dense(width, activation=None if last else "relu", name=f"dense_{i}"))
    keras_model = tf.keras.Sequential(layers, name="mlp")
    # A bias that keeps three units of dense_1 off on every example: dead units, the same in both.
    bias = keras_model.get_layer("dense_1").bias
    bias.assign(np.where(np.arange(16) < 3, -100.0, 0.0).astype(np.float32))

    modules = collections.OrderedDict()
    for i, width in enumerate(WIDTHS[1:]):
        modules[f"dense_{i}"] = torch.nn.Linear(WIDTHS[i], width)
        if i < len(WIDTHS) - 2:
            modules[f"relu_{i}"] = torch.nn.ReLU()
    torch_model = torch.nn.Sequential(modules)
    with torch.no_grad():
        for i in range(len(WIDTHS) - 1):
            kernel, b = keras_model.get_layer(f"dense_{i}").get_weights()
            torch_model.get_submodule(f"dense_{i}").weight.copy_(torch.from_numpy(kernel.T.copy()))
            torch_model.get_submodule(f"dense_{i}").bias.copy_(torch.from_numpy(b))

    tf_optimizer = tf.keras.optimizers.SGD(0.05)
    variables = keras_model.trainable_variables
    with TFWriter(str(root / "keras")) as writer:
        for step in range(STEPS):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(keras_model(x[step]) - y[step]))
            grads = tape.gradient(loss, variables)
            with writer.applying(variables, step) as update:
                tf_optimizer.apply_gradients(zip(grads, variables))
            writer.write(grads, variables, step, update=update)

    torch_optimizer = torch.optim.SGD(torch_model.parameters(), lr=0.05)
    with TorchWriter(root / "torch", torch_model, optimizer=torch_optimizer) as writer:
        for step in range(STEPS):
            torch_optimizer.zero_grad()
            loss = torch.mean((torch_model(torch.from_numpy(x[step])) - torch.from_numpy(y[step])) ** 2)
            loss.backward()
            writer.write(step)
            torch_optimizer.step()
    return root


@pytest.mark.parametrize("data_path", ["python", "rust"])
def test_same_network_gives_the_same_rows_and_numbers_through_both_loaders(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    for run in ("keras", "torch"):
        wait_for_steps(client, run, STEPS)
    for granularity in ("layer", "variable"):
        for metric in METRICS:
            url = f"/data/plugin/gradients/heatmap?metric={metric}&granularity={granularity}&run="
            a, b = get_json(client, url + "keras"), get_json(client, url + "torch")
            assert len(a["layers"]) == len(b["layers"]) == (3 if granularity == "layer" else 6)
            assert a["steps"] == b["steps"] == list(range(STEPS))
            np.testing.assert_allclose(
                np.array(b["values"], float), np.array(a["values"], float), rtol=RTOL, atol=1e-7, err_msg=metric
            )
    layers = get_json(client, "/data/plugin/gradients/heatmap?metric=dead_unit_fraction&run=torch")
    assert layers["layers"] == ["dense_0", "dense_1", "dense_2"]
    assert layers["values"][0][1] >= 3 / 16  # the three planted units, and any the data leaves off


def test_compare_aligns_the_tensorflow_and_the_pytorch_run(logdir):
    client, _ = make_app(logdir, "python")
    for run in ("keras", "torch"):
        wait_for_steps(client, run, STEPS)
    body = get_json(client, "/data/plugin/gradients/compare?run=torch&other=keras&metric=grad_norm&align=structure")
    assert body["other_layers"] == ["mlp/dense_0", "mlp/dense_1", "mlp/dense_2"]
    assert not body["only_in_run"] and not body["only_in_other"]
    np.testing.assert_allclose(np.array(body["values"], float), 1.0, rtol=RTOL)


def test_findings_are_the_same_for_both_runs(logdir):
    client, _ = make_app(logdir, "python")

    def found(run, prefix=""):
        body = get_json(client, f"/data/plugin/gradients/findings?run={run}")["findings"]
        return [(f["kind"], f["severity"], [name[len(prefix) :] for name in f["layers"]], f["steps"]) for f in body]

    assert found("keras", "mlp/") == found("torch")
