"""The JAX monitor's cost: step time against the bare jitted step, for an MLP, a CNN and a Transformer.

Each model (Flax Linen) is trained with one jitted step (gradient, optax
adam update, apply; parameters and optimizer state donated) in four ways,
timed in interleaved rounds in one run:

- bare;
- ``tb_gradcheck.jax.monitor`` around the optimizer, with the host writer
  called after every step, writing every step and every 10 steps (the
  update columns included);
- what users write by hand today: each layer's gradient norm computed in the
  step and handed to the host by ``jax.debug.callback`` every step, where it
  is kept (a list append: the callback's cost without any file).

Figures are medians of the rounds, as ratios to the bare step of the same
rounds. A round times 20 steps (5 with ``--quick``) and waits for the last.
"""

import tempfile
import time

import numpy as np

from benchmarks.common import interleaved
from benchmarks.common import row

# Issue #30: a window of 10 within 5% of the bare step on the CNN and the
# Transformer (whose steps compute much per parameter); the MLP's and every
# step's are reported without a target.
TARGET_EVERY10 = {"cnn": 1.05, "transformer": 1.05}


def _models(quick, accelerator=False):
    import flax.linen as nn
    import jax.numpy as jnp

    class MLP(nn.Module):
        depth: int
        width: int

        @nn.compact
        def __call__(self, x):
            for _ in range(self.depth):
                x = nn.relu(nn.Dense(self.width)(x))
            return nn.Dense(10)(x)

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            for features, stride in ((32, 1), (64, 2), (64, 2)):
                x = nn.relu(nn.LayerNorm()(nn.Conv(features, (3, 3), strides=stride)(x)))
            return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))

    class Transformer(nn.Module):
        blocks: int
        width: int

        @nn.compact
        def __call__(self, x):
            for _ in range(self.blocks):
                x = nn.LayerNorm()(x + nn.MultiHeadDotProductAttention(num_heads=4)(x, x))
                h = nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(x)))
                x = nn.LayerNorm()(x + h)
            return nn.Dense(10)(jnp.mean(x, axis=1))

    if quick:
        return [
            ("mlp", "mlp8_w128_b32", MLP(8, 128), (32, 128)),
            ("cnn", "cnn3_b16", CNN(), (16, 32, 32, 3)),
            ("transformer", "transformer2_w128_b8", Transformer(2, 128), (8, 32, 128)),
        ]
    # The writer benchmark's models and batches (benchmarks/writer.py); on an
    # accelerator, whose step at these batches is a few hundred kernels of
    # microseconds each (launch-bound: any fixed cost looks large), also
    # batches 16x larger, which an accelerator trains with.
    scales = (1, 16) if accelerator else (1,)
    out = []
    for k in scales:
        out += [
            ("mlp", f"mlp20_w256_b{64 * k}", MLP(20, 256), (64 * k, 256)),
            ("cnn", f"cnn3_b{32 * k}", CNN(), (32 * k, 32, 32, 3)),
            ("transformer", f"transformer6_w256_b{16 * k}", Transformer(6, 256), (16 * k, 64, 256)),
        ]
    return out


def _ways(model, x_shape, logdir, inner):
    """``{way: callable}``: each runs ``inner`` training steps of its way and waits for the last."""
    import jax
    import jax.numpy as jnp
    import optax

    import tb_gradcheck.jax as tj

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, size=x_shape[0]))
    params0 = model.init(jax.random.PRNGKey(0), x)

    def loss(params):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()

    def trainer(tx, callback=False):
        def step(params, opt_state):
            grads = jax.grad(loss)(params)
            if callback:
                norms = {"/".join(str(k.key) for k in path[1:-1]): jnp.linalg.norm(g) for path, g in _leaves(grads)}
                jax.debug.callback(kept.append, norms)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return jax.jit(step, donate_argnums=(0, 1))

    kept = []
    ways = {}
    closers = []

    def way(name, tx, every=None, callback=False):
        step = trainer(tx, callback)
        state = {"params": jax.tree_util.tree_map(jnp.copy, params0), "count": 0}
        state["opt"] = tx.init(state["params"])
        writer = tj.GradientWriter(f"{logdir}/{name}") if every else None
        if writer:
            closers.append(writer.close)

        def run():
            for _ in range(inner):
                state["params"], state["opt"] = step(state["params"], state["opt"])
                if writer:
                    writer.write(state["opt"], state["count"])
                state["count"] += 1
            jax.block_until_ready(state["params"])

        run()  # compile and warm up
        ways[name] = run

    way("bare", optax.adam(1e-3))
    for every in (1, 10):
        way(f"monitor_every{every}", tj.monitor(optax.adam(1e-3), every_n_steps=every), every)
    way("debug_callback_every1", optax.adam(1e-3), callback=True)
    del kept[:]
    return ways, closers


def _leaves(tree):
    import jax

    return jax.tree_util.tree_flatten_with_path(tree)[0]


def run(quick=False):
    """Measures the monitor's step time against the bare step; returns result rows (benchmarks.common.row)."""
    import jax

    rows = []
    repeats, inner = (5, 5) if quick else (11, 20)
    device = jax.devices()[0].device_kind
    for kind, name, model, x_shape in _models(quick, jax.default_backend() != "cpu"):
        started = time.time()
        with tempfile.TemporaryDirectory() as logdir:
            ways, closers = _ways(model, x_shape, logdir, inner)
            times = interleaved(ways, repeats, 1)
            for close in closers:
                close()
        bare = times["bare"] / inner
        for every in (1, 10):
            target = TARGET_EVERY10.get(kind) if every == 10 else None
            value = times[f"monitor_every{every}"] / inner
            rows.append(
                row(
                    f"step time, {name} ({device}), tb_gradcheck.jax, every {every}",
                    bare * 1e3,
                    value * 1e3,
                    "ms",
                    target,
                )
            )
        value = times["debug_callback_every1"] / inner
        rows.append(
            row(
                f"step time, {name} ({device}), per-layer norms by jax.debug.callback, every 1",
                bare * 1e3,
                value * 1e3,
                "ms",
            )
        )
        print(f"jax_writer: {name}, {time.time() - started:.0f} s", flush=True)
    return rows
