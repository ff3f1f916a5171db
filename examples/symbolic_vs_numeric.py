"""Symbolic vs numeric gradients of a 10 -> 10 -> 10 -> 1 ReLU network with MSE, per variable.

Trains the network on random data for --steps steps (gradient statistics at
every step, a per-variable gradient check every --check-every steps, all
written to --logdir for the Gradients tab), then prints, for every variable:

- from ``tb_gradcheck.check_gradients``: the symbolic (backprop) and numeric
  (central difference) directional derivatives, their difference, the
  relative error, the noise floor and the verdict, at 4 loss evaluations
  per probe;
- for comparison, ``tf.test.compute_gradient``'s full symbolic and numeric
  Jacobians: the largest elementwise difference and the relative error of
  the whole gradient, at 2 loss evaluations per parameter.

    python examples/symbolic_vs_numeric.py --logdir logs/symbolic_vs_numeric

A ReLU network is piecewise linear: where a step crosses a kink the two
gradients legitimately differ, and the check says "inconclusive" there
rather than "mismatch". compute_gradient's fixed step (2**-10) crosses
kinks far more often, and its float32 differences carry rounding error of
~1e-4 of the derivative.
"""

import argparse
import os
import sys

import numpy as np


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, help="run directory to write")
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--check-every", type=int, default=20, help="steps between checks (default 20)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data and weights (default 0)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tensorflow as tf

    import tb_gradcheck

    tf.keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x = tf.constant(rng.normal(size=(args.batch, 10)), tf.float32)
    y = tf.constant(rng.normal(size=(args.batch, 1)), tf.float32)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((10,)),
            tf.keras.layers.Dense(10, activation="relu", name="dense_0"),
            tf.keras.layers.Dense(10, activation="relu", name="dense_1"),
            tf.keras.layers.Dense(1, name="output"),
        ],
        name="relu_net",
    )
    variables = model.trainable_variables
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)

    def mse(values):
        prediction, _ = model.stateless_call(values, [], x)
        return tf.reduce_mean(tf.square(prediction - y))

    @tf.function
    def loss_fn():
        return mse([tf.convert_to_tensor(v) for v in variables])

    with tb_gradcheck.GradientWriter(args.logdir) as writer:

        @tf.function
        def train_step(step):
            with tf.GradientTape() as tape:
                loss = loss_fn()
            grads = tape.gradient(loss, variables)
            writer.write(grads, variables, step)
            optimizer.apply_gradients(zip(grads, variables))

        for step in range(args.steps + 1):
            if step % args.check_every == 0 or step == args.steps:
                report = tb_gradcheck.check_gradients(loss_fn, variables, seed=step, granularity="variable")
                writer.write_check(report, step)
            if step < args.steps:
                train_step(tf.constant(step, tf.int64))

    print(f"After {args.steps} steps (loss {report.loss:.6g}):")
    print()
    print(report)
    print()
    print(compute_gradient_table(mse, variables, report))
    print()
    print(f"Wrote the run to {args.logdir}: tensorboard --logdir {os.path.dirname(os.path.abspath(args.logdir))}")
    return 0


def compute_gradient_table(mse, variables, report):
    """tf.test.compute_gradient per variable, beside the check's verdict."""
    import tensorflow as tf

    values = [tf.convert_to_tensor(v) for v in variables]
    names = [r.name for r in report.variables]
    width = max(len(n) for n in names)
    lines = [
        f"tf.test.compute_gradient, full Jacobians (2 loss evaluations per parameter, "
        f"{2 * sum(int(np.prod(v.shape)) for v in variables)} in all; the check above made {report.evaluations}):",
        "",
        f"{'variable':<{width}}  {'params':>6}  {'max |symbolic - numeric|':>24}  {'relative':>9}  check",
    ]
    for i, (name, row) in enumerate(zip(names, report.variables)):

        def loss_of(w, i=i):
            return mse(values[:i] + [w] + values[i + 1 :])

        (symbolic,), (numeric,) = tf.test.compute_gradient(loss_of, [values[i]])
        difference = np.max(np.abs(symbolic - numeric))
        relative = np.linalg.norm(symbolic - numeric) / max(np.linalg.norm(symbolic), 1e-30)
        lines.append(f"{name:<{width}}  {symbolic.size:>6}  {difference:>24.3e}  {relative:>9.2e}  {row.status}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
