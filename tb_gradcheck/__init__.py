"""tb_gradcheck: per-layer gradient statistics and gradient checks for TensorBoard's Gradients tab.

The TensorBoard plugin imports ``tb_gradcheck.reader.plugin`` only, so this package
imports TensorFlow lazily: ``import tb_gradcheck`` is cheap until a writer or
check is used.
"""

from tb_gradcheck.core import lazy

__version__ = "0.1.0"

_LAZY = {
    "GradientWriter": ("tb_gradcheck.tensorflow.writer", "GradientWriter"),
    "GradientCallback": ("tb_gradcheck.keras", "GradientCallback"),
    "GradientCheckReport": ("tb_gradcheck.tensorflow.check", "GradientCheckReport"),
    "check_gradients": ("tb_gradcheck.tensorflow.check", "check_gradients"),
}
# Submodules reachable as attributes without an import of their own
# (``tb_gradcheck.keras.GradientCallback``, ``tb_gradcheck.torch.GradientWriter``,
# ``tb_gradcheck.lightning.GradientCallback``, ``tb_gradcheck.transformers.GradientCallback``);
# keras imports TensorFlow, torch imports PyTorch when one of its names is used, lightning
# and transformers import PyTorch and their trainer's package when first used.
_SUBMODULES = ("keras", "torch", "lightning", "transformers")

__all__ = sorted(_LAZY)


__getattr__ = lazy.getattr_for(__name__, _LAZY, _SUBMODULES)
