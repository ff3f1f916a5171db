"""``GradientCallback``: what the Keras callbacks of every backend share, and the choice of the backend's own.

Constructing ``tb_gradcheck.keras.GradientCallback(...)`` makes the callback of
the backend Keras runs on (``backends.callback_class``), a subclass of this
class, so ``isinstance(callback, tb_gradcheck.keras.GradientCallback)`` holds
on every backend.

Each backend's callback hooks the model's optimizer (``hooks``) and puts a
train function of its own in ``model.train_function`` for the fit: its
*session*. All must leave the model as they found it however the fit ends,
so the rules are written once, here:

- one callback per optimizer: a fit that raised outside the step never
  reaches ``on_train_end``, and the next callback attached to that optimizer
  detaches the old one first (``_ATTACHED``);
- the train function runs the session's step only when this callback's fit
  called it (between ``on_train_batch_begin`` and the call); called by a
  later fit without this callback, it detaches and runs a clean function;
- a step that raises (other than the end of the data) detaches the callback
  before the error goes on, and ``on_train_end`` detaches it too.

A backend's subclass provides ``_why_not()`` (why this fit cannot be
recorded, or None), ``_open_session()`` (the fit's session: its
``optimizer``, ``detach()`` and ``close()``, its hooks set) and
``_train_function()`` (built with ``_guard``); the TensorFlow one also takes
the gradient-check arguments (``_take_check``), which the others refuse.

Imports Keras only: never TensorFlow, JAX nor torch.
"""

import os
import warnings
import weakref

import keras

from tb_gradcheck.core import run_directory
from tb_gradcheck.core import validate
from tb_gradcheck.keras import backends

# The optimizer a callback is attached to, and which callback.
_ATTACHED = weakref.WeakKeyDictionary()


class GradientCallback(keras.callbacks.Callback):
    """Writes per-layer statistics of the gradients ``model.fit`` applies, for the Gradients tab.

    Writes into ``log_dir/train``, the run ``keras.callbacks.TensorBoard(log_dir)``
    writes its training scalars to, so the two callbacks given the same
    ``log_dir`` make one run with aligned steps: a record's step is
    ``optimizer.iterations`` after that step's update (the first update is
    step 1), the step ``keras.callbacks.TensorBoard`` gives batch 1 with
    ``update_freq="batch"``. Training is not changed: the callback only reads.
    Each backend's class says what it records and how
    (``tb_gradcheck.tensorflow.keras``, ``tb_gradcheck.jax.keras``,
    ``tb_gradcheck.torch.keras``).

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
        write.
      activations: Bool, default False. At each written step, statistics of
        each layer row's output in that step's training forward pass
        (``act_rms``, ``act_max_abs``, ``act_nonfinite``, and where a ReLU,
        tanh or sigmoid applies ``act_dead_fraction`` and
        ``act_saturated_fraction``: ``tb_gradcheck.keras.activations``). On
        the TensorFlow and torch backends; on JAX it must be left False.
      check_every_n_steps, check_data, check_dtype, check_training: The
        gradient check run during the fit, on the TensorFlow backend only
        (``tb_gradcheck.tensorflow.keras.GradientCallback``); elsewhere they
        must be left unset.

    Raises:
      TypeError: ``log_dir`` is not a path.
      ValueError: ``every_n_steps`` is not a positive integer, a Keras
        backend no callback serves, or a check argument (or
        ``activations=True``) on a backend whose fit does not record it.
    """

    # The backend's name and what to check a loss with there, for the message refusing check arguments.
    BACKEND = None
    CHECK_INSTEAD = None
    # Whether this backend's fit records the layers' outputs (activations=True).
    ACTIVATIONS = False

    def __new__(cls, *args, **kwargs):
        if cls is GradientCallback:
            cls = backends.callback_class()
        return super().__new__(cls)

    def __init__(
        self,
        log_dir,
        *,
        every_n_steps=1,
        activations=False,
        check_every_n_steps=None,
        check_data=None,
        check_dtype=None,
        check_training=False,
    ):
        super().__init__()
        self.log_dir = validate.path(log_dir, "log_dir")
        # Where the fit's statistics go, checked now rather than at the first step.
        self.run_dir = run_directory.prepare(os.path.join(self.log_dir, "train"), "log_dir", "GradientCallback")
        self.every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        self.activations = validate.boolean(activations, "activations")
        if self.activations and not self.ACTIVATIONS:
            raise ValueError(
                f"Expected `activations=False` on Keras' {self.BACKEND} backend: its fit does not record the "
                "layers' outputs yet (the TensorFlow and torch backends do). Received: activations=True"
            )
        self._take_check(
            check_every_n_steps=check_every_n_steps,
            check_data=check_data,
            check_dtype=check_dtype,
            check_training=check_training,
        )
        self._session = None
        self._in_batch = False
        self._warned = set()

    def _take_check(self, **check):
        """The check arguments, on a backend whose fit runs no check: each must be unset (None, or False).

        Raises:
          ValueError: A check argument is set.
        """
        given = sorted(k for k, v in check.items() if v is not None and v is not False)
        if given:
            raise ValueError(
                f"Expected no gradient-check arguments on Keras' {self.BACKEND} backend: the fit's check runs on "
                f"TensorFlow. Check {self.CHECK_INSTEAD} and GradientWriter.write_check. Received: {given}"
            )

    # -- Keras hooks ---------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._finish()  # an earlier fit of this callback that raised outside the step
        reason = self._why_not()
        if reason is not None:
            warnings.warn(f"GradientCallback records nothing in this fit: {reason}", stacklevel=2)
            return
        self._warn_if_window_too_long()
        if self._iterations() == 0:  # a new optimizer: steps start at 1 again
            run_directory.starts_again(self.run_dir, 1)
        # Another callback left on this optimizer lets go first: its hooks are put back before ours are set.
        self._take_over(self.model.optimizer)
        self._session = self._open_session()
        _ATTACHED[self.model.optimizer] = self
        self.model.train_function = self._train_function()

    def on_train_batch_begin(self, batch, logs=None):
        self._in_batch = True
        if self._session is not None:
            # Here, not at on_train_begin: BackupAndRestore, listed after this callback, restores the
            # optimizer's iterations at its own on_train_begin. Said once per run directory and process.
            run_directory.resuming(self.run_dir, self._iterations() + 1)

    def on_train_end(self, logs=None):
        self._finish()

    # -- what each backend provides --------------------------------------------

    def _why_not(self):
        """Why this fit cannot be recorded (a sentence), or None."""
        raise NotImplementedError

    def _open_session(self):
        """The fit's session, its hooks on the optimizer set."""
        raise NotImplementedError

    def _train_function(self):
        """The ``model.train_function`` of the fit (``_guard`` around the session's step)."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------

    def _warn_once(self, key, message):
        """``warnings.warn(message)`` the first time ``key`` is seen by this callback."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

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
                stacklevel=3,
            )

    def _iterations(self):
        """The optimizer's update count, read once at a fit's start or end."""
        iterations = self.model.optimizer.iterations  # a tensor under gradient accumulation, else a variable
        value = getattr(iterations, "value", iterations)
        try:
            return int(value)
        except TypeError:  # a tf.distribute variable (MirroredVariable), read eagerly here
            return int(value.numpy())

    def _take_over(self, optimizer):
        """Detaches another callback still attached to ``optimizer`` (its run closed, its hooks put back)."""
        previous = _ATTACHED.get(optimizer)
        if previous is not None and previous is not self:
            warnings.warn(
                "Another GradientCallback was still attached to this optimizer (an earlier fit that raised, "
                "or two GradientCallbacks in one fit); it is detached and only this one records.",
                stacklevel=3,
            )
            previous._finish()

    def _guard(self, step, stops):
        """A ``model.train_function`` that calls ``step(session, *args)`` in this callback's batches only.

        Args:
          step: Runs one call of the train function with the session.
          stops: The exception types that end the data (they end the epoch
            or the fit, not the callback).
        """
        callback, model = self, self.model

        def train_function(*args):
            session = callback._session
            if not callback._in_batch or session is None:
                callback._finish()
                model.make_train_function(force=True)
                return model.train_function(*args)
            # One call per on_train_batch_begin: another callback that raises
            # before this one's next batch must not leave it set.
            callback._in_batch = False
            try:
                return step(session, *args)
            except stops:
                raise
            except BaseException:
                callback._finish()
                raise

        return train_function

    def _finish(self):
        """Detaches from the optimizer, drops the train function (the next fit builds Keras' own) and closes."""
        session, self._session = self._session, None
        if session is None:
            return
        try:
            session.detach()
            # The steps written inside the train function, which no host write saw.
            run_directory.reached(self.run_dir, self._iterations())
        finally:
            if _ATTACHED.get(session.optimizer) is self:
                del _ATTACHED[session.optimizer]
            self.model.train_function = None
            session.close()
