"""One training run of an MLP under jit, its arrays sharded over 4 host devices or on one: the sharded twin.

Run in a fresh interpreter (``XLA_FLAGS`` must be set before JAX starts):
``python tests/jax_sharded_job.py LOGDIR EVERY_N_STEPS [stacked]`` writes the runs
``LOGDIR/sharded`` and ``LOGDIR/single``. With ``stacked``, the middle
layers are one stack run by ``lax.scan`` (``blocks``, a row per slice), and
a third run ``LOGDIR/sharded_stack`` splits the stack's own axis over ``model``. Sharded: a 2 x 2 mesh, the batch split over ``data``, every kernel's output
axis (its units) and every bias over ``model`` (data and model parallel).
Prints one JSON line per run: how many devices each kernel and the batch
were spread over, so the test knows the sharded run was sharded.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import tb_gradcheck.jax as tj  # noqa: E402

WIDTHS = (12, 16, 16, 8, 4)


def init(rng):
    """Parameters named as Flax Linen names them (``params/Dense_i/kernel``); plain JAX keeps the job light."""
    dense = {}
    for i, (fan_in, fan_out) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
        dense[f"Dense_{i}"] = {
            "kernel": jnp.asarray(rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in), jnp.float32),
            "bias": jnp.asarray(rng.normal(size=fan_out) * 0.5, jnp.float32),
        }
    return {"params": dense}


def apply(params, x):
    layers = params["params"]
    if "blocks" in layers:
        x = jax.nn.relu(x @ layers["Dense_0"]["kernel"] + layers["Dense_0"]["bias"])
        blocks = jax.tree_util.tree_map(unsplit_layers, layers["blocks"])
        x, _ = jax.lax.scan(lambda h, b: (jax.nn.relu(h @ b["kernel"] + b["bias"]) + h, None), x, blocks)
        return x @ layers["Dense_1"]["kernel"] + layers["Dense_1"]["bias"]
    for i in range(len(WIDTHS) - 1):
        x = x @ layers[f"Dense_{i}"]["kernel"] + layers[f"Dense_{i}"]["bias"]
        x = jax.nn.relu(x) if i < len(WIDTHS) - 2 else x
    return x


def unsplit_layers(stack):
    """A stack split along its layer axis, gathered along it (as FSDP over layers does): ``scan`` slices axis 0 whole."""
    sharding = jax.typeof(stack).sharding
    if sharding.spec and sharding.spec[0] is not None:
        return jax.sharding.reshard(stack, sharding.update(spec=P(None, *sharding.spec[1:])))
    return stack


def init_stacked(rng):
    """Dense_0 [12, 16], a stack of 4 residual blocks ``blocks`` ([4, 16, 16] and [4, 16]), Dense_1 [16, 4]."""

    def normal(*shape, scale):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    return {
        "params": {
            "Dense_0": {"kernel": normal(12, 16, scale=0.3), "bias": normal(16, scale=0.5)},
            "blocks": {"kernel": normal(4, 16, 16, scale=0.25), "bias": normal(4, 16, scale=0.5)},
            "Dense_1": {"kernel": normal(16, 4, scale=0.25), "bias": normal(4, scale=0.5)},
        }
    }


def main(logdir, mode, every_n_steps, stacked=False):
    assert len(jax.devices()) == 4, jax.devices()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(8, 12)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
    params = init_stacked(rng) if stacked else init(rng)
    order = tj.depth_order(apply, params, x) if stacked else None
    tx = tj.monitor(optax.adam(1e-2), every_n_steps=every_n_steps, order=order)
    if mode.startswith("sharded"):
        mesh = jax.make_mesh((2, 2), ("data", "model"))

        def spec(p):
            if mode == "sharded_stack" and p.ndim == 3:  # the stack's axis split: each device holds 2 layers
                return P("model", None, None)
            return P(*([None] * (p.ndim - 1)), "model")

        params = jax.tree_util.tree_map(lambda p: jax.device_put(p, NamedSharding(mesh, spec(p))), params)
        x = jax.device_put(x, NamedSharding(mesh, P("data", None)))
        y = jax.device_put(y, NamedSharding(mesh, P("data", None)))
    else:
        one = jax.devices()[0]
        params, x, y = jax.device_put((params, x, y), one)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(lambda p: jnp.mean((apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    with tj.GradientWriter(logdir) as writer:
        for s in range(5):
            params, opt_state = step(params, opt_state, x, y)
            writer.write(opt_state, s)
    kernels = [p for p in jax.tree_util.tree_leaves(params) if p.ndim >= 2]
    print(
        json.dumps(
            {
                "kernel_devices": [len(k.sharding.device_set) for k in kernels],
                "kernel_replicated": [k.sharding.is_fully_replicated for k in kernels],
                "batch_devices": len(x.sharding.device_set),
                "batch_replicated": x.sharding.is_fully_replicated,
                "stack_specs": [str(p.sharding.spec) for p in kernels if p.ndim == 3 and mode != "single"],
            }
        )
    )


if __name__ == "__main__":
    stacked = sys.argv[3:] == ["stacked"]
    for mode in ("sharded", "sharded_stack", "single") if stacked else ("sharded", "single"):
        main(os.path.join(sys.argv[1], mode), mode, int(sys.argv[2]), stacked)
