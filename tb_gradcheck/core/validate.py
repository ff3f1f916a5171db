"""Input validation for the public entry points: one helper per kind of argument, "Expected ... Received: ...".

Every public function validates its arguments once, here, and passes the
checked values down; nothing below an entry point validates again. Each
helper returns the value in the form the caller works with (an ``int``, a
``float``, a ``list``, an int64 tensor) or raises ``TypeError`` for the wrong
kind of object and ``ValueError`` for a wrong value.

TensorFlow is imported inside the helpers that need it (steps, variables,
gradients), so the TensorBoard plugin and the command line can import this
module without it.
"""

import collections.abc
import numbers
import os

import numpy as np

INT64_MAX = 2**63 - 1


def positive_int(value, name):
    """``value`` as an ``int`` >= 1; bools are refused (``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Expected `{name}` to be a positive integer. Received: {value!r}")
    return int(value)


def non_negative_int(value, name):
    """``value`` as an ``int`` in 0..2**63-1 (seeds, offsets)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= INT64_MAX:
        raise ValueError(f"Expected `{name}` to be a non-negative integer (0 to 2**63 - 1). Received: {value!r}")
    return int(value)


def fraction(value, name):
    """``value`` as a ``float`` strictly between 0 and 1 (tolerances, step sizes)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a number. Received: {type(value).__name__}")
    if not 0 < value < 1:
        raise ValueError(f"Expected `{name}` to be between 0 and 1 (exclusive). Received: {value!r}")
    return float(value)


def one_of(value, name, choices):
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {list(choices)}. Received: {value!r}")
    return value


def boolean(value, name):
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise TypeError(f"Expected `{name}` to be True or False. Received: {type(value).__name__} {value!r}")
    return value


def flag(value, name):
    """``value`` as a Python ``bool``: a choice fixed when a step is traced, so not a tensor."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"Expected `{name}` to be a Python bool (it is fixed when the step is traced). "
            f"Received: {type(value).__name__} {value!r}"
        )
    return bool(value)


def exactly_one(**named):
    """Checks that exactly one of the keyword arguments is not None (``logdir`` or ``writer``)."""
    given = [n for n, v in named.items() if v is not None]
    if len(given) != 1:
        names = " and ".join(f"`{n}`" for n in named)
        shown = ", ".join(f"{n}={v!r}" for n, v in named.items())
        raise ValueError(f"Expected exactly one of {names}. Received: {shown}")


def instance(value, name, kinds, expected):
    """``value`` if it is an instance of ``kinds``; else a TypeError saying ``expected`` ("a torch.nn.Module")."""
    if not isinstance(value, kinds):
        raise TypeError(f"Expected `{name}` to be {expected}. Received: {type(value).__name__}")
    return value


def path(value, name):
    """A filesystem path (str, bytes or ``os.PathLike``) as a ``str``."""
    if isinstance(value, bytes):
        return value.decode()
    if not isinstance(value, str) and not hasattr(value, "__fspath__"):
        raise TypeError(f"Expected `{name}` to be a path. Received: {type(value).__name__}")
    return os.fspath(value)


def optional_path(value, name):
    """``path(value, name)``, or None."""
    if value is not None and not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
        raise TypeError(f"Expected `{name}` to be a path or None. Received: {type(value).__name__}")
    return None if value is None else path(value, name)


def non_empty_list(values, name):
    """A non-empty sequence as a ``list``.

    Tensors, arrays, strings, mappings and sets are refused: each is iterable,
    but iterating one is never what a caller who passed it meant.
    """
    if (
        isinstance(values, (str, bytes, collections.abc.Mapping, collections.abc.Set))
        or (hasattr(values, "shape") and hasattr(values, "dtype"))
        or not hasattr(values, "__iter__")
    ):
        raise TypeError(f"Expected `{name}` to be a list. Received: {type(values).__name__}")
    values = list(values)
    if not values:
        raise ValueError(f"Expected a non-empty list of {name}. Received: an empty list")
    return values


def variable_name(v):
    """A variable's name for rows and messages: its Keras ``path``, else its name without ``:0``."""
    p = getattr(v, "path", None)
    if isinstance(p, str) and p:
        return p
    n = getattr(v, "name", None) or "variable"
    return n.removesuffix(":0")
