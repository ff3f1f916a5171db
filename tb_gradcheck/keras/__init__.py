"""``tb_gradcheck.keras``: the ``model.fit`` callback, whichever backend Keras 3 runs on.

``GradientCallback(log_dir)`` records the gradients ``fit`` applies: constructed,
it is the callback of the backend Keras runs on (TensorFlow's, JAX's or
torch's: the same rows and steps; ``backends``). ``float64_twin``,
``float32_gap`` and ``sync_twin`` check a Keras model in float64 (TensorFlow).
Importing this package imports Keras, never TensorFlow, JAX or torch: the
backend's modules load when the callback is made or a twin is asked for.
"""

from tb_gradcheck.core import lazy
from tb_gradcheck.keras.callback import GradientCallback

_LAZY = {
    "float64_twin": ("tb_gradcheck.tensorflow.float64_twin", "float64_twin"),
    "float32_gap": ("tb_gradcheck.tensorflow.float64_twin", "float32_gap"),
    "sync_twin": ("tb_gradcheck.tensorflow.float64_twin", "sync_twin"),
}

__all__ = ["GradientCallback", "float32_gap", "float64_twin", "sync_twin"]

__getattr__ = lazy.getattr_for(__name__, _LAZY)
