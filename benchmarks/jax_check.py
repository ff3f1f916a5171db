"""tb_gradcheck.jax.check_gradients against jax.test_util.check_grads, on the same float64 losses.

Models (float64, under ``jax.enable_x64``): a 4-layer tanh MLP correct, and
with a planted bug in a ``jax.custom_vjp`` (the activation after layer 2
scaled by 1.05 in its backward pass; layer 1's sign flipped; one feature of
layer 1's input gradient off by 10%); a LayerNorm MLP and a small Flax CNN,
correct. Over the same seeds (each redraws weights and batch):

- ``check_gradients(loss, params, batch, seed=seed)`` at float64's default tolerance;
- ``jax.test_util.check_grads(loss, (params,), order=1, modes=["rev"])``
  with its defaults: the reverse mode against numerical differences along
  random directions, and the VJP against the JVP.

Counted: loss evaluations (Python calls of the loss, which ``check_grads``
makes eagerly; the check's own count for ``check_gradients``, which calls a
jitted loss), wall time, planted bugs caught, and where: ``check_gradients``
names the layers it convicts, ``check_grads`` only raises.

    python -m benchmarks --only jax_check
"""

import time

SEEDS = range(3)
QUICK_SEEDS = range(1)
PLANTED = ("scale", "sign", "feature")
CLEAN = ("mlp", "layer_norm", "cnn")


def _model(kind, seed):
    """``(loss(params, batch), params, batch, the layer the bug is in or None)``, float64."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)

    def dense(n_in, n_out):
        return {
            "kernel": jnp.asarray(rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)),
            "bias": jnp.asarray(rng.normal(size=n_out) * 0.1),
        }

    x, y = jnp.asarray(rng.normal(size=(16, 6))), jnp.asarray(rng.normal(size=(16, 6)))
    if kind == "cnn":
        import flax.linen as nn

        class CNN(nn.Module):
            @nn.compact
            def __call__(self, v):
                v = jnp.tanh(nn.Conv(3, (3, 3), param_dtype=jnp.float64)(v))
                return nn.Dense(2, param_dtype=jnp.float64)(v.reshape(v.shape[0], -1))

        image = jnp.asarray(rng.normal(size=(4, 5, 5, 2)))
        net = CNN()
        params = net.init(jax.random.PRNGKey(seed), image)
        return (lambda p, b: jnp.mean((net.apply(p, b) - 1.0) ** 2)), params, image, None
    params = {"params": {f"Dense_{i}": dense(6, 6) for i in range(4)}}
    scale = {"scale": (2, 1.05), "sign": (1, -1.0)}.get(kind)

    @jax.custom_vjp
    def act(h):
        return jnp.tanh(h)

    def forward(h):
        return jnp.tanh(h), h

    def backward(h, g):
        d = g * (1 - jnp.tanh(h) ** 2)
        if kind == "feature":
            d = d.at[:, 0].multiply(1.1)
        elif scale is not None:
            d = d * scale[1]
        return (d,)

    act.defvjp(forward, backward)
    bug = {"scale": 2, "sign": 1, "feature": 1}.get(kind)

    def loss(p, batch):
        h, target = batch
        for i in range(4):
            d = p["params"][f"Dense_{i}"]
            h = h @ d["kernel"] + d["bias"]
            if kind == "layer_norm":
                h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
            h = act(h) if i == bug else jnp.tanh(h)
        return jnp.mean((h - target) ** 2)

    return loss, params, (x, y), bug


def _measure(seeds):
    import jax
    from jax import test_util

    import tb_gradcheck.jax as tj

    results = []
    with jax.enable_x64(True):
        for kind in PLANTED + CLEAN:
            for seed in seeds:
                loss, params, batch, bug = _model(kind, seed)
                calls = [0]

                def counted(p, loss=loss, batch=batch, calls=calls):
                    calls[0] += 1
                    return loss(p, batch)

                tj.check_gradients(loss, params, batch, seed=seed)  # warm-up: compile
                started = time.perf_counter()
                report = tj.check_gradients(loss, params, batch, seed=seed)
                ours = time.perf_counter() - started
                convicted = [r.name for r in report.layers if r.status == "mismatch"]
                started = time.perf_counter()
                try:
                    test_util.check_grads(counted, (params,), order=1, modes=["rev"])
                    raised = False
                except AssertionError:
                    raised = True
                theirs = time.perf_counter() - started
                results.append(
                    {
                        "model": kind,
                        "seed": seed,
                        "bug": bug,
                        "ours": {"caught": bool(convicted), "evaluations": report.evaluations, "seconds": ours},
                        "on_row": bug is not None and convicted and convicted[-1] == f"Dense_{bug}",
                        "theirs": {"caught": raised, "evaluations": calls[0], "seconds": theirs},
                    }
                )
    return results


def run(quick=False):
    """Runs both checks on every model and seed; prints the per-model table, returns the summary rows."""
    from benchmarks.common import row

    results = _measure(QUICK_SEEDS if quick else SEEDS)
    print("| model | seed | check_gradients | evaluations | check_grads | evaluations |")
    for r in results:
        ours, theirs = r["ours"], r["theirs"]
        print(
            f"| {r['model']} | {r['seed']} | {'mismatch' if ours['caught'] else 'ok'} | {ours['evaluations']} | "
            f"{'raised' if theirs['caught'] else 'passed'} | {theirs['evaluations']} |"
        )
    planted = [r for r in results if r["bug"] is not None]
    clean = [r for r in results if r["bug"] is None]
    out = []
    for what in ("evaluations", "seconds"):
        out.append(
            row(
                f"jax check_gradients vs check_grads, {what} (all {len(results)} float64 model-seeds)",
                sum(r["theirs"][what] for r in results),
                sum(r["ours"][what] for r in results),
                "evaluations" if what == "evaluations" else "s",
            )
        )
    out.append(
        row(
            f"planted custom_vjp bugs caught, check_gradients vs check_grads ({len(planted)} model-seeds)",
            sum(r["theirs"]["caught"] for r in planted),
            sum(r["ours"]["caught"] for r in planted),
            "caught",
            target=1.0,
            lower_is_better=False,
        )
    )
    out.append(
        row(
            f"planted bugs located on their layer by check_gradients (of {len(planted)}; check_grads names none)",
            len(planted),
            sum(bool(r["on_row"]) for r in planted),
            "located",
            target=1.0,
            lower_is_better=False,
        )
    )
    out.append(
        row(
            f"false alarms on correct models, check_gradients vs check_grads ({len(clean)} model-seeds)",
            max(1, sum(r["theirs"]["caught"] for r in clean)),
            sum(r["ours"]["caught"] for r in clean),
            "alarms",
        )
    )
    return out
