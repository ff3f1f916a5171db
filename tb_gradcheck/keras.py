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

import os
import threading
import warnings
import weakref

# tb_gradcheck/keras.py is this module, `tb_gradcheck.keras`; an absolute
# import (the only kind Python 3 has) still finds the top-level Keras 3
# package, unless the tb_gradcheck/ folder itself is put on sys.path.
import keras
import tensorflow as tf

from tb_gradcheck import checks
from tb_gradcheck import replica
from tb_gradcheck import summary
from tb_gradcheck import units
from tb_gradcheck import updates
from tb_gradcheck import validate

# The optimizer that GradientCallback was last attached to, and by which
# callback: a fit that raised outside the training step (in another callback,
# say) never reaches on_train_end, and the next attach detaches that one first.
_ATTACHED = weakref.WeakKeyDictionary()
# Steps a LossScaleOptimizer skipped, per optimizer (a host int64 variable),
# kept across fit() calls so that the step axis never runs backwards.
_SKIPPED = weakref.WeakKeyDictionary()

# The hooked methods (see the module docstring).
_APPLIED_HOOK = "_all_reduce_sum_gradients"
_FINITE_HOOK = "check_finite"
# The optimizer-view hooks (tb_gradcheck.updates): ``apply`` of the optimizer
# that updates the weights (the inner one under a LossScaleOptimizer, which
# calls it only for a finite step) is bracketed to measure the update it
# makes, and the write happens after it; ``_backend_apply_gradients`` is
# where Keras clips (its first line), so its arguments are the gradients
# before clipping.
_UPDATE_HOOK = "apply"
_CLIP_HOOK = "_backend_apply_gradients"
_CLIP_ATTRIBUTES = ("clipnorm", "global_clipnorm", "clipvalue")


class GradientCallback(keras.callbacks.Callback):
    """Writes per-layer statistics of the gradients ``model.fit`` applies, for the Gradients tab.

    Writes into ``log_dir/train``, the run ``keras.callbacks.TensorBoard(log_dir)``
    writes its training scalars to, so the two callbacks given the same
    ``log_dir`` make one run with aligned steps (see the module docstring for
    what a step is). The event file is opened when training begins and
    closed when it ends; under ``MultiWorkerMirroredStrategy`` only the chief
    opens one.

    Works with the compiled train step (the default), ``run_eagerly=True``,
    ``steps_per_execution > 1``, ``tf.distribute`` strategies and mixed
    precision. XLA (``jit_compile=True``, the default on a GPU without a
    distribution strategy) cannot run summary ops inside the compiled step,
    so the callback turns it off for the fits it records, with a warning.

    Training is not changed: the weights and optimizer state after a fit with
    this callback are bit-identical to those after the same fit without it.

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
      log_dir: Directory given to ``keras.callbacks.TensorBoard`` (or the
        parent of the run directories); the statistics go to
        ``log_dir/train``.
      every_n_steps: Int, default 1. Write every step, or every N steps with
        the last, mean, max, min and sum over the steps since the previous
        write (see ``GradientWriter``).
      check_every_n_steps: Int or None (default). Every this many steps, run
        the gradient check (``tb_gradcheck.checks``) on ``check_data`` and
        write its summaries. The check evaluates the model with
        ``training=False`` (no Dropout, BatchNorm moving statistics) and
        leaves every weight and training state as it found it.
      check_data: The batch the check uses: ``(x, y)`` or
        ``(x, y, sample_weight)``, arrays or tensors. Required with
        ``check_every_n_steps``.

    Raises:
      TypeError: ``log_dir`` is not a path or ``check_data`` not a tuple.
      ValueError: A count that is not a positive integer, or
        ``check_every_n_steps`` without ``check_data``.
    """

    def __init__(self, log_dir, *, every_n_steps=1, check_every_n_steps=None, check_data=None):
        super().__init__()
        log_dir = validate.path(log_dir, "log_dir")
        every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
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
        self.log_dir = log_dir
        self.every_n_steps = every_n_steps
        self.check_every_n_steps = check_every_n_steps
        self.check_data = None if check_data is None else tuple(check_data)
        self._session = None
        self._in_batch = False
        self._warned = set()

    # -- Keras hooks ---------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._finish()  # an earlier fit of this callback that raised outside the step
        if self.check_data is not None and self.check_every_n_steps is None:
            warnings.warn(
                "GradientCallback got `check_data` but no `check_every_n_steps`, so no gradient check "
                "will run. Pass check_every_n_steps=N to check every N steps.",
                stacklevel=2,
            )
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            warnings.warn(
                "GradientCallback found no optimizer on the model (compile it with one), "
                "so it records nothing in this fit.",
                stacklevel=2,
            )
            return
        target = optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer
        if not callable(getattr(target, _APPLIED_HOOK, None)):
            warnings.warn(
                f"GradientCallback cannot record the gradients of a {type(target).__name__}: it has no "
                f"`{_APPLIED_HOOK}` (expected on Keras 3 optimizers with the TensorFlow backend; "
                f"this is Keras {keras.__version__} with backend {keras.backend.backend()!r}). "
                "Nothing is recorded in this fit.",
                stacklevel=2,
            )
            return
        self._warn_if_window_too_long()
        previous = _ATTACHED.get(optimizer)
        if previous is not None and previous is not self:
            warnings.warn(
                "Another GradientCallback was still attached to this optimizer (an earlier fit that raised, "
                "or two GradientCallbacks in one fit); it is detached and only this one records.",
                stacklevel=2,
            )
            previous._finish()
        self._session = _Session(self, optimizer, target)
        _ATTACHED[optimizer] = self
        # fit() built (or reused) the train function before calling
        # on_train_begin, and the loop looks it up on every step: a new one,
        # traced on first use, goes through the hooked optimizer.
        self.model.make_train_function(force=True)
        self.model.train_function = self._guard(self.model.train_function)

    def on_train_batch_begin(self, batch, logs=None):
        self._in_batch = True

    def on_train_batch_end(self, batch, logs=None):
        if self._session is not None and self.check_every_n_steps is not None:
            self._session.maybe_check()

    def on_train_end(self, logs=None):
        self._finish()

    # -- internals -----------------------------------------------------------

    def _warn_if_window_too_long(self):
        params = self.params or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        if not steps or not epochs:
            return
        total = int(steps) * int(epochs)
        if self.every_n_steps > total:
            warnings.warn(
                f"GradientCallback(every_n_steps={self.every_n_steps}) is longer than this fit "
                f"({total} steps): only the partial window is written, once, when training ends.",
                stacklevel=2,
            )

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=2)

    def _guard(self, function):
        """The hooked train function, which detaches the callback when it is not in a step of its own fit.

        It detaches when the step raises (other than fit's end-of-data
        signals), and when it is called outside this callback's
        on_train_batch_begin/end: a fit that raised past on_train_end left it
        in ``model.train_function``, and a later fit without this callback
        reuses it. That call runs a clean function instead.
        """
        callback, model = self, self.model

        def train_function(iterator):
            if not callback._in_batch or callback._session is None:
                callback._finish()
                model.make_train_function(force=True)
                return model.train_function(iterator)
            # One call per on_train_batch_begin: another callback that raises
            # before this one's on_train_batch_end must not leave it set.
            callback._in_batch = False
            try:
                return function(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise
            except BaseException:
                callback._finish()
                raise

        return train_function

    def _finish(self):
        """Detaches from the optimizer, drops the hooked train function and closes the writer."""
        session, self._session = self._session, None
        if session is None:
            return
        try:
            session.detach()
        finally:
            if _ATTACHED.get(session.optimizer) is self:
                del _ATTACHED[session.optimizer]
            # The traced function holds the hooks and this writer; the next
            # fit must trace a clean one.
            self.model.train_function = None
            session.restore_model()
            session.writer.close()


class _Session:
    """One fit's hooks, writer and state."""

    def __init__(self, callback, optimizer, target):
        self.callback = callback
        self.model = callback.model
        self.optimizer = optimizer
        self.target = target
        self.loss_scale = optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else None
        self.strategy = self.model.distribute_strategy
        self.writer = summary.GradientWriter(
            os.path.join(callback.log_dir, "train"),
            every_n_steps=callback.every_n_steps,
            unit_axes=units.unit_axes(self.model),
        )
        # Read inside the traced step, so a train function left behind by a
        # fit that raised past this callback writes nothing once detached.
        self.enabled = replica.host_variable(True, tf.bool, "tb_gradcheck_enabled")
        self.skipped = None
        if self.loss_scale is not None:
            self.skipped = _SKIPPED.get(optimizer)
            if self.skipped is None:
                self.skipped = replica.host_variable(0, tf.int64, "tb_gradcheck_skipped")
                _SKIPPED[optimizer] = self.skipped
            # The skipped count at this fit's previous write (updates.LossScale).
            self.skipped_written = replica.host_variable(self.skipped.numpy(), tf.int64, "tb_gradcheck_skipped")
        self.last_check = None
        self.jit_compile = None
        if self.model.jit_compile and not self.model.run_eagerly:
            self.callback._warn_once(
                "jit",
                "GradientCallback turns XLA off (jit_compile=False) for this fit: summary ops cannot run "
                "inside an XLA-compiled train step. It is turned back on when training ends.",
            )
            self.jit_compile = self.model.jit_compile
            self.model.jit_compile = False
        self.saved = []
        # The apply() being traced (see _update_hook), per thread: under
        # MirroredStrategy each replica traces its step in a thread of its own.
        self._calls = threading.local()
        self.clips = any(getattr(target, a, None) for a in _CLIP_ATTRIBUTES)
        self._attach(target, _APPLIED_HOOK, self._applied_hook)
        # Gradient accumulation updates inside a cond branch, whose tensors
        # cannot reach a bracket outside it: there the gradients are recorded
        # from the applied hook as before, without the optimizer columns.
        self.has_update_hook = not getattr(target, "gradient_accumulation_steps", None)
        if self.has_update_hook:
            self._attach(target, _UPDATE_HOOK, self._update_hook)
            if self.clips and callable(getattr(target, _CLIP_HOOK, None)):
                self._attach(target, _CLIP_HOOK, self._clip_hook)
        if self.loss_scale is not None:
            self._attach(self.loss_scale, _FINITE_HOOK, self._finite_hook)

    # -- hooks ---------------------------------------------------------------

    def _attach(self, obj, name, make):
        # Instance attributes set with object.__setattr__: Keras' attribute
        # tracking never sees them, so nothing is added to the optimizer's
        # checkpointed state.
        original = getattr(obj, name)
        self.saved.append((obj, name, obj.__dict__.get(name, _ABSENT)))
        object.__setattr__(obj, name, make(original))

    def detach(self):
        self.enabled.assign(False)
        for obj, name, previous in reversed(self.saved):
            if previous is _ABSENT:
                obj.__dict__.pop(name, None)
            else:
                object.__setattr__(obj, name, previous)
        self.saved = []

    def restore_model(self):
        if self.jit_compile is not None:
            self.model.jit_compile = self.jit_compile

    def _applied_hook(self, original):
        session = self

        @tf.autograph.experimental.do_not_convert
        def all_reduce_sum_gradients(grads_and_vars):
            reduced = original(grads_and_vars)
            if session.callback._session is session:
                session._record_applied(list(reduced))
            return reduced

        return all_reduce_sum_gradients

    def _update_hook(self, original):
        session = self

        @tf.autograph.experimental.do_not_convert
        def apply(grads, trainable_variables=None):
            if session.callback._session is not session:
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
            if session.callback._session is session:
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
        try:
            with updates.UpdateBracket(variables, self.writer.due(step)) as bracket:
                result = original(grads, trainable_variables)
        finally:
            self._calls.call = None
        before_clip = None
        if call["before_clip"] is not None:
            # Keras clips each replica's gradient before the all-reduce: the
            # sum of those is what the optimizer received (every replica
            # takes part in this all-reduce; one replica records).
            before_clip = replica.sum_over_replicas(self._in_order(*call["before_clip"], variables))
        if call["grads"] is None or replica.writing_replica() is False:
            return result
        extra = updates.Extra(update=bracket, before_clip=before_clip if self.clips else None,
                              loss_scale=self._loss_scale_columns(scale))
        self._write(call["grads"], variables, step, extra=extra)
        return result

    @property
    def call(self):
        return getattr(self._calls, "call", None)

    def _loss_scale_columns(self, scale):
        if scale is None:
            return None
        return updates.LossScale(scale, self.skipped, self.skipped_written)

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
        if self.call is None and replica.writing_replica() is False:
            return
        variables = self._variables()
        index = {self._key(v): i for i, v in enumerate(variables)}
        grads = [None] * len(variables)
        for g, v in grads_and_vars:
            i = index.get(self._key(v))
            if i is None:
                self.callback._warn_once(
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
        if replica.writing_replica() is False:
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
                extra = updates.Extra(update=updates.RefusedUpdate(), before_clip=unscaled if self.clips else None,
                                      loss_scale=self._loss_scale_columns(scale))
            self._write(unscaled, variables, step, check_enabled=False, extra=extra)
            return tf.constant(True)

        tf.cond(tf.logical_and(self.enabled, tf.logical_not(finite)), skipped, lambda: tf.constant(False))

    def _write(self, grads, variables, step, check_enabled=True, extra=None):
        def record():
            # keras.callbacks.TensorBoard(update_freq=N) wraps training in a
            # record_if whose condition is fixed when the step is traced;
            # these records follow their own every_n_steps instead.
            with tf.summary.record_if(True):
                self.writer.record(grads, variables, step, extra)
            return tf.constant(True)

        if check_enabled:
            tf.cond(self.enabled, record, lambda: tf.constant(False))
        else:
            record()

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
        n = self.callback.check_every_n_steps
        step = self.current_step()
        if self.last_check is None:
            self.last_check = (step - 1) // n * n if step else 0
        if step // n <= self.last_check // n or not self.strategy.extended.should_save_summary:
            return
        self.last_check = step
        self.check(step)

    def check(self, step):
        model = self.model
        x, y, *rest = self.callback.check_data
        sample_weight = rest[0] if rest else None

        def loss_fn():
            y_pred = model(x, training=False)
            return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)

        # check_gradients promises to leave every variable bit-identical; the
        # snapshot makes that true of the whole model here whatever it does.
        snapshot = [(v, v.numpy()) for v in model.variables]
        try:
            report = checks.check_gradients(loss_fn, model.trainable_variables)
        finally:
            for v, value in snapshot:
                v.assign(value)
        self.writer.write_check(report, step)


_ABSENT = object()


def _unscale(gradient, scale):
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / tf.cast(scale, gradient.values.dtype), gradient.indices,
                                gradient.dense_shape)
    return gradient / tf.cast(scale, gradient.dtype)


def _as_int64(value):
    return tf.cast(tf.convert_to_tensor(value), tf.int64)
