"""The model.fit callback: statistics of the gradients the optimizer applies, beside keras.callbacks.TensorBoard.

``GradientCallback`` does not compute gradients of its own. While ``fit``
runs it hooks the model's optimizer at the one point where Keras 3 (as
TensorFlow 2.21 ships it) holds the gradient it is about to apply, and
records that gradient:

- after loss-scale unscaling (``LossScaleOptimizer`` under
  ``mixed_float16``, or a static ``loss_scale_factor``),
- after gradient accumulation (one record per optimizer update, of the
  averaged accumulated gradient),
- after clipping (``clipnorm``, ``clipvalue``, ``global_clipnorm``): the
  records show what moves the weights, so a clipped explosion shows as the
  clip norm; ``grad_nonfinite`` still counts NaN and Inf, which clipping keeps,
- after the all-reduce over replicas and workers under ``tf.distribute``:
  the sum that every replica applies, recorded once per step by replica 0
  of the chief, at no extra communication.

That point is ``_all_reduce_sum_gradients`` of Keras' TensorFlow optimizer
(``keras/src/backend/tensorflow/optimizer.py``): ``apply`` calls it through
``_backend_update_step`` with exactly the gradients ``update_step`` then
receives. It is a private method, so the callback checks that it exists and
warns (and records nothing) when a Keras version has moved it.

``tb_gradcheck.keras.GradientCallback(...)`` is this class on Keras'
TensorFlow backend (``tb_gradcheck.keras.backends``); on the JAX and torch
backends it is theirs, with the same rows and steps. TensorFlow itself is
imported when a fit begins.

Steps. A record's step is ``optimizer.iterations`` after that step's update,
so step 1 is the first update: the step ``keras.callbacks.TensorBoard``
gives batch 1 with ``update_freq="batch"``, and the step its
``evaluation_*_vs_iterations`` scalars use. Under a ``LossScaleOptimizer`` a
step with a non-finite gradient is skipped and does not advance
``iterations``; the callback still records it, with the unscaled gradient
that was refused (its ``grad_nonfinite`` is positive and its norm NaN or
Inf), and counts it: from then on the step is ``iterations`` plus the steps
skipped so far, so every training step keeps its own column and the axis
still matches TensorBoard's batch axis. The count lives as long as the
optimizer object; a run restored from a checkpoint starts it again at zero.
"""

import warnings

# This module is `tb_gradcheck.tensorflow.keras`; an absolute
# import (the only kind Python 3 has) still finds the top-level Keras 3
# package, unless the tb_gradcheck/tensorflow/ folder itself is put on sys.path.
import keras

from tb_gradcheck.core import validate
from tb_gradcheck.keras import callback


class GradientCallback(callback.GradientCallback):
    """Writes per-layer statistics of the gradients ``model.fit`` applies, for the Gradients tab.

    Writes into ``log_dir/train``, the run ``keras.callbacks.TensorBoard(log_dir)``
    writes its training scalars to, so the two callbacks given the same
    ``log_dir`` make one run with aligned steps (see the module docstring for
    what a step is). The event file is opened when training begins and
    closed when it ends; under ``MultiWorkerMirroredStrategy`` only the chief
    opens one.

    Works with the compiled train step (the default), ``run_eagerly=True``,
    ``steps_per_execution > 1``, ``tf.distribute`` strategies and mixed
    precision. With XLA (``jit_compile=True``, the default on a GPU without
    a distribution strategy) the statistics are computed inside the compiled
    step and written after it (with ``every_n_steps > 1`` the steps between
    writes run a second compiled train function, which takes only what the
    window reduces: one more compilation per fit); XLA is turned off for the fit, with a
    warning, only with ``steps_per_execution > 1``, several replicas or a
    ``LossScaleOptimizer`` (see ``fit_hooks.why_not_compiled``).

    Training is not changed: the callback only reads, and the weights and
    optimizer state after a fit with it are those of the same fit without it,
    bit for bit unless TensorFlow's graph optimizer orders a sum differently
    because of the extra reads (one float32 rounding; README, "Cost and side
    effects").

    Example:

        model.fit(
            dataset,
            epochs=10,
            callbacks=[
                keras.callbacks.TensorBoard("logs/run1", update_freq="batch"),
                tb_gradcheck.keras.GradientCallback("logs/run1"),
            ],
        )

    Args:
      log_dir, every_n_steps: As ``tb_gradcheck.keras.GradientCallback``'s.
      activations: Bool, default False. Record each layer row's output at
        the written steps (``tb_gradcheck.keras.activations`` says what and
        where). The columns are made inside the step, so XLA stays on.
        Refused (ValueError) with several replicas.
      check_every_n_steps: Int or None (default). Every this many steps, run
        the gradient check (``tb_gradcheck.tensorflow.check``) on ``check_data`` and
        write its summaries. The check evaluates the model with
        ``training=False`` (no Dropout, BatchNorm moving statistics) and
        leaves every weight and training state as it found it.
      check_data: The batch the check uses: ``(x, y)`` or
        ``(x, y, sample_weight)``, arrays or tensors. Required with
        ``check_every_n_steps``.
      check_dtype: None (default), ``"float32"`` or ``"float64"``. None
        checks the model and re-checks the rows it does not convict
        (inconclusive, or ok only within float32's 1%) on a float64 twin of it (``tb_gradcheck.check.settle``; their verdicts are
        the twin's, marked so in the stored check); ``"float32"`` checks the
        model only. With ``"float64"`` the
        check runs on a float64 twin of the model (``float64_twin``), its
        weights copied from the model at every check, the model itself
        untouched: it resolves ~1e-7 of a derivative instead of ~3e-3, so
        errors confined to part of a layer are caught at the same cost. In
        inference mode it also holds the model's own gradient against the
        twin's (``float32_gap``: bugs of float32 arithmetic alone).
      check_training: Bool, default False. Check the training-mode gradient
        (``model(x, training=True)``: Dropout on, BatchNorm on the batch's
        statistics), the one ``fit`` applies, instead of the inference-mode
        one: a backward pass wrong only in training (a mask the custom
        gradient forgets) is then in reach. The state the loss writes
        (BatchNorm's moving statistics, Dropout's seed) is put back after
        every evaluation, so each sees the same masks and the fit is left
        as it was. ``float32_gap`` is skipped: the twin draws masks of its own.

    Raises:
      TypeError: ``log_dir`` is not a path or ``check_data`` not a tuple.
      ValueError: A count that is not a positive integer, or
        ``check_every_n_steps`` without ``check_data``.
    """

    BACKEND = "TensorFlow"
    ACTIVATIONS = True

    def _take_check(self, *, check_every_n_steps, check_data, check_dtype, check_training):
        if check_every_n_steps is not None:
            check_every_n_steps = validate.positive_int(check_every_n_steps, "check_every_n_steps")
            if check_data is None:
                raise ValueError(
                    "Expected `check_data` (a batch `(x, y)` to check the gradients on) with "
                    f"`check_every_n_steps`. Received: check_every_n_steps={check_every_n_steps}, check_data=None"
                )
        if check_data is not None and (not isinstance(check_data, (tuple, list)) or len(check_data) not in (2, 3)):
            raise TypeError(
                "Expected `check_data` to be a tuple `(x, y)` or `(x, y, sample_weight)`. "
                f"Received: {type(check_data).__name__}"
                + (f" of length {len(check_data)}" if isinstance(check_data, (tuple, list)) else "")
            )
        self.check_dtype = validate.one_of(check_dtype, "check_dtype", (None, "float32", "float64"))
        self.check_training = validate.boolean(check_training, "check_training")
        self.check_every_n_steps = check_every_n_steps
        self.check_data = None if check_data is None else tuple(check_data)

    # -- the fit -------------------------------------------------------------

    def _why_not(self):
        from tb_gradcheck.tensorflow import fit_hooks  # TensorFlow: imported on this backend only

        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return "the model has no optimizer (compile it with one)."
        target = _target(optimizer)
        if not callable(getattr(target, fit_hooks.APPLIED_HOOK, None)):
            return (
                f"a {type(target).__name__} has no `{fit_hooks.APPLIED_HOOK}` (expected on Keras 3 optimizers with "
                f"the TensorFlow backend; this is Keras {keras.__version__} with backend "
                f"{keras.backend.backend()!r})."
            )
        return None

    def _open_session(self):
        from tb_gradcheck.tensorflow import fit_hooks

        if self.check_data is not None and self.check_every_n_steps is None:
            warnings.warn(
                "GradientCallback got `check_data` but no `check_every_n_steps`, so no gradient check "
                "will run. Pass check_every_n_steps=N to check every N steps.",
                stacklevel=3,
            )
        optimizer = self.model.optimizer
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        if self.activations and replicas != 1:
            # Each replica's forward sees its own slice of the batch: the step's statistics would need every
            # layer's sums and per-unit peaks all-reduced at each write, which is not built; one replica's slice
            # is not the step's batch, so nothing is recorded rather than part of it.
            raise ValueError(
                "Expected `activations=True` with a single replica: each replica's layers see only its slice of "
                f"the batch. Received: a {type(self.model.distribute_strategy).__name__} with {replicas} replicas"
            )
        return fit_hooks.Session(
            self.model,
            optimizer,
            _target(optimizer),
            log_dir=self.log_dir,
            every_n_steps=self.every_n_steps,
            check_every_n_steps=self.check_every_n_steps,
            check_data=self.check_data,
            check_dtype=self.check_dtype,
            check_training=self.check_training,
            warn_once=self._warn_once,
            activations=self.activations,
        )

    def _train_function(self):
        """The hooked train function, run in this callback's batches only (``callback.GradientCallback._guard``).

        fit() built (or reused) the train function before calling
        on_train_begin, and the loop looks it up on every step: a new one,
        traced on first use, goes through the hooked optimizer. With XLA and
        a window, a second compiled function runs the steps the session
        knows are not written (``compiled.Schedule.between_writes_next``).
        """
        import tensorflow as tf

        self.model.make_train_function(force=True)
        function = self.model.train_function
        between_writes = None
        if self._session.compiled and self.every_n_steps > 1:
            self.model.make_train_function(force=True)
            between_writes = self.model.train_function

        def step(session, iterator):
            # Set before the call: a function traces (or retraces) inside it.
            session.between_writes = between_writes is not None and session.schedule.between_writes_next()
            run = between_writes if session.between_writes else function
            if session.taps is None:
                return run(iterator)
            with session.taps.collecting():  # the layers' training calls traced (or run eagerly) in this call
                return run(iterator)

        return self._guard(step, (StopIteration, tf.errors.OutOfRangeError))

    def on_train_batch_end(self, batch, logs=None):
        if self._session is not None and self._session.compiled:
            self._session.schedule.after_call()
        if self._session is not None and self.check_every_n_steps is not None:
            self._session.maybe_check()


def _target(optimizer):
    """The optimizer whose gradients are hooked: a ``LossScaleOptimizer``'s inner one."""
    return optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer
