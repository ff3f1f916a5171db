"""One training run of an MLP under jit, its arrays sharded over 4 host devices or on one: the sharded twin.

Run in a fresh interpreter (``XLA_FLAGS`` must be set before JAX starts):
``python tests/jax_sharded_job.py LOGDIR EVERY_N_STEPS`` writes the runs
``LOGDIR/sharded`` and ``LOGDIR/single``. Sharded: a 2 x 2 mesh, the batch split over ``data``, every kernel's output
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
    for i in range(len(WIDTHS) - 1):
        x = x @ layers[f"Dense_{i}"]["kernel"] + layers[f"Dense_{i}"]["bias"]
        x = jax.nn.relu(x) if i < len(WIDTHS) - 2 else x
    return x


def main(logdir, mode, every_n_steps):
    assert len(jax.devices()) == 4, jax.devices()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(8, 12)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
    params = init(rng)
    tx = tj.monitor(optax.adam(1e-2), every_n_steps=every_n_steps)
    if mode == "sharded":
        mesh = jax.make_mesh((2, 2), ("data", "model"))
        params = jax.tree_util.tree_map(
            lambda p: jax.device_put(p, NamedSharding(mesh, P(*([None] * (p.ndim - 1)), "model"))), params
        )
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
    kernels = [p for p in jax.tree_util.tree_leaves(params) if p.ndim == 2]
    print(
        json.dumps(
            {
                "kernel_devices": [len(k.sharding.device_set) for k in kernels],
                "kernel_replicated": [k.sharding.is_fully_replicated for k in kernels],
                "batch_devices": len(x.sharding.device_set),
                "batch_replicated": x.sharding.is_fully_replicated,
            }
        )
    )


if __name__ == "__main__":
    for mode in ("sharded", "single"):
        main(os.path.join(sys.argv[1], mode), mode, int(sys.argv[2]))
