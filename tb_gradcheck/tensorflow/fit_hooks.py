"""GradientCallback's hooks on a Keras optimizer: where the applied gradient is recorded during one fit.

See ``tb_gradcheck.keras`` for which gradient that is and what a step is.
"""

import os
import threading
import weakref

import keras
import tensorflow as tf

from tb_gradcheck.keras import activations as layer_outputs
from tb_gradcheck.keras import hooks
from tb_gradcheck.tensorflow import branches
from tb_gradcheck.tensorflow import compiled
from tb_gradcheck.tensorflow import distributed
from tb_gradcheck.tensorflow import fit_check
from tb_gradcheck.tensorflow import optimizer
from tb_gradcheck.tensorflow import units
from tb_gradcheck.tensorflow import writer

# Steps a LossScaleOptimizer skipped, per optimizer (a host int64 variable),
# kept across fit() calls so that the step axis never runs backwards.
_SKIPPED = weakref.WeakKeyDictionary()

# The hooked methods (see tb_gradcheck.keras).
APPLIED_HOOK = "_all_reduce_sum_gradients"
FINITE_HOOK = "check_finite"
# The optimizer-view hooks (tb_gradcheck.tensorflow.optimizer): ``apply`` of the optimizer
# that updates the weights (the inner one under a LossScaleOptimizer, which
# calls it only for a finite step) is bracketed to measure the update it
# makes, and the write happens after it; ``_backend_apply_gradients`` is
# where Keras clips (its first line), so its arguments are the gradients
# before clipping.
UPDATE_HOOK = "apply"
CLIP_HOOK = "_backend_apply_gradients"
CLIP_ATTRIBUTES = ("clipnorm", "global_clipnorm", "clipvalue")


class Session:
    """One fit's hooks on the optimizer, its writer and its state.

    Args:
      model: The model being fitted.
      optimizer: Its optimizer (perhaps a ``LossScaleOptimizer``).
      target: The optimizer whose ``APPLIED_HOOK`` is hooked (the inner one
        of a ``LossScaleOptimizer``).
      log_dir: The callback's ``log_dir``; the run is ``log_dir/train``.
      every_n_steps: The callback's window length.
      check_every_n_steps: Int or None, the callback's check interval.
      check_data: The callback's check batch, or None.
      check_dtype: The callback's check dtype (``fit_check.PeriodicCheck``).
      check_training: Whether the check takes the training-mode gradient.
      warn_once: ``warn_once(key, message)``, the callback's once-per-key warning.
      activations: Whether the layers' outputs are recorded (``tb_gradcheck.keras.activations``).
    """

    def __init__(
        self,
        model,
        optimizer,
        target,
        *,
        log_dir,
        every_n_steps,
        check_every_n_steps,
        check_data,
        warn_once,
        check_dtype=None,
        check_training=False,
        activations=False,
    ):
        self.model = model
        self.warn_once = warn_once
        self.attached = False
        self.optimizer = optimizer
        self.target = target
        self.loss_scale = optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else None
        self.strategy = self.model.distribute_strategy
        self.writer = writer.GradientWriter(
            os.path.join(log_dir, "train"),
            every_n_steps=every_n_steps,
            unit_axes=units.unit_axes(self.model),
        )
        # Read inside the traced step by the refused-step hook, so a train
        # function left behind by a fit that raised past this callback counts
        # no refused step once detached (the writes need no such flag: the
        # session's writer is closed by then, and writes nothing).
        self.enabled = distributed.host_variable(True, tf.bool, "tb_gradcheck_enabled")
        self.skipped = None
        if self.loss_scale is not None:
            self.skipped = _SKIPPED.get(optimizer)
            if self.skipped is None:
                self.skipped = distributed.host_variable(0, tf.int64, "tb_gradcheck_skipped")
                _SKIPPED[optimizer] = self.skipped
            # The skipped count at this fit's previous write (optimizer.LossScale).
            self.skipped_written = distributed.host_variable(self.skipped.numpy(), tf.int64, "tb_gradcheck_skipped")
        self.checker = None
        if check_every_n_steps is not None:
            self.checker = fit_check.PeriodicCheck(
                model, check_every_n_steps, check_data, check_dtype, self.writer, self.strategy, check_training
            )
        self.jit_compile = None
        # With XLA on, the statistics are computed inside the compiled step
        # into variables and written after it (on_train_batch_end). That needs
        # one step per train-function call (on_train_batch_end runs once per
        # call), a single replica, and no refused-step hook (it writes from
        # inside the step); otherwise XLA is turned off for the fit.
        self.compiled = False
        if self.model.jit_compile and not self.model.run_eagerly:
            reason = why_not_compiled(self.model, self.strategy, self.loss_scale)
            if reason is None:
                self.compiled = True
            else:
                self.warn_once(
                    "jit",
                    f"GradientCallback turns XLA off (jit_compile=False) for this fit: {reason}. "
                    "It is turned back on when training ends.",
                )
                self.jit_compile = self.model.jit_compile
                self.model.jit_compile = False
        # When the host writes what compiled steps stashed, and which calls
        # are known not to be written.
        self.schedule = compiled.Schedule(self.writer)
        # Read while a compiled train function is traced: it runs only at
        # steps known not to be written (``compiled.Schedule.between_writes_next``).
        self.between_writes = False
        self.hooks = hooks.Hooks()
        # The layers' call tapped (their outputs kept while the train step is traced), put back with the rest.
        self.taps = layer_outputs.Taps(model, self._variables(), self.hooks) if activations else None
        # The apply() being traced (see _update_hook), per thread: under
        # MirroredStrategy each replica traces its step in a thread of its own.
        self._calls = threading.local()
        self.clips = any(getattr(target, a, None) for a in CLIP_ATTRIBUTES)
        self._attach(target, APPLIED_HOOK, self._applied_hook)
        # Gradient accumulation updates inside a cond branch, whose tensors
        # cannot reach a bracket outside it: there the gradients are recorded
        # from the applied hook as before, without the optimizer columns.
        self.has_update_hook = not getattr(target, "gradient_accumulation_steps", None)
        if self.has_update_hook:
            self._attach(target, UPDATE_HOOK, self._update_hook)
            if self.clips and callable(getattr(target, CLIP_HOOK, None)):
                self._attach(target, CLIP_HOOK, self._clip_hook)
        if self.loss_scale is not None:
            self._attach(self.loss_scale, FINITE_HOOK, self._finite_hook)
        self.attached = True

    # -- hooks ---------------------------------------------------------------

    def _attach(self, obj, name, make):
        self.hooks.replace(obj, name, make)

    def detach(self):
        self.attached = False
        self.enabled.assign(False)
        self.hooks.restore()

    def close(self):
        """After ``detach``: puts the model's ``jit_compile`` back and closes the writer (the traced function held both)."""
        if self.jit_compile is not None:
            self.model.jit_compile = self.jit_compile
        self.writer.close()

    def _applied_hook(self, original):
        session = self

        @tf.autograph.experimental.do_not_convert
        def all_reduce_sum_gradients(grads_and_vars):
            grads_and_vars = list(grads_and_vars)
            reduced = original(grads_and_vars)
            if session.attached:
                # With one replica the all-reduce changes no value, but its
                # outputs exist only once every gradient does: recording its
                # inputs lets the statistics of each gradient start as soon
                # as it is computed, beside the rest of the backward pass.
                single = session.strategy.num_replicas_in_sync == 1
                session._record_applied(grads_and_vars if single else list(reduced))
            return reduced

        return all_reduce_sum_gradients

    def _update_hook(self, original):
        session = self

        @tf.autograph.experimental.do_not_convert
        def apply(grads, trainable_variables=None):
            if not session.attached:
                return original(grads, trainable_variables)
            return session._bracketed_apply(original, grads, trainable_variables)

        return apply

    def _clip_hook(self, original):
        session = self

        @tf.autograph.experimental.do_not_convert
        def backend_apply_gradients(grads, trainable_variables):
            if session.call is not None:
                session.call["before_clip"] = (list(grads), list(trainable_variables))
            return original(grads, trainable_variables)

        return backend_apply_gradients

    def _finite_hook(self, original):
        session = self

        @tf.autograph.experimental.do_not_convert
        def check_finite(grads):
            finite = original(grads)
            if session.attached:
                session._record_if_skipped(list(grads), finite)
            return finite

        return check_finite

    # -- recording -----------------------------------------------------------

    def _variables(self):
        return list(self.model.trainable_variables)

    def _bracketed_apply(self, original, grads, trainable_variables):
        """Runs the optimizer's update between the bracket's two reads, then writes this step."""
        variables = self._variables()
        step = self._step()
        call = self._calls.call = {"grads": None, "before_clip": None}
        # The scale this step's gradients were made with: read before the
        # LossScaleOptimizer doubles it after a run of finite steps.
        scale = None if self.loss_scale is None else tf.convert_to_tensor(self.loss_scale.dynamic_scale)
        due = False if self.between_writes else self.writer.due(step)
        try:
            with optimizer.UpdateBracket(variables, due, compiled=self.compiled) as bracket:
                result = original(grads, trainable_variables)
        finally:
            self._calls.call = None
        before_clip = None
        if call["before_clip"] is not None:
            # Keras clips each replica's gradient before the all-reduce: the
            # sum of those is what the optimizer received (every replica
            # takes part in this all-reduce; one replica records).
            before_clip = distributed.sum_over_replicas(self._in_order(*call["before_clip"], variables))
        if call["grads"] is None or distributed.writing_replica() is False:
            return result
        extra = optimizer.Extra(
            update=bracket,
            before_clip=before_clip if self.clips else None,
            loss_scale=self._loss_scale_columns(scale),
            compiled=self.compiled,
        )
        self._write(call["grads"], variables, step, extra=extra)
        return result

    @property
    def call(self):
        return getattr(self._calls, "call", None)

    def _loss_scale_columns(self, scale):
        if scale is None:
            return None
        return optimizer.LossScale(scale, self.skipped, self.skipped_written)

    def _step(self):
        # Before this step's update (apply increments after the update).
        step = _as_int64(self.optimizer.iterations) + 1
        if self.skipped is not None:
            step += self.skipped
        return step

    def _in_order(self, grads, grad_variables, variables):
        """``grads`` of ``grad_variables`` as one entry per variable of ``variables`` (None where absent)."""
        index = {self._key(v): i for i, v in enumerate(variables)}
        out = [None] * len(variables)
        for g, v in zip(grads, grad_variables):
            i = index.get(self._key(v))
            if i is not None:
                out[i] = g
        return out

    def _record_applied(self, grads_and_vars):
        if self.call is None and distributed.writing_replica() is False:
            return
        variables = self._variables()
        index = {self._key(v): i for i, v in enumerate(variables)}
        grads = [None] * len(variables)
        for g, v in grads_and_vars:
            i = index.get(self._key(v))
            if i is None:
                self.warn_once(
                    "unknown",
                    f"GradientCallback: the optimizer updates {getattr(v, 'name', v)!r}, which is not in "
                    "model.trainable_variables; its gradient is not recorded.",
                )
                continue
            grads[i] = g
        if self.call is not None:
            self.call["grads"] = grads  # written after the update, by _bracketed_apply
            return
        self._write(grads, variables, self._step())

    def _record_if_skipped(self, grads, finite):
        if distributed.writing_replica() is False:
            return
        variables = self._variables()
        if len(grads) != len(variables):
            return  # not fit's own train step; the applied hook still records
        # The scale that made these gradients, read before apply() halves it.
        scale = tf.convert_to_tensor(self.loss_scale.dynamic_scale)

        def skipped():
            count = self.skipped.assign_add(1)
            step = _as_int64(self.optimizer.iterations) + count
            unscaled = [_unscale(g, scale) for g in grads]
            # The same optimizer columns as a finite step (one layout, one
            # tag): a refused step moved no weight, and clipping never ran,
            # so the gradient before clipping is the refused one.
            extra = None
            if self.has_update_hook:
                extra = optimizer.Extra(
                    update=optimizer.RefusedUpdate(),
                    before_clip=unscaled if self.clips else None,
                    loss_scale=self._loss_scale_columns(scale),
                )
            self._write(unscaled, variables, step, extra=extra, refused=True)
            return tf.constant(True)

        branches.cond(tf.logical_and(self.enabled, tf.logical_not(finite)), skipped, lambda: tf.constant(False))

    def _write(self, grads, variables, step, extra=None, refused=False):
        if self.taps is not None:
            extra = extra or optimizer.Extra(compiled=self.compiled)
            # This step's forward outputs; a refused step's write leaves them to the step's own write.
            outputs = list(self.taps.outputs) if refused else self.taps.take()
            extra.activations = optimizer.Activations(self.taps, outputs)
        # No cond on `enabled` around the write: it is false only once
        # detached, when this session's writer is closed, and a closed
        # writer writes nothing (its own guard). Inside a cond the statistics
        # would wait for every gradient and run alone, after the update.
        if self.compiled:
            # Under XLA a conditional is a computation of its own, and one
            # that takes every gradient as an operand stops XLA from fusing
            # the backward pass into the updates (a 20-layer MLP fit: 2.1x
            # the bare step with the cond, 1.7x without; even a cond over the
            # small stores cost 0.25x).
            self.writer.record_compiled(grads, variables, step, extra, between_writes=self.between_writes)
            return
        # keras.callbacks.TensorBoard(update_freq=N) wraps training in a
        # record_if whose condition is fixed when the step is traced; these
        # records follow their own every_n_steps instead.
        with tf.summary.record_if(True):
            self.writer.record(grads, variables, step, extra)

    def _key(self, variable):
        key = getattr(self.target, "_var_key", None)
        if key is not None:
            return key(variable)
        return id(getattr(variable, "value", variable))

    # -- gradient check --------------------------------------------------------

    def current_step(self):
        # .numpy(), not int(): int() of a Keras variable fails on a MirroredVariable.
        step = int(self.optimizer.iterations.numpy())
        if self.skipped is not None:
            step += int(self.skipped.numpy())
        return step

    def maybe_check(self):
        """After a batch: runs the periodic gradient check if this step is due for one."""
        self.checker.after_step(self.current_step())


def why_not_compiled(model, strategy, loss_scale):
    """Why a fit with XLA cannot record from inside the compiled step, or None if it can."""
    if int(getattr(model, "steps_per_execution", 1) or 1) != 1:
        return "steps_per_execution > 1 runs several steps per compiled call"
    if strategy.num_replicas_in_sync != 1:
        return "a distribution strategy with several replicas"
    if loss_scale is not None:
        return "a LossScaleOptimizer's refused steps are recorded from inside the step"
    return None


def _unscale(gradient, scale):
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values / tf.cast(scale, gradient.values.dtype), gradient.indices, gradient.dense_shape
        )
    return gradient / tf.cast(scale, gradient.dtype)


def _as_int64(value):
    return tf.cast(tf.convert_to_tensor(value), tf.int64)
