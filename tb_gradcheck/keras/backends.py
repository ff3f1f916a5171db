"""Which ``GradientCallback`` serves the backend Keras runs on: the one place the choice is made.

Each Keras backend has its callback in its framework's folder
(``tb_gradcheck/{tensorflow,jax,torch}/keras.py``), as Keras 3 keeps each
backend in ``keras/src/backend/<name>/``. They are named here as modules,
imported only when a callback is made, so importing ``tb_gradcheck.keras``
imports no framework and no backend's module imports another's.
"""

import importlib

import keras

# ``keras.backend.backend()`` -> the module whose ``GradientCallback`` serves it.
CALLBACKS = {
    "tensorflow": "tb_gradcheck.tensorflow.keras",
    "jax": "tb_gradcheck.jax.keras",
    "torch": "tb_gradcheck.torch.keras",
}


def callback_class():
    """The ``GradientCallback`` class of the backend Keras runs on (its module imported only now).

    Raises:
      ValueError: A backend no GradientCallback serves.
    """
    backend = keras.backend.backend()
    if backend not in CALLBACKS:
        raise ValueError(f"Expected Keras on one of the backends {sorted(CALLBACKS)}. Received: backend {backend!r}")
    return importlib.import_module(CALLBACKS[backend]).GradientCallback
