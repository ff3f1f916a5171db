"""tb_gradcheck for PyTorch: the gradient check (and, with the writer, per-layer statistics) for ``torch.nn.Module``s.

Imported lazily, like the package itself: ``import tb_gradcheck.torch`` does
not import torch until one of these is used.
"""

_LAZY = {
    "check_gradients": ("tb_gradcheck.torch.check", "check_gradients"),
    "float64_twin": ("tb_gradcheck.torch.check", "float64_twin"),
    "GradientCheckReport": ("tb_gradcheck.check_report", "GradientCheckReport"),
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tb_gradcheck.torch' has no attribute {name!r}")
