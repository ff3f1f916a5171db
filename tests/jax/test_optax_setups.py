"""optax setups whose ``params`` and ``updates`` are not the model's weights and their change: lookahead, bfloat16.

Each trains a small MLP in a jitted step with the real optax optimizer and
holds the stored rows to what the step did, measured outside the monitor.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tb_gradcheck.jax as tj
from conftest import read_events
from conftest import stats_content


def _params(dtype=jnp.float32):
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    p = {
        "Dense_0": {"kernel": jax.random.normal(k[0], (4, 16)) * 0.5, "bias": jnp.zeros(16)},
        "Dense_1": {"kernel": jax.random.normal(k[1], (16, 1)) * 0.25, "bias": jnp.zeros(1)},
    }
    return jax.tree.map(lambda a: a.astype(dtype), p)


def _loss(p, x, y):
    h = jax.nn.relu(x.astype(p["Dense_0"]["kernel"].dtype) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
    return jnp.mean(((h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"]).astype(jnp.float32) - y) ** 2)


def _train(tx, params, run_dir, steps, model=lambda p: p):
    """Trains ``steps`` steps; returns per step the gradients and the change of the model's weights, float64, by name."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps, 32, 4)).astype(np.float32)
    y = (x[..., :1] * 2 - x[..., 1:2]).astype(np.float32)

    @jax.jit
    def step(p, s, x, y):
        g = jax.grad(_loss)(model(p), x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, g

    def named(tree):
        return {
            "/".join(k.key for k in path): np.asarray(v, np.float64)
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]
        }

    state, seen = tx.init(params), []
    with tj.GradientWriter(run_dir) as writer:
        for i in range(steps):
            before = named(model(params))
            params, state, g = step(params, state, x[i], y[i])
            after = named(model(params))
            seen.append((named(g), {n: after[n] - before[n] for n in after}))
            writer.write(state, i)
    return seen


def _assert_rows(run_dir, seen, rtol=1e-5):
    columns = stats_content(run_dir)["columns"]
    rows = stats_content(run_dir)["variable"]["rows"]
    assert rows == ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel"]
    written = read_events(run_dir, granularity="variable")
    assert [s for s, _, _ in written] == list(range(len(seen)))
    for (step, stats, _), (grads, change) in zip(written, seen):
        for r, name in enumerate(rows):
            got = stats[0, r, columns.index("grad_norm")]
            np.testing.assert_allclose(got, np.linalg.norm(grads[name]), rtol=rtol, err_msg=f"{step} {name}")
            if "update_norm" in columns:  # a monitor around the optimizer
                got = stats[0, r, columns.index("update_norm")]
                np.testing.assert_allclose(got, np.linalg.norm(change[name]), rtol=rtol, err_msg=f"{step} {name}")


@pytest.mark.parametrize("where", ["around", "in_front"])
def test_lookahead_rows_are_the_fast_weights_and_their_change(tmp_path, where):
    """optax.lookahead's params are LookaheadParams(fast, slow); the gradient is the fast weights'.

    Before: init made 8 rows (fast and slow) and the first update raised
    'Expected gradients with one array per parameter (8) ... Received: 4'.
    The sync steps (every 3rd) pull the fast weights half way to the slow: that is their change too.
    """
    inner = optax.lookahead(optax.adam(0.01), sync_period=3, slow_step_size=0.5)
    tx = tj.monitor(inner) if where == "around" else optax.chain(tj.monitor(), inner)
    params = optax.LookaheadParams.init_synced(_params())
    seen = _train(tx, params, tmp_path / where, 7, model=lambda p: p.fast)
    _assert_rows(tmp_path / where, seen)


def test_bfloat16_update_norm_is_the_change_the_rounded_weights_made(tmp_path):
    """bfloat16 weights keep 8 significant bits: apply_updates rounds w + u, and updates under half an ulp are lost.

    Before: update_norm was the norm of Adam's returned update (Dense_0/kernel
    0.048 at step 0 where the weights moved by 0.056, and 0.0125 where they
    moved by 0 at a learning rate that bfloat16 rounds away).
    """
    seen = _train(tj.monitor(optax.adam(0.01)), _params(jnp.bfloat16), tmp_path / "moving", 4)
    # 2e-2: XLA may add in more precision than bfloat16 inside the step's
    # fusion (xla_allow_excess_precision) and round once at its output, so a
    # weight's rounding can differ from apply_updates' by one bfloat16 ulp
    # (exact with XLA_FLAGS=--xla_allow_excess_precision=false). Before: 15%.
    _assert_rows(tmp_path / "moving", seen, rtol=2e-2)
    # Updates under 1e-4 on kernel weights of 0.25 or more (bfloat16 ulp
    # 2**-9 and up): no kernel weight moves, and their update_norm is exactly 0.
    far = jax.tree_util.tree_map_with_path(
        lambda path, a: a + jnp.sign(a) * 0.25 if path[-1].key == "kernel" else a, _params(jnp.bfloat16)
    )
    seen = _train(tj.monitor(optax.sgd(1e-5)), far, tmp_path / "lost", 3)
    assert all(not np.any(c[n]) for _, c in seen for n in ("Dense_0/kernel", "Dense_1/kernel"))
    columns, rows = stats_content(tmp_path / "lost")["columns"], stats_content(tmp_path / "lost")["variable"]["rows"]
    for _, stats, _ in read_events(tmp_path / "lost", granularity="variable"):
        for name in ("Dense_0/kernel", "Dense_1/kernel"):
            assert stats[0, rows.index(name), columns.index("update_norm")] == 0
