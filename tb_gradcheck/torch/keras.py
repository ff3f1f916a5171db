"""``GradientCallback`` for Keras 3 on the PyTorch backend: ``model.fit``'s applied gradients, read as the optimizer applies them.

``tb_gradcheck.keras.GradientCallback`` is this class when Keras runs on
PyTorch (``KERAS_BACKEND=torch``); it imports torch and Keras, never
TensorFlow.

Where the gradients are. Keras' torch trainer
(``keras/src/backend/torch/trainer.py``) runs ``train_step`` eagerly:
``loss.backward()``, then ``optimizer.apply(grads, variables)`` under
``torch.no_grad``. ``apply`` (``keras/src/optimizers/base_optimizer.py``)
drops the variables without a gradient, unscales (``loss_scale_factor``)
and calls ``_backend_apply_gradients``, which averages the accumulated
gradients (``gradient_accumulation_steps``, at the update micro-step only),
clips them (``_clip_gradients``), applies weight decay and calls
``_backend_update_step(grads, variables, learning_rate)``: the gradients
the update applies, the point the TensorFlow and JAX callbacks read. Three
methods of the optimizer instance are hooked for the fit only:

- ``_backend_update_step``: the applied gradients, reduced on their device;
- ``apply``: brackets the whole update (weight decay, the rule, constraints),
  so ``update_norm`` is the change the step made to the weights and
  ``weight_norm`` the weights the gradient was taken at, as the TensorFlow
  callback's bracket around ``apply``;
- ``_clip_gradients``: its argument is the gradient before clipping
  (``grad_norm_before_clip``, with ``clipnorm``, ``clipvalue`` or
  ``global_clipnorm``; also under gradient accumulation, where it is the
  averaged gradient).

Cost (``keras_rows``, which makes the rows). A step that is not written
(``every_n_steps > 1``) takes the PyTorch writer's multi-tensor step
(``torch.reductions``): each gradient's norm and non-finite flag into a
row of its window on the device (``torch.window``), a fixed number of
operators whatever the number of variables, nothing read back. A written
step copies the weights before the update (as TensorFlow's bracket does),
reduces every statistic on the device and reads them in one transfer; the rows are made on the host by ``core.rowstats``,
the definitions every writer shares, and written through ``core.eventlog``.

Under a ``LossScaleOptimizer`` the hooks are its inner optimizer's, and
its own ``apply`` is hooked too, as the TensorFlow callback follows it:
the loss scale is read before it (``loss_scale`` column), and a step whose
inner optimizer was not called was refused: it is recorded with its
gradient unscaled (non-finite), no update, and a step of its own.

``activations=True`` (``tb_gradcheck.keras.activations``): the row layers'
``call`` is replaced for the fit (put back with the optimizer's hooks); each
training call inside the train function keeps its output, and at a written
step their sums are reduced on the device with the step's statistics and
travel in its one transfer (the forward of the updating call: with
gradient accumulation, the update's micro-batch).

Steps: a record's step is ``optimizer.iterations`` after the update (the
first update is step 1), plus the steps a loss scaler refused, counted on
the host from the value read when the fit begins; with
``gradient_accumulation_steps=k``, one record per update.
A failure of the callback's own (a bug, an odd variable) stops its
recording with a warning and never the fit: the hooks always call the
optimizer's own methods with the arguments they were given.
"""

import os
import warnings
import weakref

import keras
import numpy as np
import torch

from tb_gradcheck.keras import activations as activations_taps
from tb_gradcheck.keras import callback
from tb_gradcheck.keras import hooks
from tb_gradcheck.torch import keras_rows

APPLY_HOOK = "apply"
CLIP_HOOK = "_clip_gradients"
UPDATE_HOOK = "_backend_update_step"
CLIP_ATTRIBUTES = ("clipnorm", "global_clipnorm", "clipvalue")
# Steps a LossScaleOptimizer refused, per optimizer, kept across fits so that the step axis never runs backwards.
_SKIPPED = weakref.WeakKeyDictionary()


class GradientCallback(callback.GradientCallback):
    """Writes per-layer statistics of the gradients ``model.fit`` applies on the PyTorch backend, for the Gradients tab.

    Reached as ``tb_gradcheck.keras.GradientCallback`` when Keras' backend is
    torch. Writes into ``log_dir/train`` the TensorFlow callback's rows
    (layers by Keras path, in the order of ``model.trainable_variables``),
    statistics, windows and steps, and the optimizer columns
    ``update_norm``, ``update_to_weight`` and, when the optimizer clips,
    ``grad_norm_before_clip`` (under a ``LossScaleOptimizer``, ``loss_scale``
    and ``refused_steps``). Training is not changed: the weights and
    optimizer state after a fit with it are those without it, bit for bit
    (tested). With ``jit_compile=True`` the fit runs eagerly (a warning;
    the setting is put back when it ends): ``torch.compile`` would trace
    the hooks.

    Args:
      log_dir: Directory given to ``keras.callbacks.TensorBoard``; the
        statistics go to ``log_dir/train``.
      every_n_steps: Int, default 1. Write every step, or every N steps with
        the last, mean, max, min and sum over the N steps.
      check_every_n_steps, check_data, check_dtype, check_training: The
        TensorFlow callback's gradient check; not on the torch backend (use
        ``tb_gradcheck.torch.check_gradients``). Must be left unset.

    Raises:
      TypeError: ``log_dir`` is not a path.
      ValueError: ``every_n_steps`` is not a positive integer, or a check argument is set.
    """

    BACKEND = "torch"
    ACTIVATIONS = True
    CHECK_INSTEAD = "a PyTorch loss with tb_gradcheck.torch.check_gradients"

    def _why_not(self):
        return _why_not(self.model)

    def _open_session(self):
        run_dir = os.path.join(self.log_dir, "train")
        session = _Session(self.model, run_dir, self.every_n_steps, self._warn_once, self.activations)
        if self.model.jit_compile:
            warnings.warn(
                "GradientCallback runs this fit eagerly (jit_compile=False): torch.compile would trace the "
                "optimizer hooks it reads the gradients from. jit_compile is turned back on when training ends.",
                stacklevel=2,
            )
            session.jit_compile = True
            self.model.jit_compile = False
        return session

    def _train_function(self):
        # fit() made the train function before on_train_begin; made again,
        # it is eager when jit_compile was just turned off.
        self.model.make_train_function(force=True)
        function = self.model.train_function
        return self._guard(lambda session, data: session.step(function, data), ())


def _why_not(model):
    """Why the callback cannot record this fit, or None."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return "the model has no optimizer (compile it with one)."
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
        if optimizer.gradient_accumulation_steps:
            return "a LossScaleOptimizer over gradient accumulation is not followed on the torch backend yet."
    missing = [h for h in (APPLY_HOOK, CLIP_HOOK, UPDATE_HOOK) if not callable(getattr(optimizer, h, None))]
    if missing:
        return f"a {type(optimizer).__name__} has no {missing} (Keras {keras.__version__} moved them?)."
    if not model.trainable_variables:
        return "the model has no trainable variables."
    return None


class _Call:
    """One ``apply`` call: its step (None at a micro-step that updates nothing) and what the hooks took."""

    def __init__(self, step, due):
        self.step = step
        self.due = due
        self.before = None  # the weights before the update, at a written step
        self.before_clip = None  # per applied gradient, its norm before clipping (a float64 tensor)
        self.recorded = False  # the update hook saw this update
        self.taken = None  # at a written step, what ``_Session._write`` reduces


class _Session:
    """One fit's hooks on the optimizer and its step count; the rows are ``keras_rows.Recorder``'s."""

    def __init__(self, model, run_dir, every_n_steps, warn_once, activations=False):
        self.model = model
        self._warn_once = warn_once
        self.optimizer = model.optimizer  # the one the callback attaches to (``keras.callback``)
        scaler = model.optimizer if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) else None
        # The optimizer that updates the weights: a LossScaleOptimizer's inner one.
        optimizer = model.optimizer if scaler is None else scaler.inner_optimizer
        self.clips = any(getattr(optimizer, a, None) for a in CLIP_ATTRIBUTES)
        self.recorder = keras_rows.Recorder(
            model, run_dir, every_n_steps, self.clips, loss_scale=scaler is not None, activations=activations
        )
        self.index = {id(v): i for i, v in enumerate(self.recorder.variables)}
        self.every = every_n_steps
        self.accumulate = int(optimizer.gradient_accumulation_steps or 1)
        # The optimizer's micro-steps (its ``_iterations``), read once: the
        # host counts them after, so no step waits for the device.
        self.micro = int(optimizer._iterations.value)
        # Steps the LossScaleOptimizer refused, in this fit and earlier ones:
        # a step is ``iterations`` plus those, so each keeps its own column.
        self.scaler = scaler
        self.skipped = _SKIPPED.get(scaler, 0) if scaler is not None else 0
        self.scale = None  # the loss scale of the step under way (a tensor)
        self.active = False  # inside this fit's train function
        self.broken = False
        self.call = None  # the apply() under way
        self.jit_compile = None  # the model's, while this fit runs eagerly
        self.hooks = hooks.Hooks()
        self.hooks.replace(optimizer, APPLY_HOOK, self._apply_hook)
        self.hooks.replace(optimizer, CLIP_HOOK, self._clip_hook)
        self.hooks.replace(optimizer, UPDATE_HOOK, self._update_hook)
        if scaler is not None:
            self.hooks.replace(scaler, APPLY_HOOK, self._scaler_hook)
        # The layers' call tapped: their training outputs in this fit's train function (keras/activations.py).
        self.taps = activations_taps.Taps(model, self.recorder.variables, self.hooks) if activations else None

    # -- the train function and the hooks ------------------------------------

    def step(self, function, data):
        """One call of Keras' train function, with the hooks recording."""
        if (self.micro + 1) % self.accumulate == 0:
            # This call updates: let the previous update's gradients go before its backward pass needs the memory.
            self.recorder.last = None
        self.active = True
        try:
            if self.taps is None:
                return function(data)
            with self.taps.collecting():
                return function(data)
        finally:
            self.active = False
            self.call = None

    def _apply_hook(self, original):
        session = self

        def apply(grads, trainable_variables=None):
            recording = session.active and not session.broken
            call = session._safely(session._begin) if recording else None
            session.call = call
            try:
                out = original(grads, trainable_variables)
            finally:
                session.call = None
            if len(grads):  # apply() counts no iteration for an empty list
                session.micro += 1
            if call is not None:
                session._safely(session._end, call)
            return out

        return apply

    def _scaler_hook(self, original):
        session = self

        def apply(grads, trainable_variables=None):
            if not session.active or session.broken:
                return original(grads, trainable_variables)
            # The scale these gradients were made with, before apply halves or doubles it.
            session.scale = session._safely(lambda: session.scaler.dynamic_scale.value.detach().clone())
            micro = session.micro
            out = original(grads, trainable_variables)
            if session.micro == micro and len(grads):  # the inner optimizer was not called: a refused step
                session.skipped += 1
                _SKIPPED[session.scaler] = session.skipped
                session._safely(session._refused, list(grads), trainable_variables)
            return out

        return apply

    def _refused(self, grads, variables):
        """Records a step the LossScaleOptimizer refused: its unscaled gradients, no update."""
        variables = self.recorder.variables if variables is None else list(variables)
        pairs = [(g / self.scale, v) for g, v in zip(grads, variables) if g is not None]
        step = self.micro + self.skipped
        due = step % self.every == 0
        rows, grads, order = self._rows([v for _, v in pairs], [g for g, _ in pairs])
        # Clipping never ran: the gradient before it is the refused one.
        before_clip = keras_rows.norms64(grads) if due and self.clips else None
        taken = self.recorder.update(step, due, grads, rows, before_clip, refused=True)
        if due:
            self.recorder.write(step, taken, None, self.scale, self._activations(keep=True))

    def _clip_hook(self, original):
        session = self

        def clip_gradients(grads):
            call = session.call
            if call is not None and call.due and session.clips:
                call.before_clip = session._safely(keras_rows.norms64, grads)
            return original(grads)

        return clip_gradients

    def _update_hook(self, original):
        session = self

        def backend_update_step(grads, trainable_variables, learning_rate):
            call = session.call
            if call is not None and call.step is not None:
                session._safely(session._record, call, list(grads), list(trainable_variables))
            return original(grads, trainable_variables, learning_rate)

        return backend_update_step

    def _safely(self, fn, *args):
        """``fn(*args)``; a failure of ours stops the recording with a warning, never the fit."""
        if self.broken:
            return None
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the fit goes on whatever the callback does
            self.broken = True
            self._warn_once("broken", f"GradientCallback stops recording this fit: {type(e).__name__}: {e}")
            return None

    # -- one update ------------------------------------------------------------

    def _begin(self):
        """The ``_Call`` of the ``apply`` about to run; at a written step, the weights before it."""
        after = self.micro + 1  # the optimizer's iterations once this apply has run
        if after % self.accumulate:
            return _Call(None, False)
        step = after // self.accumulate + self.skipped
        call = _Call(step, step % self.every == 0)
        if call.due:
            call.before = [v.value.detach().clone() for v in self.recorder.variables]
        return call

    def _rows(self, variables, grads):
        """``(rows, grads, order)``: the gradients' rows, and both in row order."""
        rows = [self.index.get(id(v)) for v in variables]
        if None in rows or len(set(rows)) != len(rows) or len(grads) != len(rows) or not rows:
            raise ValueError(
                "Expected the optimizer to update the model's trainable variables, each once. "
                f"Received: {len(grads)} gradients for {len(rows)} variables, "
                f"{rows.count(None)} of them not the model's"
            )
        order = np.argsort(rows)
        return [rows[i] for i in order], [grads[i] for i in order], order

    def _record(self, call, grads, variables):
        """The applied gradients of ``call``'s update, handed to the recorder in row order."""
        rows, grads, order = self._rows(variables, grads)
        before_clip = call.before_clip
        if before_clip is not None:
            before_clip = before_clip[torch.as_tensor(order, device=before_clip.device)]
        call.taken = self.recorder.update(call.step, call.due, grads, rows, before_clip)
        call.recorded = True

    def _end(self, call):
        """After ``apply``: writes the update at a written step."""
        if call.step is None:
            return
        if not call.recorded:
            message = f"GradientCallback found an update that did not go through the optimizer's `{UPDATE_HOOK}`"
            self._warn_once("recorded", message + ": it is not recorded.")
            return
        if call.due:
            self.recorder.write(call.step, call.taken, call.before, self.scale, self._activations())

    def _activations(self, keep=False):
        """The written step's layer-output sums (its train function call's forward), or None without activations.

        ``keep``: a refused step's write leaves the outputs to the step's own write.
        """
        if self.taps is None:
            return None
        outputs = list(self.taps.outputs) if keep else self.taps.take()
        s = self.recorder.structure
        with torch.no_grad():
            return self.taps.sums([(k, o.detach()) for k, o in outputs], s.layer_of, len(s.layer_names))

    # -- the end of the fit ----------------------------------------------------

    def detach(self):
        self.hooks.restore()

    def close(self):
        """Writes the window under way (the steps since the last write), closes the log, and puts jit_compile back."""
        try:
            self._safely(self.recorder.write_partial)
        finally:
            self.recorder.log.close()
            if self.jit_compile is not None:
                self.model.jit_compile = self.jit_compile
