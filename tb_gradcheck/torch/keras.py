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

Cost. A step that is not written (``every_n_steps > 1``) reduces each
gradient's norm and non-finite count on its device into the window's
running state (``core.running``) and reads nothing back. A written step
copies the weights before the update (as TensorFlow's bracket does),
reduces every statistic on the device and reads them in one transfer; the
rows are made on the host by ``core.rowstats``, the definitions every
writer shares, and written through ``core.eventlog``.

Steps: a record's step is ``optimizer.iterations`` after the update (the
first update is step 1), counted on the host from the value read when the
fit begins; with ``gradient_accumulation_steps=k``, one record per update.
A failure of the callback's own (a bug, an odd variable) stops its
recording with a warning and never the fit: the hooks always call the
optimizer's own methods with the arguments they were given.
"""

import os
import warnings

import keras
import numpy as np
import torch

from tb_gradcheck import keras_fit
from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.core import running
from tb_gradcheck.core import structure
from tb_gradcheck.core import validate

APPLY_HOOK = "apply"
CLIP_HOOK = "_clip_gradients"
UPDATE_HOOK = "_backend_update_step"
CLIP_ATTRIBUTES = ("clipnorm", "global_clipnorm", "clipvalue")
UPDATE_COLUMNS = ("update_norm", "update_to_weight")
BEFORE_CLIP_COLUMN = "grad_norm_before_clip"
F64 = torch.float64
_ABSENT = object()


class GradientCallback(keras_fit.AttachedCallback):
    """Writes per-layer statistics of the gradients ``model.fit`` applies on the PyTorch backend, for the Gradients tab.

    Reached as ``tb_gradcheck.keras.GradientCallback`` when Keras' backend is
    torch. Writes into ``log_dir/train`` the TensorFlow callback's rows
    (layers by Keras path, in the order of ``model.trainable_variables``),
    statistics, windows and steps, and the optimizer columns
    ``update_norm``, ``update_to_weight`` and, when the optimizer clips,
    ``grad_norm_before_clip``. Training is not changed: the weights and
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

    def __init__(
        self,
        log_dir,
        *,
        every_n_steps=1,
        check_every_n_steps=None,
        check_data=None,
        check_dtype=None,
        check_training=False,
    ):
        super().__init__()
        self.log_dir = validate.path(log_dir, "log_dir")
        self.every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        given = {
            k: v
            for k, v in (
                ("check_every_n_steps", check_every_n_steps),
                ("check_data", check_data),
                ("check_dtype", check_dtype),
                ("check_training", check_training or None),
            )
            if v is not None
        }
        if given:
            raise ValueError(
                "Expected no gradient-check arguments on Keras' torch backend: the fit's check runs on TensorFlow. "
                "Check a PyTorch loss with tb_gradcheck.torch.check_gradients and GradientWriter.write_check. "
                f"Received: {sorted(given)}"
            )

    def on_train_begin(self, logs=None):
        self._finish()
        reason = _why_not(self.model)
        if reason is not None:
            warnings.warn(f"GradientCallback records nothing in this fit: {reason}", stacklevel=2)
            return
        session = _Session(self.model, os.path.join(self.log_dir, "train"), self.every_n_steps)
        self._attach(session)
        if self.model.jit_compile:
            warnings.warn(
                "GradientCallback runs this fit eagerly (jit_compile=False): torch.compile would trace the "
                "optimizer hooks it reads the gradients from. jit_compile is turned back on when training ends.",
                stacklevel=2,
            )
            session.jit_compile = True
            self.model.jit_compile = False
        # fit() made the train function before on_train_begin; made again,
        # it is eager when jit_compile was just turned off.
        self.model.make_train_function(force=True)
        function = self.model.train_function
        self.model.train_function = self._guard(lambda session, data: session.step(function, data), ())

    def _close(self, session):
        session.close()


def _why_not(model):
    """Why the callback cannot record this fit, or None."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return "the model has no optimizer (compile it with one)."
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return (
            "a LossScaleOptimizer is not followed on the torch backend yet; set a static `loss_scale_factor` "
            "on the optimizer instead, which is recorded unscaled."
        )
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
    """One fit's hooks on the optimizer, window and event log."""

    def __init__(self, model, run_dir, every_n_steps):
        self.model = model
        self.optimizer = optimizer = model.optimizer
        self.variables = list(model.trainable_variables)
        names = structure.unique([validate.variable_name(v) for v in self.variables])
        axes = keras_fit.keras_unit_axes(model)
        shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        self.structure = s = structure.Structure(
            names,
            [keras_fit.keras_owner(v, n) for v, n in zip(self.variables, names)],
            shapes,
            [structure.trailing_units(shape, axes.get(n, 1)) for shape, n in zip(shapes, names)],
        )
        self.index = {id(v): i for i, v in enumerate(self.variables)}
        self.every = every_n_steps
        self.accumulate = int(optimizer.gradient_accumulation_steps or 1)
        # The optimizer's micro-steps (its ``_iterations``), read once: the
        # host counts them after, so no step waits for the device.
        self.micro = int(optimizer._iterations.value)
        self.clips = any(getattr(optimizer, a, None) for a in CLIP_ATTRIBUTES)
        wanted = UPDATE_COLUMNS + ((BEFORE_CLIP_COLUMN,) if self.clips else ())
        self.columns = tuple(c for c in metadata.OPTIMIZER_STAT_COLUMNS if c in wanted)
        layers, variables = s.blocks()
        aggregates = metadata.AGGREGATES if every_n_steps > 1 else metadata.SINGLE_STEP_AGGREGATES
        self.content = metadata.stats_layout(layers, variables, aggregates, every_n_steps, self.columns)
        self.log = eventlog.EventLog(run_dir)
        self.window = None  # running.State on the gradients' device, since the last write
        self.window_steps = []
        self.last_step = None  # the newest recorded step
        self.masks = {}  # present flags -> (device tensors for running.step_columns)
        self.active = False  # inside this fit's train function
        self.broken = False
        self.warned = set()
        self.call = None  # the apply() under way
        self.jit_compile = None  # the model's, while this fit runs eagerly
        self.saved = []
        for name, make in (
            (APPLY_HOOK, self._apply_hook),
            (CLIP_HOOK, self._clip_hook),
            (UPDATE_HOOK, self._update_hook),
        ):
            original = getattr(optimizer, name)
            self.saved.append((name, optimizer.__dict__.get(name, _ABSENT)))
            # object.__setattr__: Keras' tracking never sees it, nothing joins the optimizer's state.
            object.__setattr__(optimizer, name, make(original))

    # -- the train function and the hooks ------------------------------------

    def step(self, function, data):
        """One call of Keras' train function, with the hooks recording."""
        self.active = True
        try:
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

    def _clip_hook(self, original):
        session = self

        def clip_gradients(grads):
            call = session.call
            if call is not None and call.due and session.clips:
                call.before_clip = session._safely(_norms, list(grads))
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

    def _warn_once(self, key, message):
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(message, stacklevel=4)

    # -- one update ------------------------------------------------------------

    def _begin(self):
        """The ``_Call`` of the ``apply`` about to run; at a written step, the weights before it."""
        after = self.micro + 1  # the optimizer's iterations once this apply has run
        if after % self.accumulate:
            return _Call(None, False)
        step = after // self.accumulate
        call = _Call(step, step % self.every == 0)
        if call.due:
            call.before = [v.value.detach().clone() for v in self.variables]
        return call

    def _record(self, call, grads, variables):
        """The applied gradients of ``call``'s update: into the window, and reduced in full at a written step."""
        rows = [self.index.get(id(v)) for v in variables]
        if None in rows or len(set(rows)) != len(rows) or len(grads) != len(rows):
            raise ValueError(
                "Expected the optimizer to update the model's trainable variables, each once. "
                f"Received: {len(grads)} gradients for {len(rows)} variables, "
                f"{rows.count(None)} of them not the model's"
            )
        order = np.argsort(rows)
        rows = [rows[i] for i in order]
        grads = [grads[i] for i in order]
        device = grads[0].device
        present = np.zeros(len(self.variables), bool)
        present[rows] = True
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=F64)) if grads else torch.zeros(0, dtype=F64)
        nonfinite = torch.stack([(~torch.isfinite(g)).sum().to(F64) for g in grads])
        if self.every > 1:
            self._add_to_window(norms, nonfinite, rows, present, device)
            self.window_steps.append(call.step)
        if call.due:
            where = torch.as_tensor(rows, device=device)
            before_clip = None
            if call.before_clip is not None:
                before_clip = torch.full((len(self.variables),), rowstats.MISSING, dtype=F64, device=device)
                before_clip[where] = call.before_clip[torch.as_tensor(order, device=device)]
            call.taken = (present, norms, nonfinite, grads, rows, before_clip)
        call.recorded = True

    def _add_to_window(self, norms, nonfinite, rows, present, device):
        s = self.structure
        key = present.tobytes()
        masks = self.masks.get(key)
        if masks is None:
            layer_present = np.bincount(s.layer_of, present, len(s.layer_names)) > 0
            masks = self.masks[key] = tuple(
                torch.as_tensor(a, device=device) for a in (present, s.layer_matrix(), layer_present, rows)
            )
        present_t, matrix, layer_present, where = masks
        n = len(self.variables)
        norm_v = torch.zeros(n, dtype=F64, device=device).index_copy_(0, where, norms)
        nonfinite_v = torch.zeros(n, dtype=F64, device=device).index_copy_(0, where, nonfinite)
        if self.window is None:
            rows_count = len(s.layer_names) + n
            self.window = running.init(lambda shape, v: torch.full(shape, v, dtype=F64, device=device), rows_count)
        x = running.step_columns(torch, norm_v, nonfinite_v, present_t, matrix, layer_present)
        self.window = running.add(torch, self.window, x)

    def _end(self, call):
        """After ``apply``: counts the update, and writes it at a written step."""
        if call.step is None:
            return
        if not call.recorded:
            message = f"GradientCallback found an update that did not go through the optimizer's `{UPDATE_HOOK}`"
            self._warn_once("recorded", message + ": it is not recorded.")
            return
        self.last_step = call.step
        if call.due:
            self._write(call)

    def _write(self, call):
        s = self.structure
        present, norms, nonfinite, grads, rows, before_clip = call.taken
        units = [s.variable_units[i] for i in rows]
        parts = [norms, nonfinite, torch.stack([_max_abs(g) for g in grads]), _nonzeros(grads)]
        after = [v.value.detach() for v in self.variables]
        parts.append(torch.stack(torch._foreach_norm(call.before, 2, dtype=F64)))
        diffs = [a.float() - b.float() for a, b in zip(after, call.before)]
        parts.append(torch.stack(torch._foreach_norm(diffs, 2, dtype=F64)) ** 2)
        if before_clip is not None:
            parts.append(before_clip)
        dead = [_dead(g, u) for g, u in zip(grads, units)]
        parts.append(torch.cat(dead).to(F64) if dead else torch.zeros(0, dtype=F64))
        flat = torch.cat([p.reshape(-1).to(F64) for p in parts]).cpu().numpy()  # the one read of the step
        p, v = len(rows), len(self.variables)
        norm, nonfinite, max_abs, nonzero = (flat[k * p : (k + 1) * p] for k in range(4))
        weights, update_squares = flat[4 * p : 4 * p + v], flat[4 * p + v : 4 * p + 2 * v]
        offset = 4 * p + 2 * v
        if before_clip is not None:
            before_clip, offset = flat[offset : offset + v], offset + v
        reductions = rowstats.Reductions(present, norm, nonfinite, max_abs, nonzero, flat[offset:] > 0.5)
        windowed = self.every > 1
        layer, variable = rowstats.rows(reductions, s, weights, onset=windowed)
        slabs = np.concatenate([layer, variable])[None]
        if windowed:
            state = self._take_window(call.step)
            slabs = rowstats.window_slabs(state, call.step, _both(weights, s), last=slabs[0])
        values = rowstats.optimizer_values(s, weights, update_squares, before_clip)
        self._stats(slabs, values, call.step)

    def _take_window(self, step):
        state = running.to_numpy(self.window, lambda t: t.cpu().numpy(), self.window_steps)
        self.window, self.window_steps = None, []
        return state

    def _stats(self, slabs, values, step):
        n_layers = len(self.structure.layer_names)
        layer, variable = rowstats.fill(slabs[:, :n_layers], slabs[:, n_layers:], self.columns, values)
        self.log.stats(self.content, layer, variable, step)

    # -- the end of the fit ----------------------------------------------------

    def detach(self):
        for name, previous in reversed(self.saved):
            if previous is _ABSENT:
                self.optimizer.__dict__.pop(name, None)
            else:
                object.__setattr__(self.optimizer, name, previous)
        self.saved = []

    def close(self):
        """Writes the window under way (the steps since the last write), closes the log, and puts jit_compile back."""
        try:
            if self.window is not None and self.window_steps and not self.broken:
                self._safely(self._write_partial)
        finally:
            self.log.close()
            if self.jit_compile is not None:
                self.model.jit_compile = self.jit_compile

    def _write_partial(self):
        step = self.window_steps[-1]
        with torch.no_grad():
            weights = torch.stack(torch._foreach_norm([v.value.detach() for v in self.variables], 2, dtype=F64))
        weights = weights.cpu().numpy()
        slabs = rowstats.window_slabs(self._take_window(step), step, _both(weights, self.structure))
        self._stats(slabs, None, step)


def _norms(tensors):
    """float64 L2 norms of ``tensors``, on their device (float64 squares: no over- or underflow of float32's)."""
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=F64))


def _max_abs(g):
    # NaN propagates through amax, as the stored definition wants.
    return g.abs().amax().to(F64) if g.numel() else torch.zeros((), dtype=F64, device=g.device)


def _nonzeros(grads):
    return torch.stack([torch.count_nonzero(g).to(F64) for g in grads])  # NaN counts as nonzero


def _dead(g, units):
    """bool ``[units]``: whether each unit (an index of the trailing axes) has an all-zero gradient."""
    if units == 0 or g.numel() == 0:
        return torch.ones(units, dtype=torch.bool, device=g.device)
    return (g.reshape(-1, units) == 0).all(dim=0)


def _both(per_variable, s):
    """float64 ``[L + V]``: layer norms then the per-variable ones."""
    return np.concatenate([rowstats.combine_norms(per_variable, s), per_variable])
