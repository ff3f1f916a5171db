"""``tb_gradcheck.keras``: the ``model.fit`` callback, whichever backend Keras 3 runs on.

``GradientCallback(log_dir)`` records the gradients ``fit`` applies. On the
TensorFlow backend it is ``tb_gradcheck.tensorflow.keras.GradientCallback``;
on the JAX backend constructing it makes ``tb_gradcheck.jax.keras``'s
instead, on the torch backend ``tb_gradcheck.torch.keras``'s (same rows
and steps; ``keras_fit.BACKEND_CALLBACKS``). Importing this module imports
Keras, never TensorFlow, JAX or torch: the backend's modules load when the
callback is made or a fit begins.
"""

from tb_gradcheck.tensorflow.float64_twin import float32_gap
from tb_gradcheck.tensorflow.float64_twin import float64_twin
from tb_gradcheck.tensorflow.float64_twin import sync_twin
from tb_gradcheck.tensorflow.keras import GradientCallback

__all__ = ["GradientCallback", "float32_gap", "float64_twin", "sync_twin"]
