"""Cost of check_gradients against tf.test.compute_gradient on a 107,265-parameter model, same run.

Rows (``run()``), each ``{name, baseline, value, ratio, unit, target}``:

- loss evaluations: compute_gradient makes exactly 2 per parameter (central
  differences, one parameter at a time; counted on the timed subset to make
  sure), check_gradients ``1 + 8 + 4 * probes`` per layer. Target: at least
  100x fewer.
- wall time: check_gradients in full (median of 3 calls after one warm-up
  trace); compute_gradient on a subset of the variables (``TIMED_VARIABLES``,
  8,961 parameters), extrapolated per parameter to the whole model, because
  in full it takes minutes on a CPU. Both evaluate the loss through a traced
  tf.function, so the ratio compares methods, not eager against graph.
- detection: the same model with one layer whose custom gradient is 3%
  wrong: check_gradients flags exactly that layer (1 = yes); and on the
  correct model no layer (1 = none flagged).

    python -m benchmarks --only check_cost
"""

import os
import statistics
import sys
import time

import numpy as np

from benchmarks.common import row

SIZES = (32, 256, 256, 128, 1)
BATCH = 64
WRONG_LAYER = 1
# Timed with compute_gradient: the first layer's kernel (32 x 256), the
# output kernel (128 x 1) and every bias: 8,961 parameters, 8% of the model.
TIMED_VARIABLES = ("mlp/dense_0/kernel", "mlp/dense_0/bias", "mlp/dense_1/bias", "mlp/dense_2/bias",
                   "mlp/dense_3/kernel", "mlp/dense_3/bias")


def run(quick=False):
    """Measures both methods on the same model in this process; returns the rows.

    ``quick`` changes nothing: the measurement is already a single pass.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import tb_gradcheck

    model, loss_of, x, y = _model(tf, wrong_layer=None)
    variables = model.trainable_variables
    n_params = int(sum(np.prod(v.shape) for v in variables))

    @tf.function
    def loss_fn():
        return loss_of([tf.convert_to_tensor(v) for v in variables])

    report = tb_gradcheck.check_gradients(loss_fn, variables, seed=0)  # warm-up: the one trace
    times = []
    for seed in range(3):
        start = time.perf_counter()
        report = tb_gradcheck.check_gradients(loss_fn, variables, seed=seed)
        times.append(time.perf_counter() - start)
    check_time = statistics.median(times)
    correct_clean = report.ok

    # compute_gradient on the timed subset, one variable at a time, each
    # through a traced loss of that variable's value.
    values = [tf.convert_to_tensor(v) for v in variables]
    names = [v.path for v in variables]
    timed_params, timed_seconds, counted = 0, 0.0, 0
    for name in TIMED_VARIABLES:
        i = names.index(name)
        calls = tf.Variable(0, dtype=tf.int64, trainable=False)

        @tf.function(input_signature=[tf.TensorSpec(values[i].shape, values[i].dtype)])
        def of_one(w, i=i, calls=calls):
            calls.assign_add(1)
            return loss_of(values[:i] + [w] + values[i + 1 :])

        of_one(values[i])  # trace outside the timing
        calls.assign(0)
        start = time.perf_counter()
        tf.test.compute_gradient(of_one, [values[i]])
        timed_seconds += time.perf_counter() - start
        counted += int(calls.numpy())
        timed_params += int(np.prod(values[i].shape))
    # compute_gradient evaluates f twice per parameter for the numeric
    # Jacobian, plus twice per variable for the theoretical one (a forward
    # pass for the output's shape, then one under the tape).
    assert counted == 2 * timed_params + 2 * len(TIMED_VARIABLES), (counted, timed_params)
    baseline_evaluations = 2 * n_params + 2 * len(variables)
    baseline_time = timed_seconds * n_params / timed_params

    wrong_model, wrong_loss_of, _, _ = _model(tf, wrong_layer=WRONG_LAYER)
    wrong_vars = wrong_model.trainable_variables

    @tf.function
    def wrong_loss_fn():
        return wrong_loss_of([tf.convert_to_tensor(v) for v in wrong_vars])

    wrong = tb_gradcheck.check_gradients(wrong_loss_fn, wrong_vars, seed=0)
    flagged = [r.name for r in wrong.failures]
    wrong_name = wrong.layers[WRONG_LAYER].name

    label = f"{n_params:,} params, {len(report.layers)} layers, float32"
    return [
        # Ratios are value / baseline, as in every benchmark here: 0.01 is 100x fewer.
        row(f"loss evaluations, check_gradients vs tf.test.compute_gradient ({label})",
            baseline_evaluations, report.evaluations, "evaluations", target=1 / 100),
        row(f"wall time, check_gradients vs tf.test.compute_gradient ({label}; compute_gradient timed on "
            f"{timed_params:,} params and extrapolated per parameter)", baseline_time, check_time, "s"),
        row(f"detection: the 3%-wrong layer {wrong_name} is the only mismatch (flagged: {flagged})",
            None, float(flagged == [wrong_name]), "1 = yes", lower_is_better=False, limit=1.0),
        row("detection: the correct model has no mismatch", None, float(correct_clean), "1 = yes",
            lower_is_better=False, limit=1.0),
    ]


def _model(tf, wrong_layer):
    """The MLP (tanh, MSE on a fixed random batch) and its loss as a function of parameter values."""
    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.Input((SIZES[0],))]
    for i, units in enumerate(SIZES[1:]):
        activation = None if i == len(SIZES) - 2 else "tanh"
        if i == wrong_layer:
            layers.append(_ScaledGradient(units, 1.03, activation, name=f"dense_{i}"))
        else:
            layers.append(tf.keras.layers.Dense(units, activation=activation, name=f"dense_{i}"))
    model = tf.keras.Sequential(layers, name="mlp")
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, SIZES[0])), tf.float32)
    y = tf.constant(rng.normal(size=(BATCH, SIZES[-1])), tf.float32)

    def loss_of(values):
        prediction, _ = model.stateless_call(values, [], x)
        return tf.reduce_mean(tf.square(prediction - y))

    return model, loss_of, x, y


def _ScaledGradient(units, factor, activation, name):  # noqa: N802
    import tensorflow as tf

    class ScaledGradient(tf.keras.layers.Layer):
        """Dense layer whose kernel and bias gradients are ``factor`` times the true ones."""

        def build(self, input_shape):
            self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], units))
            self.bias = self.add_weight(name="bias", shape=(units,), initializer="zeros")

        def call(self, inputs):
            @tf.custom_gradient
            def affine(a, w, b):
                def grad(dy):
                    return (tf.matmul(dy, w, transpose_b=True), factor * tf.matmul(a, dy, transpose_a=True),
                            factor * tf.reduce_sum(dy, axis=0))

                return tf.matmul(a, w) + b, grad

            out = affine(inputs, tf.convert_to_tensor(self.kernel), tf.convert_to_tensor(self.bias))
            return tf.keras.activations.get(activation)(out)

    return ScaledGradient(name=name)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run())
