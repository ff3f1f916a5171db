"""Vanishing or wrong, in JAX: a Flax NNX 10 -> 256 ReLU -> 1 regression, gradient norms and checks side by side.

Writes three runs under --logdir, each with per-layer gradient statistics
from ``tb_gradcheck.jax.monitor`` around SGD inside the jitted step (every step) and a
gradient check of the float64 twin every --check-every steps:

- ``he_init``: He-initialised weights. Healthy: norms of order one, checks ok.
- ``small_init``: weights drawn with standard deviation 1e-3. Each layer's
  gradient is proportional to the other layer's weights, so the norms are
  ~100x below the healthy run's: vanishing gradients. The float64 twin's
  check calls them ok, because they are right; only the norms show the
  problem (and the findings say "vanishing").
- ``wrong_vjp``: the hidden ReLU is a ``jax.custom_vjp`` whose backward pass
  is 5% too large (standing in for a hand-written VJP with a bug). The norms
  look as healthy as ``he_init``'s; the check marks ``hidden``, the layer
  behind the bad VJP, a mismatch at every check, and ``output`` ok.

    python examples/jax_vanishing_or_wrong.py --logdir logs/jax_vanishing_or_wrong
    tensorboard --logdir logs/jax_vanishing_or_wrong

Compare the ``grad_norm`` heatmap (vanishing) with ``check_error`` (wrong).
"""

import argparse
import os
import sys

RUNS = ("he_init", "small_init", "wrong_vjp")


def relu_with_wrong_vjp(scale=1.05):
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def relu(x):
        return jnp.maximum(x, 0.0)

    def forward(x):
        return jnp.maximum(x, 0.0), x

    def backward(x, g):
        return (jnp.where(x > 0, g, 0.0) * scale,)

    relu.defvjp(forward, backward)
    return relu


def make_model(run, seed):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    init = nnx.initializers.normal(1e-3) if run == "small_init" else nnx.initializers.he_normal()
    activation = relu_with_wrong_vjp() if run == "wrong_vjp" else jax.nn.relu

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(10, 256, kernel_init=init, rngs=rngs)
            self.output = nnx.Linear(256, 1, kernel_init=init, rngs=rngs)

        def __call__(self, x):
            return self.output(activation(self.hidden(x)))

    model = Net(nnx.Rngs(seed))
    return model, lambda m, batch: jnp.mean((m(batch[0]) - batch[1]) ** 2)


def train(run, logdir, steps, check_every, seed=0):
    """Trains one run with SGD; returns the statuses of its last check, ``{layer: status}``."""
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    import tb_gradcheck.jax as tj

    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(64, 10)), jnp.float32)
    batch = (x, jnp.sin(x[:, :1]) + 0.1 * jnp.asarray(rng.normal(size=(64, 1)), jnp.float32))
    model, loss_fn = make_model(run, seed)
    # Hidden before output, as the loss reads them (and what it has no gradient path to, if anything: MISSING rows).
    order = tj.depth_order(loss_fn, model, batch)
    optimizer = nnx.Optimizer(model, tj.monitor(optax.sgd(1e-3), order=order), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        optimizer.update(model, grads)
        return loss

    statuses = {}
    with tj.GradientWriter(os.path.join(logdir, run)) as writer:
        for s in range(steps):
            if s % check_every == 0:
                # The float64 twin of the weights as they are before this step's update.
                report = tj.check_gradients(loss_fn, model, batch, dtype="float64", seed=s)
                writer.write_check(report, s)
                statuses = {r.name: r.status for r in report.layers}
            step(model, optimizer, batch)
            writer.write(optimizer, s)
    return statuses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, help="parent directory of the runs")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--check-every", type=int, default=50, help="steps between gradient checks (default 50)")
    args = parser.parse_args(argv)
    for run in RUNS:
        statuses = train(run, args.logdir, args.steps, args.check_every)
        print(f"{run}: last check {statuses}", flush=True)
    print(f"tensorboard --logdir {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
