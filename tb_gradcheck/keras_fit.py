"""What the ``GradientCallback``s (Keras on TensorFlow, JAX, torch) share: attaching to a fit and leaving it.

Each backend's callback hooks the model's optimizer and puts a train
function of its own in ``model.train_function`` for the fit (a *session*:
``tb_gradcheck.tensorflow.fit_hooks.Session`` on TensorFlow, ``tb_gradcheck.jax.keras``'s
``_Session`` on JAX, ``tb_gradcheck.torch.keras``'s on torch). All must leave
the model as they found it however the fit ends, so the rules are written
once here:

- one callback per optimizer: a fit that raised outside the step never
  reaches ``on_train_end``, and the next callback attached to that optimizer
  detaches the old one first (``_ATTACHED``);
- the train function runs the session's step only when this callback's fit
  called it (between ``on_train_batch_begin`` and the call); called by a
  later fit without this callback, it detaches and runs a clean function;
- a step that raises (other than the end of the data) detaches the callback
  before the error goes on, and ``on_train_end`` detaches it too.

Imports Keras only: never TensorFlow, JAX nor torch.
"""

import importlib
import warnings
import weakref

import keras

from tb_gradcheck.core import validate

# Each Keras backend's GradientCallback, by ``keras.backend.backend()``: constructing
# ``tb_gradcheck.keras.GradientCallback`` makes the one of the backend Keras runs on.
BACKEND_CALLBACKS = {
    "tensorflow": "tb_gradcheck.tensorflow.keras",
    "jax": "tb_gradcheck.jax.keras",
    "torch": "tb_gradcheck.torch.keras",
}


def backend_callback():
    """The ``GradientCallback`` class of the backend Keras runs on (imported only then).

    Raises:
      ValueError: A backend no GradientCallback serves.
    """
    backend = keras.backend.backend()
    if backend not in BACKEND_CALLBACKS:
        raise ValueError(
            f"Expected Keras on one of the backends {sorted(BACKEND_CALLBACKS)}. Received: backend {backend!r}"
        )
    return importlib.import_module(BACKEND_CALLBACKS[backend]).GradientCallback


# The optimizer a callback is attached to, and which callback.
_ATTACHED = weakref.WeakKeyDictionary()


class AttachedCallback(keras.callbacks.Callback):
    """A callback that holds one session on its model's optimizer during a fit (the module docstring).

    Subclasses set ``self._session`` through ``_attach``, wrap the train
    function with ``_guard``, and close what the session wrote in ``_close``.
    """

    def __init__(self):
        super().__init__()
        self._session = None
        self._in_batch = False

    def _take_arguments(self, log_dir, every_n_steps, backend, check_instead, **check):
        """``log_dir`` and ``every_n_steps``, checked, on a backend whose fit runs no gradient check.

        Args:
          log_dir, every_n_steps: The callback's own.
          backend: The backend's name in the message ("JAX", "torch").
          check_instead: What to check a loss with there, for the message.
          **check: The TensorFlow callback's check arguments as given; each
            must be unset (None, or False for ``check_training``).

        Raises:
          TypeError: ``log_dir`` is not a path.
          ValueError: ``every_n_steps`` is not a positive integer, or a check argument is set.
        """
        self.log_dir = validate.path(log_dir, "log_dir")
        self.every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        given = sorted(k for k, v in check.items() if v is not None and v is not False)
        if given:
            raise ValueError(
                f"Expected no gradient-check arguments on Keras' {backend} backend: the fit's check runs on "
                f"TensorFlow. Check {check_instead} and GradientWriter.write_check. Received: {given}"
            )

    def on_train_batch_begin(self, batch, logs=None):
        self._in_batch = True

    def on_train_end(self, logs=None):
        self._finish()

    def _attach(self, session):
        """Makes ``session`` (with its ``optimizer``) this callback's, detaching another one left on the optimizer."""
        previous = _ATTACHED.get(session.optimizer)
        if previous is not None and previous is not self:
            warnings.warn(
                "Another GradientCallback was still attached to this optimizer (an earlier fit that raised, "
                "or two GradientCallbacks in one fit); it is detached and only this one records.",
                stacklevel=3,
            )
            previous._finish()
        self._session = session
        _ATTACHED[session.optimizer] = self

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
        finally:
            if _ATTACHED.get(session.optimizer) is self:
                del _ATTACHED[session.optimizer]
            self.model.train_function = None
            self._close(session)

    def _close(self, session):
        """Writes what the session still holds and closes its writer."""
        raise NotImplementedError


def keras_owner(variable, name):
    """The layer row of a Keras variable: the parent of its ``path`` (``seq/dense/kernel`` -> ``seq/dense``).

    A variable without a Keras ``path`` (a plain ``tf.Variable``), or one
    whose name has no parent, is a layer of its own.
    """
    if isinstance(getattr(variable, "path", None), str) and "/" in name:
        return name.rsplit("/", 1)[0]
    return name


def keras_unit_axes(model):
    """``{variable path: 2}`` for the depthwise kernels of a Keras model (``tb_gradcheck.tensorflow.units`` says why).

    Every other variable's units follow from its shape. Walks nested models
    and layers through their ``layers`` attribute. Imports Keras, not its
    backend: the same on every backend.
    """
    depthwise = tuple(
        getattr(keras.layers, name)
        for name in ("DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D")
        if hasattr(keras.layers, name)
    )
    out = {}
    stack, seen = [model], set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(layer, depthwise):
            kernel = getattr(layer, "depthwise_kernel", None) or getattr(layer, "kernel", None)
            if kernel is not None:
                out[validate.variable_name(kernel)] = 2
        stack.extend(getattr(layer, "layers", None) or [])
    return out
