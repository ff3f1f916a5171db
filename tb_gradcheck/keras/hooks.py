"""Methods of a Keras optimizer (or layer) instance replaced for one fit, and put back however the fit ends.

Every backend's callback reads the gradients by replacing a method or two of
the model's optimizer (``apply``, ``_backend_update_step``, ...) on that
instance only; with ``activations=True`` the row layers' ``call`` too
(``activations.Taps``). The replacements are set with ``object.__setattr__``: Keras'
attribute tracking never sees them, so nothing joins the optimizer's
checkpointed state (nor a layer's); ``restore`` puts back exactly what was there (an
instance attribute of the user's own, or nothing).
"""

_ABSENT = object()


class Hooks:
    """The methods replaced on optimizer (and layer) instances during one fit."""

    def __init__(self):
        self._saved = []  # (object, name, its own attribute or _ABSENT), in the order replaced

    def replace(self, obj, name, make):
        """Replaces ``obj.name`` with ``make(original)`` until ``restore``."""
        original = getattr(obj, name)
        self._saved.append((obj, name, obj.__dict__.get(name, _ABSENT)))
        object.__setattr__(obj, name, make(original))

    def restore(self):
        """Puts every replaced method back, the last replaced first."""
        for obj, name, previous in reversed(self._saved):
            if previous is _ABSENT:
                obj.__dict__.pop(name, None)
            else:
                object.__setattr__(obj, name, previous)
        self._saved = []
