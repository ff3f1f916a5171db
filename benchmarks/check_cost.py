"""Cost of check_gradients in each mode against tf.test.compute_gradient on a 107,265-parameter model, same run.

Rows (``run()``), each ``{name, baseline, value, ratio, unit, target}``:

- loss evaluations: compute_gradient makes exactly 2 per parameter (central
  differences, one parameter at a time; counted on the timed subset to make
  sure), check_gradients ``1 + 8 + 4 * probes`` per layer by default (the
  same as before the zero-set probe, which a model without exact zeros in
  its gradient never runs), plus 4 per block of 64 parameters with
  ``thorough=True``, and the default count on a float64 twin. Target: at
  least 100x fewer by default, 10x thorough.
- wall time: each mode in full (median of 3 calls after one warm-up trace;
  thorough mode, ~7,000 evaluations, one call on the default's trace);
  compute_gradient on a subset of the variables (``TIMED_VARIABLES``, 8,961
  parameters), extrapolated per parameter to the whole model, because in
  full it takes minutes on a CPU. Both evaluate the loss through a traced
  tf.function, so the ratio compares methods, not eager against graph.
- detection: the same model with one layer whose custom gradient is 3%
  wrong: check_gradients flags exactly that layer (1 = yes); and on the
  correct model no layer (1 = none flagged).

The model is ``tests/check_models.py``'s MLP, the one the test suite checks.

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
TIMED_VARIABLES = (
    "mlp/dense_0/kernel",
    "mlp/dense_0/bias",
    "mlp/dense_1/bias",
    "mlp/dense_2/bias",
    "mlp/dense_3/kernel",
    "mlp/dense_3/bias",
)
# The default mode's evaluations on this model before thorough mode, the
# zero-set probe and bisection existed: 1 + 8 + 4 * 3 probes * 4 layers.
DEFAULT_EVALUATIONS_BEFORE = 57


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

    twin = tb_gradcheck.keras.float64_twin(model)
    twin_loss_of = _loss_of(tf, twin, x, y)

    @tf.function
    def twin_loss_fn():
        return twin_loss_of([tf.convert_to_tensor(v) for v in twin.trainable_variables])

    modes = {
        "default": (loss_fn, variables, {}),
        "thorough": (loss_fn, variables, {"thorough": True}),
        "float64 twin": (twin_loss_fn, twin.trainable_variables, {}),
    }
    times, reports = {}, {}
    for mode, (fn, checked, kwargs) in modes.items():
        if mode != "thorough":  # thorough reuses the default's trace
            tb_gradcheck.check_gradients(fn, checked, seed=0, **kwargs)  # warm-up: the one trace
        samples = []
        # Thorough mode makes ~7,000 evaluations here: one timed call.
        for seed in range(1 if mode == "thorough" else 3):
            start = time.perf_counter()
            reports[mode] = tb_gradcheck.check_gradients(fn, checked, seed=seed, **kwargs)
            samples.append(time.perf_counter() - start)
        times[mode] = statistics.median(samples)
    report = reports["default"]
    check_time = times["default"]
    correct_clean = all(r.ok for r in reports.values())

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
        row(
            f"loss evaluations, check_gradients vs tf.test.compute_gradient ({label})",
            baseline_evaluations,
            report.evaluations,
            "evaluations",
            target=1 / 100,
        ),
        row(
            f"wall time, check_gradients vs tf.test.compute_gradient ({label}; compute_gradient timed on "
            f"{timed_params:,} params and extrapolated per parameter)",
            baseline_time,
            check_time,
            "s",
        ),
        row(
            "loss evaluations, default mode now vs before thorough mode, zero-set probe and bisection",
            DEFAULT_EVALUATIONS_BEFORE,
            report.evaluations,
            "evaluations",
            target=1.0,
        ),
        row(
            f"loss evaluations, check_gradients(thorough=True) vs tf.test.compute_gradient ({label})",
            baseline_evaluations,
            reports["thorough"].evaluations,
            "evaluations",
            target=1 / 10,
        ),
        row(
            f"wall time, check_gradients(thorough=True) vs tf.test.compute_gradient ({label})",
            baseline_time,
            times["thorough"],
            "s",
        ),
        row(
            f"loss evaluations, check_gradients on float64_twin vs tf.test.compute_gradient ({label} model)",
            baseline_evaluations,
            reports["float64 twin"].evaluations,
            "evaluations",
            target=1 / 100,
        ),
        row(
            f"wall time, check_gradients on float64_twin vs tf.test.compute_gradient ({label} model)",
            baseline_time,
            times["float64 twin"],
            "s",
        ),
        row(
            f"detection: the 3%-wrong layer {wrong_name} is the only mismatch (flagged: {flagged})",
            None,
            float(flagged == [wrong_name]),
            "1 = yes",
            lower_is_better=False,
            limit=1.0,
        ),
        row(
            "detection: the correct model has no mismatch, in every mode",
            None,
            float(correct_clean),
            "1 = yes",
            lower_is_better=False,
            limit=1.0,
        ),
    ]


def _model(tf, wrong_layer):
    """tests/check_models.py's MLP (tanh, MSE on a fixed random batch) and its loss as a function of values."""
    from tests import check_models  # the test-support module the suite uses; the repository root is on the path

    tf.keras.utils.set_random_seed(0)
    case = check_models.mlp(SIZES, batch=BATCH, wrong_layer=wrong_layer, factor=1.03).reseed(0)
    return case.model, _loss_of(tf, case.model, case.x, case.y), case.x, case.y


def _loss_of(tf, model, x, y):
    """The MSE of ``model`` on ``(x, y)`` as a function of its trainable values, in the model's dtype."""
    dtype = model.trainable_variables[0].dtype
    x, y = tf.cast(tf.convert_to_tensor(x), dtype), tf.cast(tf.convert_to_tensor(y), dtype)

    def loss_of(values):
        prediction, _ = model.stateless_call(values, [], x)
        return tf.reduce_mean(tf.square(prediction - y))

    return loss_of


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run())
