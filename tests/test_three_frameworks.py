"""A JAX, a PyTorch and a TensorFlow run of the same weights and batches: the same rows, to float32 tolerance, in one logdir.

One network, Dense + ReLU, LayerNormalization, Dense + ReLU, Dense, trained
with SGD in each framework from the same weights on the same batches, each
written by its own writer (``tb_gradcheck.GradientWriter``,
``tb_gradcheck.torch.GradientWriter``, ``tb_gradcheck.jax.monitor`` and its
``GradientWriter``) into one logdir. Read back through TensorBoard's data
providers and the plugin's routes, as the tab reads them: ``align`` sets each
run's rows against the others' by structure (the names differ: Keras
``gamma``, PyTorch ``weight``; PyTorch's Linear weight is the Keras kernel
transposed), and every statistic the runs share is held equal, row by
aligned row and step by step; ``compare`` sets them side by side, and the
findings are the same for all three.
"""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import tb_gradcheck.jax as tj
from conftest import get_json
from conftest import make_app
from conftest import stats_content
from conftest import wait_for_steps
from tests.jax.test_frameworks import nest

STEPS = 4
LR = 0.05
WIDTHS = (8, 16, 16, 1)
EPSILON = 1e-3  # Keras LayerNormalization's; PyTorch's is given the same
# Three float32 implementations of one forward and backward pass (oneDNN,
# PyTorch's CPU kernels, XLA's) sum in different orders: float32 rounding,
# ~1e-7 relative per operation, compounded over a few layers and SGD steps.
RTOL = 2e-5
ATOL = 1e-7
RUNS = ("tensorflow", "torch", "jax")
torch.set_num_threads(1)  # tiny models: a shared 2-core machine runs one thread faster


def keras_model():
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.Input((WIDTHS[0],))]
    for i, width in enumerate(WIDTHS[1:]):
        last = i == len(WIDTHS) - 2
        layers.append(tf.keras.layers.Dense(width, activation=None if last else "relu", name=f"dense_{i}"))
        if i == 0:
            layers.append(tf.keras.layers.LayerNormalization(epsilon=EPSILON, name="norm"))
    model = tf.keras.Sequential(layers, name="mlp")
    # Three units of dense_1 off on every example: dead units, the same in every framework.
    bias = model.get_layer("dense_1").bias
    bias.assign(np.where(np.arange(WIDTHS[2]) < 3, -100.0, 0.0).astype(np.float32))
    return model


def tensorflow_run(logdir, model, x, y):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    optimizer = tf.keras.optimizers.SGD(LR)
    variables = model.trainable_variables
    with GradientWriter(str(logdir)) as writer:
        for step in range(STEPS):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x[step]) - y[step]))
            grads = tape.gradient(loss, variables)
            with writer.applying(variables, step) as update:
                optimizer.apply_gradients(zip(grads, variables))
            writer.write(grads, variables, step, update=update)


def torch_run(logdir, model, x, y):
    from tb_gradcheck.torch import GradientWriter

    modules = collections.OrderedDict()
    for i, width in enumerate(WIDTHS[1:]):
        modules[f"dense_{i}"] = torch.nn.Linear(WIDTHS[i], width)
        if i < len(WIDTHS) - 2:
            modules[f"relu_{i}"] = torch.nn.ReLU()
        if i == 0:
            modules["norm"] = torch.nn.LayerNorm(width, eps=EPSILON)
    net = torch.nn.Sequential(modules)
    with torch.no_grad():
        for name, module in net.named_children():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
                first, second = model.get_layer(name).get_weights()
                module.weight.copy_(torch.from_numpy(first.T.copy() if first.ndim == 2 else first))
                module.bias.copy_(torch.from_numpy(second))
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    with GradientWriter(logdir, net, optimizer=optimizer) as writer:
        for step in range(STEPS):
            optimizer.zero_grad()
            torch.mean((net(torch.from_numpy(x[step])) - torch.from_numpy(y[step])) ** 2).backward()
            writer.write(step)
            optimizer.step()


def jax_run(logdir, model, x, y):
    variables = model.trainable_variables
    params = nest([v.path for v in variables], [v.numpy() for v in variables])
    net = params["mlp"]

    def forward(p, inputs):
        p = p["mlp"]
        h = jax.nn.relu(inputs @ p["dense_0"]["kernel"] + p["dense_0"]["bias"])
        mean = h.mean(-1, keepdims=True)
        h = (h - mean) / jnp.sqrt(((h - mean) ** 2).mean(-1, keepdims=True) + EPSILON)
        h = h * p["norm"]["gamma"] + p["norm"]["beta"]
        h = jax.nn.relu(h @ p["dense_1"]["kernel"] + p["dense_1"]["bias"])
        return h @ p["dense_2"]["kernel"] + p["dense_2"]["bias"]

    assert sorted(net) == ["dense_0", "dense_1", "dense_2", "norm"]
    # Rows in the order the forward pass reads them: "norm" sorts last by name.
    tx = tj.monitor(optax.sgd(LR), order=tj.depth_order(forward, params, x[0]))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, inputs, targets):
        grads = jax.grad(lambda p: jnp.mean((forward(p, inputs) - targets) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    with tj.GradientWriter(logdir) as writer:
        for s in range(STEPS):
            params, opt_state = step(params, opt_state, x[s], y[s])
            writer.write(opt_state, s)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("three")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, 32, WIDTHS[0])).astype(np.float32)
    y = rng.normal(size=(STEPS, 32, 1)).astype(np.float32)
    model = keras_model()
    # The torch and JAX runs start from the weights before TensorFlow's steps move them.
    torch_run(root / "torch", model, x, y)
    jax_run(root / "jax", model, x, y)
    tensorflow_run(root / "tensorflow", model, x, y)
    return root


@pytest.mark.parametrize("data_path", ["python", "rust"])
def test_three_frameworks_give_the_same_rows_and_numbers_through_both_loaders(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    for run in RUNS:
        wait_for_steps(client, run, STEPS)
    columns = [stats_content(logdir / run)["columns"] for run in RUNS]
    shared = [c for c in columns[0] if all(c in other for other in columns[1:])]
    assert {"grad_norm", "grad_max_abs", "dead_unit_fraction", "weight_norm", "update_norm"} <= set(shared)
    for granularity in ("layer", "variable"):
        heat = {
            (run, metric): get_json(
                client, f"/data/plugin/gradients/heatmap?run={run}&metric={metric}&granularity={granularity}"
            )
            for run in RUNS
            for metric in shared
        }
        for run, other in itertools.combinations(RUNS, 2):
            url = f"/data/plugin/gradients/align?run={run}&other={other}&granularity={granularity}&align=structure"
            aligned = get_json(client, url)
            assert aligned["alignment"] == "structure"
            assert aligned["matched"] == (4 if granularity == "layer" else 8), aligned
            assert not aligned["only_in_run"] and not aligned["only_in_other"]
            for metric in shared:
                a, b = heat[run, metric], heat[other, metric]
                assert a["steps"] == b["steps"] == list(range(STEPS))
                rows_a = [a["layers"].index(n) for n in aligned["run_layers"]]
                rows_b = [b["layers"].index(n) for n in aligned["other_layers"]]
                np.testing.assert_allclose(  # values: [step][row]
                    np.array(a["values"], float)[:, rows_a],
                    np.array(b["values"], float)[:, rows_b],
                    rtol=RTOL,
                    atol=ATOL,
                    err_msg=f"{run} vs {other}, {granularity} {metric}",
                )
    dead = get_json(client, "/data/plugin/gradients/heatmap?run=jax&metric=dead_unit_fraction&granularity=layer")
    assert dead["layers"] == ["mlp/dense_0", "mlp/norm", "mlp/dense_1", "mlp/dense_2"]
    assert min(np.array(dead["values"])[:, 2]) >= 3 / 16  # the three planted units of dense_1, in every run alike


def test_compare_sets_the_pytorch_and_jax_runs_against_the_tensorflow_run(logdir):
    client, _ = make_app(logdir, "python")
    for run in RUNS:
        wait_for_steps(client, run, STEPS)
    for run in ("torch", "jax"):
        url = f"/data/plugin/gradients/compare?run={run}&other=tensorflow&metric=grad_norm&align=structure"
        body = get_json(client, url)
        assert body["other_layers"] == ["mlp/dense_0", "mlp/norm", "mlp/dense_1", "mlp/dense_2"], run
        assert not body["only_in_run"] and not body["only_in_other"]
        np.testing.assert_allclose(np.array(body["values"], float), 1.0, rtol=RTOL, err_msg=run)


def test_findings_are_the_same_for_every_framework(logdir):
    client, _ = make_app(logdir, "python")
    for run in RUNS:
        wait_for_steps(client, run, STEPS)

    def found(run):
        body = get_json(client, f"/data/plugin/gradients/findings?run={run}")["findings"]
        # Keras and JAX paths start at the model's name, PyTorch's below it.
        return [(f["kind"], f["severity"], [n.removeprefix("mlp/") for n in f["layers"]], f["steps"]) for f in body]

    assert found("tensorflow") == found("torch") == found("jax")
