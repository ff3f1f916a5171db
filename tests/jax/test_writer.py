"""tb_gradcheck.jax: the monitor's rows against float64 twins, windows against every step, sharded against one device.

Every run here is real: Flax models, optax optimizers, ``jax.jit``, and the
event files read back with TensorBoard's own loader (``conftest.read_events``).
"""

import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tb_gradcheck.jax as tj
from conftest import read_events
from conftest import stats_content
from reference_stats import layer_groups
from reference_stats import reference
from tb_gradcheck.core import metadata

# float32 reductions over a few hundred elements agree with float64 numpy to
# about 1e-6 relative; 1e-5 leaves room for summation order, nothing more.
RTOL = 1e-5
COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
HERE = pathlib.Path(__file__).resolve().parents[1]  # tests/, where the job scripts are


def dead_bias(key, shape, dtype=jnp.float32):
    """Half the units start far below zero: behind a ReLU they are dead, their gradients exactly 0."""
    return jnp.where(jnp.arange(shape[0]) < shape[0] // 2, -100.0, 0.1).astype(dtype)


class Net(nn.Module):
    """Embed, Conv, Dense with dead units, LayerNorm, Dense: every unit rule of ``layout``."""

    @nn.compact
    def __call__(self, tokens, image):
        e = nn.Embed(10, 6)(tokens).mean(axis=1)
        h = nn.relu(nn.Conv(4, (3, 3))(image)).reshape(image.shape[0], -1)
        h = nn.relu(nn.Dense(8, bias_init=dead_bias)(jnp.concatenate([h, e], -1)))
        return nn.Dense(1)(nn.LayerNorm()(h))


def net_data(seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, 5, size=(4, 3)))  # rows 5..9 of the table are never read
    image = jnp.asarray(rng.normal(size=(4, 5, 5, 2)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(4, 1)), jnp.float32)
    return tokens, image, y


def run_steps(tx, params, loss, steps, logdir):
    """Trains ``params`` on ``loss(params)`` with ``tx``, jitted, writing every step; returns each step's (grads, params, updates)."""
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads, updates

    seen = []
    with tj.GradientWriter(logdir) as writer:
        for s in range(steps):
            before = params
            params, opt_state, grads, updates = step(params, opt_state)
            writer.write(opt_state, s)
            seen.append((grads, before, updates))
    return seen


def train(tx, steps, logdir):
    """Trains ``Net`` with ``tx`` for ``steps`` steps (``run_steps``)."""
    net = Net()
    tokens, image, y = net_data()
    params = net.init(jax.random.PRNGKey(0), tokens, image)
    return run_steps(tx, params, lambda p: jnp.mean((net.apply(p, tokens, image) - y) ** 2), steps, logdir)


def by_name(tree):
    """``{row name: float64 array}`` of a parameter pytree, named as the monitor names it."""
    names = ["/".join(p) for p in tj.layout.path_names(tree)]
    return {n: np.asarray(x, np.float64) for n, x in zip(names, jax.tree_util.tree_leaves(tree))}


def test_rows_of_every_step_match_a_float64_twin_of_the_same_gradients(tmp_path):
    seen = train(tj.monitor(optax.adam(1e-2)), 3, tmp_path)
    content = stats_content(tmp_path)
    assert content["layer"]["rows"] == ["Conv_0", "Dense_0", "Dense_1", "Embed_0", "LayerNorm_0"]
    assert content["columns"] == list(metadata.stored_columns(1)) + ["update_norm", "update_to_weight"]
    layers, variables = read_events(tmp_path), read_events(tmp_path, granularity="variable")
    assert [s for s, _, _ in layers] == [0, 1, 2]
    units = {"Conv_0/kernel": 4, "Conv_0/bias": 4, "Dense_0/kernel": 8, "Dense_0/bias": 8, "Dense_1/kernel": 1}
    units |= {"Dense_1/bias": 1, "Embed_0/embedding": 6, "LayerNorm_0/scale": 8, "LayerNorm_0/bias": 8}
    base = len(metadata.stored_columns(1))
    for (grads, params, updates), (_, layer, _), (_, variable, _) in zip(seen, layers, variables):
        g, w, u = by_name(grads), by_name(params), by_name(updates)
        groups = layer_groups(content)
        np.testing.assert_allclose(layer[0, :, :base], reference(g, w, units, groups), rtol=RTOL, atol=1e-12)
        singles = [[n] for n in content["variable"]["rows"]]
        np.testing.assert_allclose(variable[0, :, :base], reference(g, w, units, singles), rtol=RTOL, atol=1e-12)
        update = np.array([np.sqrt(sum(np.sum(u[n] ** 2) for n in group)) for group in groups])
        weight = np.array([np.sqrt(sum(np.sum(w[n] ** 2) for n in group)) for group in groups])
        np.testing.assert_allclose(layer[0, :, base], update, rtol=RTOL)
        np.testing.assert_allclose(layer[0, :, base + 1], update / weight, rtol=RTOL)
    dense = content["layer"]["rows"].index("Dense_0")
    assert layers[0][1][0, dense, COL["dead_unit_fraction"]] >= 0.5  # the planted dead half (and any ReLU killed)
    embed = content["variable"]["rows"].index("Embed_0/embedding")
    assert variables[0][1][0, embed, COL["grad_zero_fraction"]] == 0.5  # 5 of 10 table rows never read


def test_float64_parameters_under_x64_give_float64_twins_numbers(tmp_path):
    # With jax_enable_x64 the monitor reduces float64 gradients in float64:
    # the stored float32 then agrees with numpy to float32 rounding alone.
    with jax.enable_x64(True):
        params = {"a": {"kernel": jnp.arange(12.0).reshape(3, 4) / 7, "bias": jnp.ones(4)}}
        grads = {"a": {"kernel": jnp.linspace(-1, 1, 12).reshape(3, 4) * 1e-3, "bias": jnp.zeros(4)}}
        tx = tj.monitor()
        state = tx.init(params)
        assert state.held.norm.dtype == jnp.float64
        _, state = jax.jit(tx.update)(grads, state, params)
        with tj.GradientWriter(tmp_path) as writer:
            writer.write(state, 0)
    ((_, layer, _),) = read_events(tmp_path)
    units = {"a/kernel": 4, "a/bias": 4}
    expected = reference(by_name(grads), by_name(params), units, [["a/bias", "a/kernel"]])
    np.testing.assert_allclose(layer[0], expected.astype(np.float32), rtol=1e-7)


def extreme_grads():
    """Gradients a float32 sum of squares gets wrong, and the non-finite ones, one pytree per step."""
    rng = np.random.default_rng(1)

    def tree(kernel, bias, head):
        return {
            "a": {"kernel": jnp.asarray(kernel, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)},
            "b": {"kernel": jnp.asarray(head, jnp.float32)},
        }

    k, b, h = rng.normal(size=(3, 4)), rng.normal(size=4), rng.normal(size=(4, 2))
    nan = k.copy()
    nan[1, 2] = np.nan
    inf = b.copy()
    inf[0] = -np.inf
    return [
        tree(k, b, h),
        tree(k * 1e-25, b * 1e-26, h),  # squares underflow: a plain sum reads 0
        tree(k * 4e19, b, h * 1e-30),  # squares overflow: a plain sum reads Inf
        tree(nan, b, h),
        tree(k, inf, h),
        tree(np.zeros_like(k), b, np.zeros_like(h)),
        tree(k, b, h * 3),
        tree(k * 2, b, h),
    ]


def feed(grads_seq, every_n_steps, logdir, **monitor_args):
    """Passes each gradient pytree through a monitor (no optimizer, no params), writing every step."""
    params = jax.tree_util.tree_map(jnp.zeros_like, grads_seq[0])
    tx = tj.monitor(every_n_steps=every_n_steps, **monitor_args)
    state = tx.init(params)
    update = jax.jit(tx.update)
    with tj.GradientWriter(logdir) as writer:
        for s, g in enumerate(grads_seq):
            out, state = update(g, state)
            assert out is g or all(
                np.array_equal(a, b, equal_nan=True) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(g))
            )
            writer.write(state, s)


def test_norms_are_exact_at_any_scale_and_non_finite_elements_counted(tmp_path):
    seq = extreme_grads()
    feed(seq, 1, tmp_path)
    layers, variables = read_events(tmp_path), read_events(tmp_path, granularity="variable")
    units = {"a/kernel": 4, "a/bias": 4, "b/kernel": 2}
    columns = [
        COL[c] for c in ("grad_norm", "grad_max_abs", "grad_zero_fraction", "grad_nonfinite", "dead_unit_fraction")
    ]
    for g, (_, layer, _), (_, variable, _) in zip(seq, layers, variables):
        named = by_name(g)
        expected = reference(named, named, units, [["a/bias", "a/kernel"], ["b/kernel"]])
        np.testing.assert_allclose(layer[0][:, columns], expected[:, columns].astype(np.float32), rtol=RTOL)
        expected = reference(named, named, units, [["a/bias"], ["a/kernel"], ["b/kernel"]])
        np.testing.assert_allclose(variable[0][:, columns], expected[:, columns].astype(np.float32), rtol=RTOL)
    assert layers[1][1][0, 0, COL["grad_norm"]] > 0  # vanishing, not zero
    assert np.isfinite(layers[2][1][0, 0, COL["grad_norm"]])  # large, not Inf
    assert np.isnan(layers[3][1][0, 0, COL["grad_norm"]]) and layers[3][1][0, 0, COL["grad_nonfinite"]] == 1
    assert variables[4][1][0, 0, COL["grad_norm"]] == np.inf  # a/bias holds -Inf


def test_windows_hold_the_aggregates_of_the_steps_written_every_step(tmp_path):
    seq = extreme_grads()
    feed(seq, 1, tmp_path / "every")
    feed(seq, 3, tmp_path / "window")
    every = {s: x for s, x, _ in read_events(tmp_path / "every")}
    windows = read_events(tmp_path / "window")
    # Written at 0, 3, 6 and, at close, the partial window of step 7.
    assert [s for s, _, _ in windows] == [0, 3, 6, 7]
    aggregates = metadata.AGGREGATES
    for (step, window, _), first in zip(windows, [0, 1, 4, 7]):
        steps = range(first, step + 1)
        norms = np.stack([every[s][0, :, COL["grad_norm"]] for s in steps]).astype(np.float64)
        nonfinite = np.stack([every[s][0, :, COL["grad_nonfinite"]] for s in steps])
        with np.errstate(invalid="ignore"):
            expected = {"mean": norms.mean(0), "max": norms.max(0), "min": norms.min(0), "sum": norms.sum(0)}
        for name, value in expected.items():
            got = window[aggregates.index(name), :, COL["grad_norm"]]
            np.testing.assert_allclose(got, value.astype(np.float32), rtol=RTOL, err_msg=f"{name} at {step}")
        # A window counts the steps with a NaN or Inf (docs/statistics.md), every step's write the elements.
        np.testing.assert_array_equal(window[aggregates.index("sum"), :, COL["grad_nonfinite"]], (nonfinite > 0).sum(0))
        finite = np.where(np.isfinite(norms), norms, -np.inf).max(0)
        np.testing.assert_allclose(
            window[aggregates.index("max"), :, COL["grad_norm_finite"]],
            np.where(finite > -np.inf, finite, -1),
            rtol=RTOL,
        )
        bad = [np.flatnonzero(nonfinite[:, r] > 0) for r in range(nonfinite.shape[1])]
        offsets = np.array([step - steps[b[0]] if len(b) else -1 for b in bad])
        np.testing.assert_array_equal(window[0, :, COL["first_nonfinite_offset"]], offsets)
        if step % 3 == 0:  # a written step's last slab is that step's full statistics
            full = [COL[c] for c in metadata.stored_columns(1) if c != "weight_norm"]
            np.testing.assert_allclose(window[0][:, full], every[step][0][:, full], rtol=RTOL)
    assert windows[1][1][0, 0, COL["first_nonfinite_offset"]] == 0  # step 3's NaN, written at 3
    assert windows[2][1][0, 0, COL["first_nonfinite_offset"]] == 2  # step 4's -Inf, written at 6


def test_sharded_over_four_devices_writes_the_rows_of_one_device(tmp_path):
    job = HERE / "jax_sharded_job.py"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    out = subprocess.run(
        [sys.executable, str(job), str(tmp_path), "2"], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sharded, single = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    # Really split: every kernel over the 4 devices, the batch too; the twin on one.
    assert sharded["kernel_devices"] == [4, 4, 4, 4] and not any(sharded["kernel_replicated"])
    assert sharded["batch_devices"] == 4 and not sharded["batch_replicated"]
    assert single["kernel_devices"] == [1, 1, 1, 1] and single["batch_devices"] == 1
    for granularity in ("layer", "variable"):
        sharded = read_events(tmp_path / "sharded", granularity=granularity)
        single = read_events(tmp_path / "single", granularity=granularity)
        assert [s for s, _, _ in sharded] == [s for s, _, _ in single] == [0, 2, 4]
        for (_, a, _), (_, b, _) in zip(sharded, single):
            # The same global arrays reduced in another order (and the
            # gradient summed over the data shards): float32 rounding only.
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-7)
        assert stats_content(tmp_path / "sharded") == stats_content(tmp_path / "single")


def test_gradient_accumulation_with_multisteps_writes_each_applied_update_once(tmp_path):
    """``optax.MultiSteps`` around the monitor: one row per applied update, of the mean of its micro-batches' gradients."""
    k, micro_steps = 3, 9
    tx = optax.MultiSteps(tj.monitor(optax.sgd(1e-2)), every_k_schedule=k)
    net = Net()
    tokens, image, y = net_data()
    params = net.init(jax.random.PRNGKey(0), tokens, image)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, scale):
        grads = jax.grad(lambda p: jnp.mean((net.apply(p, tokens, image) * scale - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads

    micro = []
    with tj.GradientWriter(tmp_path) as writer:
        for i in range(micro_steps):
            params, opt_state, grads = step(params, opt_state, 1.0 + 0.1 * i)  # a different gradient each micro-step
            micro.append(by_name(grads))
            if (i + 1) % k == 0:
                writer.write(opt_state, i // k)
    content = stats_content(tmp_path)
    variables = read_events(tmp_path, granularity="variable")
    assert [s for s, _, _ in variables] == [0, 1, 2]
    norm = content["variable"]["rows"].index("Dense_0/kernel")
    for update, (_, array, _) in enumerate(variables):
        mean = sum(g["Dense_0/kernel"] for g in micro[update * k : update * k + k]) / k
        np.testing.assert_allclose(array[0, norm, COL["grad_norm"]], np.sqrt(np.sum(mean**2)), rtol=RTOL)


def test_a_logdir_that_cannot_hold_the_run_is_refused_when_the_writer_is_built(tmp_path):
    with pytest.raises(ValueError, match="tb_gradcheck.jax.GradientWriter can write its run to. Received: '/proc/x'"):
        tj.GradientWriter("/proc/x")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="it is a file, not a directory"):
        tj.GradientWriter(tmp_path / "file")
    with tj.GradientWriter(tmp_path / "run") as writer:
        assert writer.log_dir == str(tmp_path / "run") and os.path.isdir(writer.log_dir)
