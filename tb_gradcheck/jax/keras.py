"""``GradientCallback`` for Keras 3 on the JAX backend: ``model.fit``'s applied gradients, taken inside its jitted step.

``tb_gradcheck.keras.GradientCallback`` is this class when Keras runs on JAX
(``KERAS_BACKEND=jax``); it imports JAX, optax and Keras, never TensorFlow.

Where the gradients are. Keras' JAX trainer
(``keras/src/backend/jax/trainer.py``) computes them inside its jitted
``train_step(state, data)`` and hands them to ``optimizer.stateless_apply``,
which runs ``apply`` under a ``StatelessScope``; the JAX optimizer's
``_backend_apply_gradients`` unscales (``loss_scale_factor``) and clips,
then calls ``_backend_update_step(grads, variables, learning_rate)``: the
gradients the update applies, the same point the TensorFlow callback reads
(its ``_all_reduce_sum_gradients`` is called from there). The callback hooks
that method on the optimizer instance for the fit; the hook reads the
gradients and calls the original. The weights before and after the update
are the step's input and output states' (around the hook, weight decay,
constraints and the EMA overwrite would be missed).

Where the statistics live. Keras' loop passes a fixed state, four lists of
variables, from call to call, and donates it; an extra variable would have to
join the optimizer's (and so its checkpoints, which a ``ModelCheckpoint``
mid-fit would save). Instead the callback puts its own train function in
``model.train_function``: the same ``train_step`` (the model's class's,
overrides included), jitted as Keras jits it, with the monitor's state
(``transform.MonitorState``: what the optax ``monitor`` keeps) as a second
argument and output. The hook hands the step's arrays to ``transform.advance``
within the same trace, so the statistics are taken in the step, nothing
leaves the device between writes, and the host reads the state at written
steps only (``writer.GradientWriter``, the optax writer's host side).

Steps: a record's step is ``optimizer.iterations`` after the update (the
first update is step 1), as the TensorFlow callback's; with
``gradient_accumulation_steps=k``, one record per update (the mean of the k
gradients, what the update applies); with ``steps_per_execution > 1`` every
step is still recorded (the loop over the steps of one call is the callback's).
"""

import os

import jax
import jax.numpy as jnp
import keras
import numpy as np

from tb_gradcheck.core import structure
from tb_gradcheck.core import validate
from tb_gradcheck.jax import layout
from tb_gradcheck.jax import reach
from tb_gradcheck.jax import transform
from tb_gradcheck.jax.writer import GradientWriter
from tb_gradcheck.keras import callback
from tb_gradcheck.keras import hooks
from tb_gradcheck.keras.variables import owner
from tb_gradcheck.keras.variables import unit_axes

# Called by the JAX optimizer's ``_backend_apply_gradients`` with the
# gradients after unscaling and clipping (keras/src/backend/jax/optimizer.py).
HOOK = "_backend_update_step"
# What Keras' JAX train_step differentiates: its trainable values pass
# through ``reach.tap`` there, which learns which of them the loss depends on.
LOSS_HOOK = "compute_loss_and_updates"


class GradientCallback(callback.GradientCallback):
    """Writes per-layer statistics of the gradients ``model.fit`` applies on the JAX backend, for the Gradients tab.

    Reached as ``tb_gradcheck.keras.GradientCallback`` when Keras' backend is
    JAX. Writes into ``log_dir/train`` with the TensorFlow callback's rows
    (layers by Keras path, in the order of ``model.trainable_variables``),
    statistics, windows and steps, and the optimizer columns
    ``update_norm`` and ``update_to_weight``. Training is not changed: the
    weights and optimizer state after a fit with it are those without it,
    bit for bit (tested).

    Args:
      log_dir: Directory given to ``keras.callbacks.TensorBoard``; the
        statistics go to ``log_dir/train``.
      every_n_steps: Int, default 1. Write every step, or every N steps with
        the last, mean, max, min and sum over the N steps.
      check_every_n_steps, check_data, check_dtype, check_training: The
        TensorFlow callback's gradient check; not on the JAX backend (use
        ``tb_gradcheck.jax.check_gradients``). Must be left unset.

    Raises:
      TypeError: ``log_dir`` is not a path.
      ValueError: ``every_n_steps`` is not a positive integer, or a check argument is set.
    """

    BACKEND = "JAX"
    CHECK_INSTEAD = "a JAX loss with tb_gradcheck.jax.check_gradients"

    def _why_not(self):
        return _why_not(self.model)

    def _open_session(self):
        session = _Session(self.model, os.path.join(self.log_dir, "train"), self.every_n_steps, self._warn_once)
        session.attach()
        return session

    def _train_function(self):
        """Keras' ``train_function(state, iterator)``, stepping the monitor beside the training state."""
        steps_per_execution = self.model.steps_per_execution

        def step(session, state, iterator):
            # As Keras' own loop (JAXTrainer._make_function): the first
            # batch's StopIteration ends the epoch, a later one the call.
            logs, state = session.step(state, next(iterator))
            for _ in range(steps_per_execution - 1):
                try:
                    data = next(iterator)
                except StopIteration:
                    break
                logs, state = session.step(state, data)
            return logs, state

        return self._guard(step, (StopIteration,))


def _why_not(model):
    """Why the callback cannot record this fit, or None."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return "the model has no optimizer (compile it with one)."
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return (
            "a LossScaleOptimizer applies its inner optimizer inside a lax.cond on JAX, out of the callback's "
            "reach; set a static `loss_scale_factor` on the optimizer instead, which is recorded unscaled."
        )
    if not callable(getattr(optimizer, HOOK, None)) or not callable(getattr(optimizer, "stateless_apply", None)):
        return f"a {type(optimizer).__name__} has no `{HOOK}` (Keras {keras.__version__} moved it?)."
    if keras.distribution.distribution() is not None:
        return "a keras.distribution is set (its sharded train step is not wrapped yet)."
    if keras.config.is_nnx_enabled():
        return "Keras runs with Flax NNX enabled (its nnx.jit train step is not wrapped yet)."
    return None


class _Session:
    """One fit's hook, jitted step, monitor state and writer."""

    def __init__(self, model, run_dir, every_n_steps, warn_once):
        self.model = model
        self._warn_once = warn_once
        self.optimizer = optimizer = model.optimizer
        variables = list(model.trainable_variables)
        names = structure.unique([validate.variable_name(v) for v in variables])
        axes = unit_axes(model)
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        lay = layout.Layout(
            names=tuple(names),
            owners=tuple(owner(v, n) for v, n in zip(variables, names)),
            shapes=tuple(shapes),
            units=tuple(structure.trailing_units(s, axes.get(n, 1)) for s, n in zip(shapes, names)),
            order=tuple(range(len(variables))),
            every_n_steps=every_n_steps,
            updates=True,
        )
        self.index = {id(v): i for i, v in enumerate(variables)}
        self.accumulate = int(optimizer.gradient_accumulation_steps or 1)
        # The host counts the optimizer's micro-steps (its ``_iterations``),
        # read once here: the step of each record is known without a read.
        self.micro = int(np.asarray(optimizer._iterations.value))
        self.iterations_at = next(i for i, v in enumerate(optimizer.variables) if v is optimizer._iterations)
        self.recorded = None
        self.state = transform.initial_state(lay, jnp.float32, count=self.micro // self.accumulate + 1)
        self.writer = GradientWriter(run_dir)
        self.capture = None  # set while the step is traced: what the hook hands over
        self.reached = None  # set while the step is traced: per variable, whether a gradient reached it (``reach.tap``)
        self.hooks = hooks.Hooks()
        step = self._step
        self.jitted = step if (model.run_eagerly or not model.jit_compile) else jax.jit(step, donate_argnums=0)

    def _hook(self, original):
        session = self

        def update_step(grads, trainable_variables, learning_rate):
            capture = session.capture
            if capture is None:  # a trace that is not this fit's step
                return original(grads, trainable_variables, learning_rate)
            capture.append((list(grads), list(trainable_variables)))
            return original(grads, trainable_variables, learning_rate)

        return update_step

    def _loss_hook(self, original):
        session = self

        def compute_loss_and_updates(trainable_variables, *args, **kwargs):
            if session.capture is None or session.reached is not None:
                return original(trainable_variables, *args, **kwargs)
            session.reached = reached = []
            return original(reach.tap(list(trainable_variables), reached), *args, **kwargs)

        return compute_loss_and_updates

    def _step(self, state, monitor, data):
        """Keras' train step and the monitor's, in one trace."""
        self.capture = capture = []
        self.reached = None
        weights = list(state[0])  # the trainable variables' values the step starts from
        try:
            logs, state = type(self.model).train_step(self.model, state, data)
        finally:
            self.capture = None
            reached, self.reached = self.reached, None
        if len(capture) != 1 or len(capture[0][0]) != len(self.index):
            # A train_step of the user's that applies no (or a partial) update
            # through the optimizer: nothing to record, the monitor unchanged.
            self.recorded = False
            return logs, state, monitor
        grads, variables = capture[0]
        rows = [self.index[id(v)] for v in variables]
        grads = [grads[i] for i in np.argsort(rows)]
        # The weights before and after are the step's input and output
        # states' (in the order of ``model.trainable_variables``, the rows'),
        # not what the hook could read around the update step: the
        # optimizer's decoupled weight decay (AdamW, ``weight_decay=``) has
        # changed the variables before it, and constraints and the EMA
        # overwrite (``use_ema``, ``ema_overwrite_frequency``) change them
        # after it. So ``weight_norm`` is of the weights the gradient was
        # taken at and ``update_norm`` the whole step's change, as the
        # TensorFlow and torch callbacks measure them.
        before = weights
        applied = [a - b for a, b in zip(state[0], before)]
        # One array per row (a Keras model has no stacked leaves): axes 0.
        grads, before, applied = ([(x, 0) for x in xs] for xs in (grads, before, applied))
        # Rows the loss does not depend on get no gradient (MISSING), as on
        # TensorFlow and torch, where theirs is None; unknown (a train_step
        # that differentiates another function): every row has one.
        present = tuple(reached[0]) if reached and len(reached[0]) == len(self.index) else None
        new = transform.advance(monitor, grads, before, applied, present=present)
        if self.accumulate > 1:
            # Keras' JAX optimizer runs the update at every micro-step and
            # keeps it only at the k-th (a lax.cond on its values): so does the monitor.
            iterations = state[2][self.iterations_at]
            keep = iterations % self.accumulate == 0  # iterations after the step
            new = jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, monitor)
        self.recorded = True
        return logs, state, new

    def step(self, state, data):
        """One training step: Keras' state and the monitor's advanced, written if due."""
        logs, state, self.state = self.jitted(state, self.state, data)
        if not self.recorded:  # known once the step is traced
            self._warn_once("recorded", "GradientCallback found no update through the optimizer in train_step.")
            return logs, state
        self.micro += 1
        if self.micro % self.accumulate == 0:
            try:
                self.writer.write(self.state, self.micro // self.accumulate)
            except ValueError as e:  # our count went wrong: stop recording, never stop the fit
                self._warn_once("count", f"GradientCallback stops recording: {e}")
                self.writer.close()
        return logs, state

    def weights(self):
        """The model's weights for the partial window's ``weight_norm``; None while the fit holds them (a step raised)."""
        # ``_value``: Keras' JAX loop sets it to None while the fit holds the
        # state (``_purge_model_variables``); ``.value`` would then fail.
        values = [v._value for v in self.model.trainable_variables]
        return None if any(v is None for v in values) else values

    def attach(self):
        """Hooks the optimizer's ``HOOK`` and the model's ``compute_loss_and_updates`` for this fit."""
        self.hooks.replace(self.optimizer, HOOK, self._hook)
        self.hooks.replace(self.model, LOSS_HOOK, self._loss_hook)

    def detach(self):
        self.hooks.restore()

    def close(self):
        """Writes the window under way (with the weights, when the fit does not hold them) and closes the writer."""
        self.writer.close(self.weights())
