"""GradientCallback's gradient check: every N steps of a fit, on one fixed batch, the model left as it was found."""

import warnings

import tensorflow as tf

from tb_gradcheck.check import algorithm
from tb_gradcheck.check import settle
from tb_gradcheck.tensorflow import check
from tb_gradcheck.tensorflow import float64_twin


class PeriodicCheck:
    """Runs ``check.check_gradients`` on a fixed batch once every N training steps and writes its report.

    Args:
      model: The model being fitted.
      every_n_steps: The check interval (the callback's ``check_every_n_steps``).
      data: ``(x, y)`` or ``(x, y, sample_weight)``: the batch checked.
      dtype: None: check the model, and re-check the rows it does not
        convict on a float64 twin of it (``tb_gradcheck.check.settle``);
        ``"float32"``: the model only; ``"float64"``: check a float64 twin
        of the model. The twin is built at the first check that needs it and
        its weights copied from the model at each
        (``tb_gradcheck.tensorflow.float64_twin``); the model itself is only read.
      writer: The ``GradientWriter`` the report goes to.
      strategy: The model's distribution strategy: only the process that
        writes summaries (the chief) checks.
      training: Check the training-mode gradient (``model(x, training=True)``);
        the state the loss writes is put back after every evaluation.
    """

    def __init__(self, model, every_n_steps, data, dtype, writer, strategy, training=False):
        self.model = model
        self.every_n_steps = every_n_steps
        self.data = data
        self.dtype = dtype
        self.writer = writer
        self.strategy = strategy
        self.training = training
        self.twin = None
        self.last = None  # the step of the last check; set from the first step seen

    def after_step(self, step):
        """Checks if ``step`` (the training step just taken) has crossed into a new interval since the last check."""
        n = self.every_n_steps
        if self.last is None:
            self.last = (step - 1) // n * n if step else 0
        if step // n <= self.last // n or not self.strategy.extended.should_save_summary:
            return
        self.last = step
        self.check(step)

    def check(self, step):
        x, y, *rest = self.data
        sample_weight = rest[0] if rest else None
        model_loss_fn = _loss(self.model, x, y, sample_weight, self.training)
        if self.dtype == "float64":
            report = self._twin_check(model_loss_fn, None, None)
        else:
            report = self._run(model_loss_fn, self.model, None, None)
            if self.dtype is None:
                opts = algorithm.options(algorithm.DEFAULT_PROBES, None, report.seed, "layer", None, False)
                report = settle.settle(report, lambda only: self._twin_check(model_loss_fn, opts, only))
        self.writer.write_check(report, step)

    def _twin_check(self, model_loss_fn, opts, only):
        """The float64 twin's check (over the rows ``only``, or all), its gradient held against the model's."""
        x, y, *rest = self.data
        if self.twin is None:
            try:
                self.twin = float64_twin.float64_twin(self.model)
            except TypeError as e:
                if only is None:
                    raise
                raise settle.TwinUnavailable(str(e)) from e
        float64_twin.sync_twin(self.model, self.twin)
        data = (tf.nest.map_structure(_to_float64, v) for v in (x, y, rest[0] if rest else None))
        loss_fn = _loss(self.twin, *data, self.training)
        report = self._run(loss_fn, self.twin, opts, only)
        if not self.training and self.model.dtype_policy.compute_dtype == "float32":
            # What the twin cannot see: float32 arithmetic (tb_gradcheck.tensorflow.float64_twin.float32_gap).
            # Under mixed precision the model's gradient is float16 arithmetic,
            # inexact by design, and is not held against float64.
            report = float64_twin.float32_gap(
                report, model_loss_fn, self.model.trainable_variables, loss_fn, self.twin.trainable_variables
            )
        return report

    def _run(self, loss_fn, model, opts, only):
        # check_gradients promises to leave every variable bit-identical; the
        # snapshot makes that true of the whole model here whatever it does.
        snapshot = [(v, v.numpy()) for v in model.variables]
        try:
            with warnings.catch_warnings():
                if self.training:
                    # Expected in training mode (BatchNorm's moving statistics,
                    # Dropout's seed), and put back: not news at every check.
                    warnings.filterwarnings("ignore", "loss_fn changed variables other than the ones checked")
                if opts is None:
                    # The settling, if any, is this class's: it has the model to make a twin of.
                    return check.check_gradients(loss_fn, model.trainable_variables, dtype="float32")
                return check.run(loss_fn, model.trainable_variables, opts, only)
        finally:
            for v, value in snapshot:
                v.assign(value)


def _loss(model, x, y, sample_weight, training):
    def loss_fn():
        y_pred = model(x, training=training)
        return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)

    return loss_fn


def _to_float64(value):
    if value is None:
        return None
    value = tf.convert_to_tensor(value)
    return tf.cast(value, tf.float64) if value.dtype.is_floating else value
