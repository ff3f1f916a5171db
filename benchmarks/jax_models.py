"""The JAX monitor on real models: a GPT-2-small-shaped Flax transformer and ResNet-50, against the bare step.

``python -m benchmarks --only jax_models``. Both in Flax Linen, written
here: GPT-2 small's shape (12 pre-LayerNorm blocks of width 768, 12 heads,
a 50,257-token embedding tied to the output, 1,024 positions: 124 M
parameters) and ResNet-50 (torchvision's layout with BatchNorm, whose
statistics the step carries: 25.6 M parameters). Each is trained with one
jitted adam step (parameters, BatchNorm statistics and optimizer state
donated) in four ways, timed in interleaved rounds in one run:

- bare;
- ``tb_gradcheck.jax.monitor`` around the optimizer, with the host writer
  called after every step, writing every step and every 10 steps;
- each parameter's gradient norm computed in the step and handed to the
  host by ``jax.debug.callback`` every step, where it is kept (a list
  append: the callback's cost without any file).

A timed call runs 10 steps and waits for the last, so every 10 is one write
per call. Figures are medians of the rounds, as ratios to the bare step of
the same rounds. On a CPU ResNet-50 runs only when asked for
(``RESNET_ON_CPU``). Sizes and models as for ``benchmarks.torch_models``
(``TB_GRADCHECK_BENCH_MODELS``, ``TB_GRADCHECK_BENCH_SIZE``,
``TB_GRADCHECK_BENCH_ROUNDS``): ``small`` is GPT-2 at 1 x 64 tokens and
ResNet-50 at 2 x 64 x 64 x 3, ``train`` (the default on an accelerator) 8 x
512 tokens and 64 x 224 x 224 x 3, float32; ``--quick`` a 2-block GPT-2 of
width 128 and ResNet-50 at 32 x 32.
"""

import functools
import os
import tempfile
import time

import numpy as np

from benchmarks.common import interleaved
from benchmarks.common import row
from benchmarks.common import skipped
from benchmarks.torch_models import config

STEPS_PER_CALL = 10
# Measured on the 2-core CI machine kind, loaded: XLA's CPU compilation of one ResNet-50 train step took over
# two minutes, and each of the four ways compiles its own.
RESNET_ON_CPU = "on a CPU unless asked for (--models resnet50): XLA compiles each way's step for minutes there"


def _flax_models():
    """``(GPT2, ResNet50)`` Flax Linen classes (imported late: JAX loads only when this benchmark runs)."""
    import flax.linen as nn
    import jax.numpy as jnp

    class Block(nn.Module):
        width: int
        heads: int

        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm(name="ln_1")(x)
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name="attn")(h, h, mask=mask)
            h = nn.LayerNorm(name="ln_2")(x)
            return x + nn.Dense(self.width, name="mlp_proj")(nn.gelu(nn.Dense(4 * self.width, name="mlp_fc")(h)))

    class GPT2(nn.Module):
        layers: int = 12
        width: int = 768
        heads: int = 12
        vocab: int = 50257
        positions: int = 1024

        @nn.compact
        def __call__(self, ids):
            wte = nn.Embed(self.vocab, self.width, name="wte")
            x = wte(ids) + nn.Embed(self.positions, self.width, name="wpe")(jnp.arange(ids.shape[1]))
            for i in range(self.layers):
                x = Block(self.width, self.heads, name=f"h_{i}")(x)
            return wte.attend(nn.LayerNorm(name="ln_f")(x))  # the output tied to the embedding, as GPT-2's

    norm = functools.partial(nn.BatchNorm, use_running_average=False, momentum=0.9)

    class Bottleneck(nn.Module):
        planes: int
        stride: int

        @nn.compact
        def __call__(self, x):
            out = 4 * self.planes
            h = nn.relu(norm()(nn.Conv(self.planes, (1, 1), use_bias=False)(x)))
            h = nn.relu(norm()(nn.Conv(self.planes, (3, 3), self.stride, padding=1, use_bias=False)(h)))
            h = norm()(nn.Conv(out, (1, 1), use_bias=False)(h))
            if self.stride != 1 or x.shape[-1] != out:
                x = norm()(nn.Conv(out, (1, 1), self.stride, use_bias=False)(x))
            return nn.relu(h + x)

    class ResNet50(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(norm()(nn.Conv(64, (7, 7), 2, padding=3, use_bias=False)(x)))
            x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
            for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(blocks):
                    x = Bottleneck(planes, stride if i == 0 else 1)(x)
            return nn.Dense(1000)(jnp.mean(x, axis=(1, 2)))

    return GPT2, ResNet50


def _problems(models, size, quick):
    """``[(name, variables, loss)]``: ``loss(params, extra) -> (loss, new extra)``, extra the BatchNorm statistics."""
    import jax
    import jax.numpy as jnp
    import optax

    gpt2_class, resnet_class = _flax_models()
    rng = np.random.default_rng(0)
    out = []
    for which in models:
        if which == "gpt2":
            model = gpt2_class(layers=2, width=128, heads=4, vocab=1000, positions=128) if quick else gpt2_class()
            batch, tokens = (1, 32) if quick else ((8, 512) if size == "train" else (1, 64))
            ids = jnp.asarray(rng.integers(0, model.vocab, size=(batch, tokens)))

            def loss(params, extra, model=model, ids=ids):
                logits = model.apply(params, ids)
                return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean(), extra

            variables = model.init(jax.random.PRNGKey(0), ids)
            name = f"gpt2_{model.layers}x{model.width}_b{batch}x{tokens}"
        else:
            model = resnet_class()
            batch, side = (2, 32) if quick else ((64, 224) if size == "train" else (2, 64))
            x = jnp.asarray(rng.normal(size=(batch, side, side, 3)), jnp.float32)
            y = jnp.asarray(rng.integers(0, 1000, size=batch))

            def loss(params, extra, model=model, x=x, y=y):
                logits, updated = model.apply({**params, "batch_stats": extra}, x, mutable=["batch_stats"])
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updated["batch_stats"]

            variables = model.init(jax.random.PRNGKey(0), x)
            name = f"resnet50_b{batch}x{side}"
        count = sum(leaf.size for leaf in jax.tree_util.tree_leaves(variables["params"]))
        out.append((f"{name}_{count / 1e6:.1f}M", variables, loss))
    return out


def _ways(variables, loss, logdir):
    """``{way: callable}``: each runs ``STEPS_PER_CALL`` steps of its way and waits for the last; and closers."""
    import jax
    import jax.numpy as jnp
    import optax

    import tb_gradcheck.jax as tj

    kept = []

    def trainer(tx, callback):
        def step(params, extra, opt_state):
            (_, extra), grads = jax.value_and_grad(loss, has_aux=True)(params, extra)
            if callback:
                leaves = jax.tree_util.tree_flatten_with_path(grads)[0]
                jax.debug.callback(kept.append, {jax.tree_util.keystr(p): jnp.linalg.norm(g) for p, g in leaves})
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), extra, opt_state

        return jax.jit(step, donate_argnums=(0, 1, 2))

    ways, closers = {}, []

    def way(name, tx, every=None, callback=False):
        step = trainer(tx, callback)
        params = jax.tree_util.tree_map(jnp.copy, {"params": variables["params"]})
        state = {"params": params, "extra": jax.tree_util.tree_map(jnp.copy, variables.get("batch_stats", {}))}
        state["opt"] = tx.init(params)
        state["count"] = 0
        writer = tj.GradientWriter(os.path.join(logdir, name)) if every else None
        if writer:
            closers.append(writer.close)

        def call():
            for _ in range(STEPS_PER_CALL):
                state["params"], state["extra"], state["opt"] = step(state["params"], state["extra"], state["opt"])
                if writer:
                    writer.write(state["opt"], state["count"])
                state["count"] += 1
            jax.block_until_ready(state["params"])
            del kept[:]

        call()  # compile and warm up
        ways[name] = call

    way("bare", optax.adam(1e-4))
    for every in (1, 10):
        way(f"monitor_every{every}", tj.monitor(optax.adam(1e-4), every_n_steps=every), every)
    way("debug_callback_every1", optax.adam(1e-4), callback=True)
    return ways, closers


def run(quick=False):
    """Measures the monitor's step time against the bare step; returns result rows (benchmarks.common.row)."""
    import jax

    accelerator = jax.default_backend() != "cpu"
    models, size, _, rounds, _ = config(accelerator)
    if quick:
        rounds = 2
    device = jax.devices()[0].device_kind
    rows = []
    if not accelerator and "TB_GRADCHECK_BENCH_MODELS" not in os.environ and "resnet50" in models:
        models.remove("resnet50")
        rows.append(skipped(f"jax resnet50 ({device})", RESNET_ON_CPU))
    for name, variables, loss in _problems(models, size, quick):
        started = time.time()
        with tempfile.TemporaryDirectory() as logdir:
            ways, closers = _ways(variables, loss, logdir)
            try:
                times = interleaved(ways, rounds, 1)
            finally:
                for close in closers:
                    close()
        bare = times.pop("bare") / STEPS_PER_CALL
        label = f"jax {name} ({device})"
        for way, seconds in sorted(times.items()):
            rows.append(row(f"{label} {way} / bare step", bare * 1e3, seconds / STEPS_PER_CALL * 1e3, "ms"))
        print(f"jax_models: {name}, {time.time() - started:.0f} s", flush=True)
    return rows
