"""Parameters the loss has no gradient path to: MISSING rows from a ``depth_order`` of the loss, not a dead layer.

``jax.grad`` gives such a parameter zeros; TensorFlow and PyTorch give it
None. Measured, the zeros read as a layer whose every unit gets no gradient,
which the findings call dead: a warning on a healthy run whose model has a
head the loss does not use (a pooler in masked language modelling, an
auxiliary output). These runs train a model with such a head and a branch
behind ``stop_gradient``, and read the rows and findings back through the
plugin's route, as TensorBoard serves them.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import tb_gradcheck.jax as tj
from conftest import get_json
from conftest import make_app
from conftest import read_events
from conftest import stats_content
from tb_gradcheck.core import rowstats

STEPS = 120


class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(16, name="body")(x))
        side = nn.Dense(4, name="side")(jax.lax.stop_gradient(h))  # a probe on frozen features
        out = nn.Dense(1, name="head")(h) + 0.0 * jax.lax.stop_gradient(side).sum(-1, keepdims=True)
        return out, nn.Dense(4, name="pooler")(h)  # the pooler: an output the loss never uses


class Nnx(nnx.Module):
    def __init__(self, rngs):
        self.body = nnx.Linear(3, 16, rngs=rngs)
        self.head = nnx.Linear(16, 1, rngs=rngs)
        self.pooler = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.body(x))
        return self.head(h), self.pooler(h)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(x[:, :1] * 2.0 - np.sin(x[:, 1:2]), jnp.float32)


def linen_loss(params, x, y):
    out, _ = Linen().apply(params, x)
    return jnp.mean((out - y) ** 2)


def train_linen(logdir, order, every_n_steps):
    """The healthy run: its loss falls by more than half. Returns (first loss, last loss)."""
    x, y = data()
    params = Linen().init(jax.random.PRNGKey(0), x[:2])
    tx = tj.monitor(optax.adam(1e-2), every_n_steps=every_n_steps, order=order(params, x, y))
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(linen_loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    with tj.GradientWriter(logdir) as writer:
        for s in range(STEPS):
            b = slice(32 * (s % 8), 32 * (s % 8 + 1))
            params, state, loss = step(params, state, x[b], y[b])
            writer.write(state, s)
            losses.append(float(loss))
    return losses[0], losses[-1]


def findings(logdir):
    client, _ = make_app(logdir, "python")
    return get_json(client, "/data/plugin/gradients/findings?run=.")["findings"]


def rows_of(logdir, name, column):
    content = stats_content(logdir)
    row = content["layer"]["rows"].index(name)
    return np.array([layer[:, row, content["columns"].index(column)] for _, layer, _ in read_events(logdir)])


def test_depth_order_of_the_loss_lists_what_it_has_no_path_to():
    x, y = data()
    params = Linen().init(jax.random.PRNGKey(0), x[:2])
    order = tj.depth_order(linen_loss, params, x, y)
    assert sorted(order.unreached) == ["pooler/bias", "pooler/kernel", "side/bias", "side/kernel"]
    assert order[:2] == ["body/kernel", "body/bias"]
    # A (loss, aux) pair, as value_and_grad(has_aux=True) takes: the same.
    pair = tj.depth_order(lambda p, x, y: (linen_loss(p, x, y), Linen().apply(p, x)[1]), params, x, y)
    assert pair.unreached == order.unreached
    # The forward pass returns both heads: which one the loss uses is not known, so nothing is unreached.
    assert tj.depth_order(lambda p: Linen().apply(p, x), params).unreached == ()


def test_a_loss_reverse_mode_cannot_differentiate_keeps_its_order_and_says_what_is_lost():
    params = {"a": jnp.ones(3), "b": jnp.ones(3)}

    def loss(p):  # a while_loop with a traced bound: jax.grad refuses it
        return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] * p["a"].sum(), c[1] + 1), (1.0, 0))[0]

    with pytest.warns(UserWarning, match="could not differentiate its function .*while_loop.*not MISSING"):
        order = tj.depth_order(loss, params)
    assert list(order) == ["a"] and order.unreached == ()


def test_a_head_without_a_loss_and_a_probe_behind_stop_gradient_are_missing_not_dead(tmp_path):
    for every in (1, 10):
        logdir = tmp_path / f"loss_order_{every}"
        first, last = train_linen(logdir, lambda p, x, y: tj.depth_order(linen_loss, p, x, y), every)
        assert last < first / 2  # premise: a healthy run
        for name in ("pooler", "side"):
            for column in ("grad_norm", "dead_unit_fraction"):
                np.testing.assert_array_equal(rows_of(logdir, name, column), rowstats.MISSING)
            # Its weights are still measured, where the body's are (not at the partial window's close).
            measured = rows_of(logdir, "body", "weight_norm") > 0
            assert measured.any() and np.all(rows_of(logdir, name, "weight_norm")[measured] > 0)
        assert np.all(rows_of(logdir, "body", "grad_norm") > 0)
        assert [f["kind"] for f in findings(logdir)] == []
    # The premise of the fix: ordered by the forward pass, the zeros are measured, and read as a dead layer.
    logdir = tmp_path / "forward_order"
    train_linen(logdir, lambda p, x, y: tj.depth_order(lambda q: Linen().apply(q, x), p), 1)
    np.testing.assert_array_equal(rows_of(logdir, "pooler", "grad_norm"), 0.0)
    dead = [f for f in findings(logdir) if f["kind"] == "dead"]
    assert dead and "pooler" in dead[0]["layers"]  # "side", read before it, counted among the layers cut off behind it


def test_nnx_optimizer_with_a_depth_order_of_the_loss(tmp_path):
    x, y = data()
    model = Nnx(nnx.Rngs(0))

    def loss_fn(m, x, y):
        return jnp.mean((m(x)[0] - y) ** 2)

    order = tj.depth_order(loss_fn, model, x, y)
    assert sorted(order.unreached) == ["pooler/bias", "pooler/kernel"]
    optimizer = nnx.Optimizer(model, tj.monitor(optax.adam(1e-2), every_n_steps=5, order=order), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    with tj.GradientWriter(tmp_path) as writer:
        losses = []
        for s in range(STEPS):
            b = slice(32 * (s % 8), 32 * (s % 8 + 1))
            losses.append(float(step(model, optimizer, x[b], y[b])))
            writer.write(optimizer, s)
    assert losses[-1] < losses[0] / 2
    np.testing.assert_array_equal(rows_of(tmp_path, "pooler", "grad_norm"), rowstats.MISSING)
    assert np.all(rows_of(tmp_path, "head", "grad_norm") > 0)
    assert [f["kind"] for f in findings(tmp_path)] == []
