"""tb_gradcheck.jax's contract: NNX and optax chains, gradients passed through, nothing read between writes, errors."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import tb_gradcheck.jax as tj
from conftest import read_events
from conftest import stats_content
from tb_gradcheck.core import metadata

RTOL = 1e-5  # float32 reductions of a few hundred elements against float64 numpy (as tests/jax/test_writer.py)
COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}


class Model(nnx.Module):
    """Attributes in depth order, which sorted keys are not: head < layers < linear1."""

    def __init__(self, rngs):
        self.linear1 = nnx.Linear(3, 8, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(11)])
        self.head = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.linear1(x))
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return self.head(x)


def batch():
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.normal(size=(6, 3)), jnp.float32), jnp.asarray(rng.normal(size=(6, 1)), jnp.float32)


def test_nnx_optimizer_in_depth_order_writes_windows_with_rows_named_by_module(tmp_path):
    model = Model(nnx.Rngs(0))
    x, y = batch()
    order = tj.depth_order(lambda m: m(x), model)
    optimizer = nnx.Optimizer(model, tj.monitor(optax.adam(1e-3), every_n_steps=3, order=order), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return grads

    with tj.GradientWriter(tmp_path) as writer:
        for s in range(5):
            grads = step(model, optimizer)
            writer.write(optimizer, s)
    # Windows written at 0 and 3, and the partial one (step 4) at close, read from NNX's wrapped state.
    assert [s for s, _, _ in read_events(tmp_path)] == [0, 3, 4]
    content = stats_content(tmp_path)
    # Depth order from the forward pass, numbers by value (layers/2 before layers/10).
    assert content["layer"]["rows"] == ["linear1"] + [f"layers/{i}" for i in range(11)] + ["head"]
    assert content["variable"]["rows"][:2] == ["linear1/kernel", "linear1/bias"]
    (_, layer, _) = read_events(tmp_path)[-1]
    head = np.concatenate([np.ravel(grads["head"]["kernel"][...]), np.ravel(grads["head"]["bias"][...])])
    np.testing.assert_allclose(layer[0, -1, COL["grad_norm"]], np.linalg.norm(head.astype(np.float64)), rtol=RTOL)


def test_natural_order_sorts_numbered_names_by_value():
    params = {f"Dense_{i}": {"kernel": jnp.zeros((2, 2)), "bias": jnp.zeros(2)} for i in range(12)}
    state = tj.monitor().init({"params": params})
    assert state.layout.structure.layer_names == [f"Dense_{i}" for i in range(12)]
    assert state.layout.names[:2] == ("Dense_0/bias", "Dense_0/kernel")


def chain_run(tx, steps=4):
    """Trains a small MLP with ``tx`` and returns the final parameters and opt states, step by step."""
    x, y = batch()
    rng = np.random.default_rng(1)
    params = {"a": {"kernel": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32), "bias": jnp.zeros(5)}}
    params["b"] = {"kernel": jnp.asarray(rng.normal(size=(5, 1)), jnp.float32), "bias": jnp.zeros(1)}
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        def loss(p):
            h = jnp.tanh(x @ p["a"]["kernel"] + p["a"]["bias"])
            return jnp.mean((h @ p["b"]["kernel"] + p["b"]["bias"] - y) ** 2) * 100.0

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads

    states, grads = [], []
    for _ in range(steps):
        params, opt_state, g = step(params, opt_state)
        states.append(opt_state)
        grads.append(g)
    return params, states, grads, step


def test_in_front_of_clipping_it_passes_gradients_unchanged_and_records_them_before_the_clip(tmp_path):
    bare, _, grads, _ = chain_run(optax.chain(optax.clip_by_global_norm(0.1), optax.adam(1e-2)))
    tx = optax.chain(tj.monitor(every_n_steps=2), optax.clip_by_global_norm(0.1), optax.adam(1e-2))
    watched, states, _, _ = chain_run(tx)
    for a, b in zip(jax.tree_util.tree_leaves(bare), jax.tree_util.tree_leaves(watched)):
        np.testing.assert_array_equal(a, b)  # bit for bit: the monitor changes nothing the optimizer sees
    with tj.GradientWriter(tmp_path) as writer:
        for s, state in enumerate(states[:3]):
            writer.write(state, s)
    written = {s: x for s, x, _ in read_events(tmp_path)}
    global_norm = float(optax.tree.norm(grads[2]))
    assert global_norm > 0.1  # the clip binds, and the monitor saw the gradient before it
    layer_norms = written[2][0, :, COL["grad_norm"]]
    np.testing.assert_allclose(np.sqrt(np.sum(layer_norms.astype(np.float64) ** 2)), global_norm, rtol=RTOL)


def test_steps_between_writes_read_nothing_from_the_device_and_the_step_has_no_callback(tmp_path):
    tx = tj.monitor(optax.sgd(0.1), every_n_steps=3)
    _, states, _, step = chain_run(tx, steps=4)
    hlo = step.lower(*_example(tx)).as_text()
    assert "callback" not in hlo.lower()  # no host callback compiled into the step
    with tj.GradientWriter(tmp_path) as writer:
        for s, state in enumerate(states):
            if s % 3:
                with jax.transfer_guard("disallow_explicit"):  # any read, explicit or not, raises
                    writer.write(state, s)
            else:
                writer.write(state, s)
        assert [s for s, _, _ in read_events(tmp_path)] == [0, 3]


def _example(tx):
    params = {
        "a": {"kernel": jnp.zeros((3, 5)), "bias": jnp.zeros(5)},
        "b": {"kernel": jnp.zeros((5, 1)), "bias": jnp.zeros(1)},
    }
    return params, tx.init(params)


def test_a_step_that_is_not_the_monitors_count_is_refused_at_a_write(tmp_path):
    _, states, _, _ = chain_run(tj.monitor(optax.sgd(0.1), every_n_steps=2), steps=3)
    with tj.GradientWriter(tmp_path) as writer:
        writer.write(states[0], 0)
        writer.write(states[0], 1)  # not a written step: nothing is read, nothing checked
        with pytest.raises(ValueError, match=r"number 1\)\. Received: step=2"):
            writer.write(states[1], 2)  # a one-based loop: the state after update 1 called step 2
        with pytest.raises(TypeError, match="Python int"):
            writer.write(states[2], jnp.asarray(2))
        with pytest.raises(ValueError, match="non-negative"):
            writer.write(states[2], -1)
        with pytest.raises(ValueError, match="monitor"):
            writer.write(optax.adam(1e-3).init({"w": jnp.zeros(2)}), 0)
    with pytest.raises(ValueError, match="closed"):
        writer.write(states[2], 2)
    writer.close()  # twice is fine


def apply_if_finite_run(tx, logdir, poisoned=2, steps=4):
    """``steps`` SGD steps on a linear model, the loss NaN at step ``poisoned``, written every step into ``logdir``."""
    params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
    x, y = jnp.arange(12.0).reshape(4, 3) / 10, jnp.ones((4, 2))
    state = tx.init(params)

    @jax.jit
    def step(params, state, poison):
        grads = jax.grad(lambda p: jnp.mean((x @ p["dense"]["kernel"] + p["dense"]["bias"] - y) ** 2) * poison)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    with tj.GradientWriter(logdir) as writer:
        for s in range(steps):
            params, state = step(params, state, jnp.float32(np.nan if s == poisoned else 1.0))
            writer.write(state, s)


def test_a_monitor_inside_apply_if_finite_is_warned_of_at_its_first_write_and_named_when_its_count_falls_behind(
    tmp_path,
):
    # apply_if_finite puts its inner state back at a step it skips: a
    # monitor in there never records the NaN, and from then on its count is
    # one behind the training step. Said at the first write, before any NaN,
    # and again in the error at the first write after one.
    with pytest.warns(UserWarning, match=r"inside optax.apply_if_finite.*monitor\(optax.apply_if_finite"):
        with pytest.raises(ValueError, match=r"number 1; 1 steps skipped so far: a monitor inside optax.apply_if"):
            apply_if_finite_run(optax.apply_if_finite(tj.monitor(optax.sgd(0.1)), 3), tmp_path / "inside")
    # The monitor around it records every step, the NaN at its step.
    apply_if_finite_run(tj.monitor(optax.apply_if_finite(optax.sgd(0.1), 3)), tmp_path / "around")
    layers = read_events(tmp_path / "around")
    assert [s for s, _, _ in layers] == [0, 1, 2, 3]
    nonfinite = [layer[0, 0, COL["grad_nonfinite"]] for _, layer, _ in layers]
    assert nonfinite[2] == 8 and nonfinite[0] == nonfinite[1] == nonfinite[3] == 0  # every element of kernel and bias
    update = stats_content(tmp_path / "around")["columns"].index("update_norm")
    assert layers[2][1][0, 0, update] == 0 and layers[3][1][0, 0, update] > 0  # the NaN step was skipped


def test_a_pmap_replicated_state_is_refused_with_the_way_to_pass_one_replica(tmp_path):
    # What pmap returns: every leaf with a leading device axis (two devices
    # here, stacked by hand: the shape is what the writer sees).
    params = {"a": {"kernel": jnp.ones((3, 4)), "bias": jnp.zeros(4)}}
    tx = tj.monitor(optax.sgd(0.1), every_n_steps=2)
    state = tx.init(params)
    _, state = jax.jit(tx.update)(params, state)
    replicated = jax.tree.map(lambda x: jnp.stack([x, x]), state)
    with tj.GradientWriter(tmp_path) as writer:
        for step in (0, 1):  # a written step, and one that reads nothing (close() would read its window)
            with pytest.raises(ValueError, match=r"shape \(2,\): a pmap-replicated state.*x\[0\]"):
                writer.write(replicated, step)
        writer.write(jax.tree.map(lambda x: x[0], replicated), 0)  # one replica is the state
    ((step, _, _),) = read_events(tmp_path)
    assert step == 0


def test_arguments_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match="every_n_steps"):
        tj.monitor(every_n_steps=0)
    with pytest.raises(TypeError, match="GradientTransformation"):
        tj.monitor("adam")
    with pytest.raises(ValueError, match="unknown names"):
        tj.monitor(order=["nope/kernel"]).init({"a": {"kernel": jnp.zeros(2)}})
    with pytest.raises(TypeError, match=r"list of parameter names .* Received: str 'a/kernel'"):
        tj.monitor(order="a/kernel")
    with pytest.raises(TypeError, match="Expected `fn` to be the loss .* Received: dict"):
        tj.depth_order({"a": jnp.zeros(2)}, {"a": jnp.zeros(2)})
    with pytest.raises(ValueError, match="unit_axes"):
        tj.monitor(unit_axes={"nope": 2}).init({"a": {"kernel": jnp.zeros(2)}})
    state = tj.monitor().init({"a": {"kernel": jnp.zeros((2, 3))}})
    with pytest.raises(ValueError, match="one array per parameter"):
        tj.monitor().update({"a": {"kernel": jnp.zeros((2, 3))}, "b": jnp.zeros(1)}, state)
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        tj.monitor().update({"a": {"kernel": jnp.zeros((3, 2))}}, state)
    with pytest.raises(ValueError, match="exactly one"):
        tj.GradientWriter()


def test_importing_the_jax_writer_imports_neither_tensorflow_nor_torch():
    code = "import sys, tb_gradcheck.jax; print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'torch', 'keras')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
