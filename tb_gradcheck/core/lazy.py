"""A package's names imported at their first use (PEP 562's module ``__getattr__``).

``import tb_gradcheck`` and ``import tb_gradcheck.torch`` must stay cheap and
must not import a framework the user does not train with: the TensorBoard
plugin imports the package, and a PyTorch user may have no TensorFlow.
"""

import importlib


def getattr_for(package, names, submodules=()):
    """A module ``__getattr__`` for ``package`` that imports its names when first used.

    Args:
      package: The package's ``__name__``.
      names: ``{name: (module, attribute)}``: each name is ``module.attribute``,
        imported at its first use and then kept in the package's namespace.
      submodules: Submodules reachable as attributes without an import of their own.

    Returns:
      The function to assign to the package's ``__getattr__``.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name):
        if name in names:
            module, attribute = names[name]
            value = getattr(importlib.import_module(module), attribute)
            namespace[name] = value
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
