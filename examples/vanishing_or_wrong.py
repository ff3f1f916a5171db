"""Vanishing or wrong? A 10 -> 1000 ReLU -> 1 MSE network on random data, gradient norms and checks side by side.

Writes three runs under --logdir, each with per-layer gradient statistics at
every step and a per-variable gradient check every --check-every steps:

- ``he_init``: He-initialised weights. Healthy: norms of order one, checks ok.
- ``small_init``: weights drawn with standard deviation 1e-3. The gradient
  of each layer is proportional to the other layer's weights, so the norms
  are ~100x below the healthy run's: vanishing gradients. The check never
  calls them wrong, because they are not: where float32 can resolve such
  small derivatives it says "ok", elsewhere "inconclusive" (below the
  finite-difference noise floor). Only the norms heatmap shows the problem.
- ``wrong_gradient``: the output layer computes its kernel gradient with a
  5% error (a ``tf.custom_gradient``, standing in for a hand-written
  backward pass with a bug). The norms look as healthy as ``he_init``'s; the
  check marks ``output/kernel`` (and its layer) as a mismatch at every check.

Then open the runs in TensorBoard's Gradients tab:

    python examples/vanishing_or_wrong.py --logdir logs/vanishing_or_wrong
    tensorboard --logdir logs/vanishing_or_wrong

and compare the ``grad_norm`` heatmap (vanishing) with ``check_error``
(wrong). docs/gradient_check.md explains the two signals.
"""

import argparse
import os
import sys

import numpy as np

RUNS = ("he_init", "small_init", "wrong_gradient")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, help="parent directory of the runs")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--check-every", type=int, default=25, help="steps between gradient checks (default 25)")
    parser.add_argument("--hidden", type=int, default=1000, help="hidden ReLU units (default 1000)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which runs to write")
    parser.add_argument("--seed", type=int, default=0, help="seed for data and weights (default 0)")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for run in args.runs:
        report = train(run, os.path.join(args.logdir, run), args)
        print(f"== {run}: last check (step {args.steps - 1}) ==")
        print(report)
        print()
    print(f"Wrote {len(args.runs)} runs to {args.logdir}: tensorboard --logdir {args.logdir}, Gradients tab")
    return 0


def train(run, logdir, args):
    """Trains one run with SGD, writing norms every step and a per-variable check every few steps."""
    import tensorflow as tf

    import tb_gradcheck

    rng = np.random.default_rng(args.seed)
    data_x = rng.normal(size=(1024, 10)).astype(np.float32)
    data_y = rng.normal(size=(1024, 1)).astype(np.float32)
    model = build(run, args.hidden, args.seed)
    variables = model.trainable_variables
    optimizer = tf.keras.optimizers.SGD(learning_rate=1e-3)
    # The batch lives in variables, so the traced loss below reads the
    # current batch without retracing.
    x = tf.Variable(data_x[: args.batch], trainable=False)
    y = tf.Variable(data_y[: args.batch], trainable=False)

    @tf.function
    def loss_fn():
        return tf.reduce_mean(tf.square(model(x) - y))

    report = None
    with tb_gradcheck.GradientWriter(logdir) as writer:

        @tf.function
        def train_step(step):
            with tf.GradientTape() as tape:
                loss = loss_fn()
            grads = tape.gradient(loss, variables)
            writer.write(grads, variables, step)
            optimizer.apply_gradients(zip(grads, variables))

        for step in range(args.steps):
            start = (step * args.batch) % (len(data_x) - args.batch)
            x.assign(data_x[start : start + args.batch])
            y.assign(data_y[start : start + args.batch])
            if step % args.check_every == 0 or step == args.steps - 1:
                # Checked before the update, at the same weights and batch the
                # gradient statistics of this step describe.
                report = tb_gradcheck.check_gradients(loss_fn, variables, seed=step, granularity="variable")
                writer.write_check(report, step)
            train_step(tf.constant(step, tf.int64))
    return report


def build(run, hidden, seed):
    import tensorflow as tf

    if run == "small_init":
        init = tf.keras.initializers.RandomNormal(stddev=1e-3, seed=seed)
        out_init = tf.keras.initializers.RandomNormal(stddev=1e-3, seed=seed + 1)
    else:
        init = tf.keras.initializers.HeNormal(seed=seed)
        out_init = tf.keras.initializers.GlorotUniform(seed=seed + 1)
    hidden_layer = tf.keras.layers.Dense(hidden, activation="relu", kernel_initializer=init, name="hidden")
    if run == "wrong_gradient":
        output = BuggyDense(1, kernel_error=0.05, kernel_initializer=out_init, name="output")
    else:
        output = tf.keras.layers.Dense(1, kernel_initializer=out_init, name="output")
    return tf.keras.Sequential([tf.keras.Input((10,)), hidden_layer, output], name=run)


def _buggy_dense_class():
    import tensorflow as tf

    class BuggyDense(tf.keras.layers.Layer):
        """Dense layer with a hand-written backward pass whose kernel gradient is off by ``kernel_error``."""

        def __init__(self, units, kernel_error, kernel_initializer, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.kernel_error = kernel_error
            self.kernel_initializer = kernel_initializer

        def build(self, input_shape):
            self.kernel = self.add_weight(
                name="kernel", shape=(input_shape[-1], self.units), initializer=self.kernel_initializer
            )
            self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

        def call(self, inputs):
            scale = 1.0 - self.kernel_error

            @tf.custom_gradient
            def affine(a, w, b):
                def grad(dy):
                    return (
                        tf.matmul(dy, w, transpose_b=True),
                        scale * tf.matmul(a, dy, transpose_a=True),  # the bug
                        tf.reduce_sum(dy, axis=0),
                    )

                return tf.matmul(a, w) + b, grad

            return affine(inputs, tf.convert_to_tensor(self.kernel), tf.convert_to_tensor(self.bias))

    return BuggyDense


def BuggyDense(*args, **kwargs):  # noqa: N802 (a class made on first use, so --help needs no TensorFlow)
    return _buggy_dense_class()(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
