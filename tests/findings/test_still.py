"""The still-weights rule (tb_gradcheck.findings.still) on real JAX and TensorFlow loops, read back through TensorBoard.

Gradients computed and never applied are healthy gradients: only the weights,
whose norm every writer stores at each written step, show that nothing moves.
(PyTorch's forgotten ``optimizer.step()``: tests/torch/test_optimizer_findings.py.)
"""

import jax
import jax.numpy as jnp
import optax
import pytest
import tensorflow as tf

import tb_gradcheck
import tb_gradcheck.jax as tj
from tb_gradcheck.reader import queries
from tb_gradcheck.reader import store

STEPS = 30


def findings(logdir):
    st, ctx, eid = store.local_store(str(logdir))
    (run,) = st.runs(ctx, eid)
    return queries.findings(st, ctx, eid, run)


def jax_run(logdir, keep, optimizer):
    """A 8-16-16-1 tanh MLP in plain JAX, the monitor around ``optimizer``; ``keep``: the step's new params are kept."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "Dense_0": {"kernel": jax.random.normal(k1, (8, 16)) / jnp.sqrt(8.0), "bias": jnp.zeros(16)},
        "Dense_1": {"kernel": jax.random.normal(k2, (16, 16)) / 4.0, "bias": jnp.zeros(16)},
        "Dense_2": {"kernel": jax.random.normal(k3, (16, 1)) / 4.0, "bias": jnp.zeros(1)},
    }

    def loss(p, x):
        h = jnp.tanh(x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
        h = jnp.tanh(h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"])
        return jnp.mean((h @ p["Dense_2"]["kernel"] + p["Dense_2"]["bias"] - jnp.sin(x[:, :1])) ** 2)

    tx = tj.monitor(optimizer)
    state = tx.init(params)

    @jax.jit
    def step(p, s, x):
        updates, s = tx.update(jax.grad(loss)(p, x), s, p)
        return optax.apply_updates(p, updates), s

    first = params
    with tj.GradientWriter(str(logdir)) as writer:
        for i in range(STEPS):
            new, state = step(params, state, jax.random.normal(jax.random.PRNGKey(i + 1), (32, 8)))
            if keep:
                params = new  # the bug: `new, state = step(...)` without this line
            writer.write(state, i)
    moved = any(bool(jnp.any(a != b)) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(params)))
    return findings(logdir), moved


def test_jax_params_not_kept_is_a_warning_that_names_the_dropped_updates(tmp_path):
    found, moved = jax_run(tmp_path, keep=False, optimizer=optax.adam(1e-3))
    assert not moved  # the premise
    (still,) = [f for f in found if f.severity != "info"]
    assert still.kind == "not_learning" and still.metric == "weight_norm" and still.steps == [0, STEPS - 1]
    assert still.layers == ["Dense_0", "Dense_1", "Dense_2"]
    assert "No weights move" in still.message and "the updated weights were not kept" in still.message
    assert all(e["median_update_to_weight"] > 1e-4 for e in still.evidence.values())


def test_jax_everything_set_to_zero_is_a_warning_not_frozen_information(tmp_path):
    found, moved = jax_run(tmp_path, keep=True, optimizer=optax.set_to_zero())
    assert not moved
    (still,) = found
    assert still.severity == "warning" and "update of exactly 0" in still.message


@pytest.mark.parametrize("optimizer", [optax.adam(1e-3), optax.sgd(1e-3)], ids=["adam", "sgd"])
def test_jax_params_kept_are_no_finding(tmp_path, optimizer):
    found, moved = jax_run(tmp_path, keep=True, optimizer=optimizer)
    assert moved and not [f for f in found if f.kind == "not_learning"], [f.message for f in found]


@pytest.mark.parametrize("apply", [False, True], ids=["apply_gradients_missing", "control"])
def test_tensorflow_loop_without_apply_gradients(tmp_path, apply):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, "tanh"), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)
    writer = tb_gradcheck.GradientWriter(str(tmp_path))
    for i in range(STEPS):
        x = tf.random.stateless_normal((32, 8), (i, 0))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - tf.sin(x[:, :1])) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        writer.write(grads, model.trainable_variables, i)
        if apply:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
    writer.close()
    still = [f for f in findings(tmp_path) if f.kind == "not_learning"]
    if apply:
        assert not still, [f.message for f in still]
    else:
        assert [f.severity for f in still] == ["warning"] and len(still[0].layers) == 2
        assert "No weights move" in still[0].message and still[0].steps == [0, STEPS - 1]


def test_a_schedule_annealed_to_zero_is_a_fade_not_weights_that_never_move(tmp_path):
    """Cosine to 0 over 4,000 steps, written every step: the last ~40 writes hold every norm bit for bit (float32
    no longer resolves the updates), after a motion that faded into it by orders; a healthy run, no finding.
    Then the same run with optimizer.step() dropped from step 3,000: stopped at once, at its usual pace."""
    import torch

    from tb_gradcheck.torch import GradientWriter

    def run(logdir, stops_at=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 4000, eta_min=0.0)
        x = torch.randn(256, 4)
        y = x[:, :1] * 2 - x[:, 1:2]
        norms = []
        with GradientWriter(logdir, model) as writer:
            for step in range(4000):
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                if stops_at is None or step < stops_at:
                    optimizer.step()
                schedule.step()
                writer.write(step)
                norms.append([float(p.detach().norm()) for p in model.parameters()])
        return float(loss), norms

    loss, norms = run(tmp_path / "annealed")
    # Premise: it learned, and its weights' float32 norms stopped changing over its last 20+ steps.
    assert loss < 1e-3 and norms[-25] == norms[-1]
    assert [f.kind for f in findings(tmp_path / "annealed")] == []
    run(tmp_path / "dropped", stops_at=3000)
    (f,) = findings(tmp_path / "dropped")
    assert (
        f.kind == "not_learning"
        and f.severity == "warning"
        and 2999 <= f.steps[0] <= 3000
        and "No weights move" in f.message
    )
