"""A parameter pytree's rows: names from its paths, layers, depth order and units; no device work.

A parameter is a leaf of the pytree the optimizer is given (Flax Linen's
``{"params": {"Dense_0": {"kernel": ...}}}``, Flax NNX's ``nnx.State``, any
dict or dataclass of arrays). Its name is its path joined with ``/``, with
what names no module dropped: Linen's leading ``params`` collection and
NNX's trailing ``.value`` (``params/Dense_0/kernel`` -> ``Dense_0/kernel``,
NNX ``linear1.kernel.value`` -> ``linear1/kernel``). Its layer is the
parent path (``Dense_0``, ``linear1``); a leaf at the top of the tree is a
layer of its own.

Depth order. A pytree flattens dicts in sorted key order, which is not the
order of the network: Linen's ``Dense_10`` sorts before ``Dense_2``, an NNX
module's ``decoder`` before its ``encoder``. Two orders do better:

- by default, path components in natural order (numbers by value, so
  ``Dense_2`` < ``Dense_10`` and ``layers/2`` < ``layers/10``): the
  depth order of auto-named Linen modules and of NNX lists;
- ``depth_order(fn, params, *args)``: the order in which ``fn`` (the forward
  pass or the loss) first reads each parameter, from its jaxpr; pass it to
  ``monitor(order=...)`` for named modules.

Stacked layers (``stacks``): a leaf that holds a scanned block's layers
along its leading axes is a row per slice, with ``monitor(stacked=...)``
or what ``depth_order`` found.

Units (``dead_unit_fraction``), as for Keras: a leaf of rank 2 or more has
one unit per index of its last axis (Dense kernel ``[in, out]``, Conv kernel
``[..., in, out]``, Embed ``[num, features]``), a vector one per element
(bias, LayerNorm scale), a scalar one; ``unit_axes={name: 2}`` makes a
leaf's units its last two axes.
"""

import dataclasses
import functools
import re
import sys

import jax
from jax.extend import core

from tb_gradcheck.core import structure
from tb_gradcheck.jax import reach
from tb_gradcheck.jax import stacks

# Path components that name no module: the Linen collection that holds the
# parameters (first), and a Variable's value attribute (last).
_COLLECTION = "params"
_VALUE_ATTRIBUTES = ("value", "raw_value")


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the monitor and the writer share about one parameter pytree: hashable, so it rides as pytree aux data.

    Attributes:
      names: Per row (depth order), the parameter's name.
      owners: Per row, its layer's name.
      shapes: Per row, its shape.
      units: Per row, its unit count.
      order: Per row, the leaf's index in the pytree's flattening.
      every_n_steps: Steps per write.
      updates: Whether the monitor measures the updates of an optimizer it wraps.
      stacks: Per row, its leaf's stacked leading dimensions (``stacks``),
        ``()`` for a leaf that is one row; ``shapes`` are the rows' own.
      slices: Per row, its slice's flat index in those dimensions (0 if none).
      reached: Per row, whether the loss has a gradient path to its
        parameter (``depth_order``'s ``unreached``), or ``()``: every row.
    """

    names: tuple
    owners: tuple
    shapes: tuple
    units: tuple
    order: tuple
    every_n_steps: int
    updates: bool
    stacks: tuple = ()
    slices: tuple = ()
    reached: tuple = ()

    @property
    def structure(self):
        """The ``structure.Structure`` of the rows (made once per layout)."""
        return _structure(self)

    def sizes(self):
        """Per row, the parameter's element count."""
        return self.structure.variable_sizes


@functools.lru_cache(maxsize=64)
def _structure(layout):
    return structure.Structure(layout.names, layout.owners, layout.shapes, layout.units)


def path_names(tree):
    """Per leaf of ``tree`` in flattening order, its name parts (strings), what names no module dropped."""
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [_part(k) for k in path]
        while (
            len(parts) > 1
            and parts[-1] in _VALUE_ATTRIBUTES
            and isinstance(path[len(parts) - 1], jax.tree_util.GetAttrKey)
        ):
            parts.pop()
        if len(parts) > 1 and parts[0] == _COLLECTION:
            parts = parts[1:]
        out.append(tuple(parts) or ("param",))
    return out


def _part(key):
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def natural_key(parts):
    """Sort key of name parts: digit runs compare by value (``Dense_2`` < ``Dense_10``)."""
    return tuple(tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", p) if t) for p in parts)


def make(params, every_n_steps, updates=False, order=None, unit_axes=None, stacked=None, found=None, unreached=()):
    """The ``Layout`` of a parameter pytree.

    Args:
      params: The parameter pytree (arrays or anything with ``shape``).
      every_n_steps: Steps per write.
      updates: Whether the monitor measures an optimizer's updates.
      order: None (natural order of the paths), or the parameter names in
        depth order (``depth_order``): a part of the pytree's names (those
        it does not list follow in natural order), or all of them and
        others (the order of a whole model, for a monitor inside
        ``optax.masked`` or ``optax.multi_transform`` that sees part of it:
        the others are passed over).
      unit_axes: ``{name: axes}`` overrides of the unit axes, or None.
      stacked: ``{name prefix: axes}`` of the leaves stacked for ``lax.scan``
        (``stacks``): a row per slice. None: every leaf is one row.
      found: ``{name prefix: axes}`` of the stacks ``depth_order`` found, or
        None; those under which no leaf of this pytree lies are passed over
        (a whole model's, as ``order``).
      unreached: Names of parameters the loss has no gradient path to
        (``depth_order``'s); names not in this pytree are passed over.

    Raises:
      ValueError: An empty pytree; ``order`` listing names the pytree does
        not have without listing all those it has; ``unit_axes``/``stacked``
        naming no parameter.
    """
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise ValueError("Expected a parameter pytree with at least one array. Received: a pytree without leaves")
    parts = path_names(params)
    names = ["/".join(p) for p in parts]
    index = sorted(range(len(parts)), key=lambda i: natural_key(parts[i]))
    if order is not None:
        order = list(order)
        present = set(names)
        unknown = sorted(set(order) - present)
        missing = sorted(present - set(order))
        if unknown and missing:
            # Names it has and names it lacks: the order of another pytree
            # (renamed modules, another model), not of a whole model this
            # one is part of, and the rows would not be in depth order.
            raise ValueError(
                "Expected `order` to list parameter names of the pytree: some of them, or all of them and others "
                "(a whole model's depth_order, for a monitor inside optax.masked or optax.multi_transform). "
                f"Received: an order without {missing[:5]}{'...' if len(missing) > 5 else ''} and with unknown "
                f"names {unknown[:5]}{'...' if len(unknown) > 5 else ''}; the pytree's names are "
                f"{names[:5]}{'...' if len(names) > 5 else ''}"
            )
        rank = {n: k for k, n in enumerate(n for n in order if n in present)}
        index = sorted(index, key=lambda i: (0, rank[names[i]]) if names[i] in rank else (1, 0))
    unit_axes = dict(unit_axes or {})
    unknown = sorted(set(unit_axes) - set(names))
    if unknown:
        raise ValueError(
            f"Expected `unit_axes` to name parameters of the pytree. Received: unknown names {unknown[:5]}"
        )
    stacked = stacks.normalise(stacked)
    if found:
        here = {p: flags for p, flags in found.items() if any(stacks.matched({p: flags}, x) for x in parts)}
        stacked = {**here, **stacked}
    shapes = [tuple(int(d) for d in x.shape) for x in leaves]
    rows = stacks.expand(parts, shapes, index, stacked)
    return Layout(
        names=tuple("/".join(name) for _, _, name, _, _ in rows),
        owners=tuple("/".join(owner) for _, _, _, owner, _ in rows),
        shapes=tuple(shapes[leaf][len(dims) :] for leaf, _, _, _, dims in rows),
        units=tuple(
            structure.trailing_units(shapes[leaf][len(dims) :], unit_axes.get(names[leaf], 1))
            for leaf, _, _, _, dims in rows
        ),
        order=tuple(leaf for leaf, _, _, _, _ in rows),
        every_n_steps=int(every_n_steps),
        updates=bool(updates),
        stacks=tuple(dims for _, _, _, _, dims in rows),
        slices=tuple(flat for _, flat, _, _, _ in rows),
        reached=tuple(names[leaf] not in unreached for leaf, _, _, _, _ in rows) if set(unreached) & set(names) else (),
    )


class DepthOrder(list):
    """Parameter names in depth order (a list), with what else the trace found.

    Attributes:
      stacked: ``{prefix: reverse flags}`` of the leaves scanned over.
      unreached: Names of the parameters a loss has no gradient path to
        (``reach``); empty where ``fn`` returns no scalar loss.
    """

    def __init__(self, names, stacked, unreached=()):
        super().__init__(names)
        self.stacked = stacked
        self.unreached = tuple(unreached)


def depth_order(fn, params, *args, **kwargs):
    """The names of ``params``' leaves in the order ``fn(params, *args, **kwargs)`` first reads them.

    ``fn`` is traced once (``jax.make_jaxpr``; nothing runs on a device) and
    its equations walked in program order, into the bodies of ``jit``,
    ``remat``, ``scan`` and other calls, so the first read of a parameter
    is where the forward pass first uses it: the network's depth order even
    where module names sort otherwise. Parameters ``fn`` never reads come
    last, in natural order.

    The same walk finds the parameters that stack layers for ``lax.scan``:
    a leaf that enters a ``scan`` as a scanned-over operand (an ``xs``,
    sliced along its leading axis at each iteration), and is read nowhere
    else, holds the scan's ``length`` layers along that axis (two axes
    for a scan inside a scanned block). The list's ``stacked`` attribute
    says which (``{name prefix: reverse flags}``, ``stacks``); ``monitor``
    then gives each slice a row of its own.

    Given the loss (``fn`` returns a scalar, or a ``(loss, aux)`` pair as
    for ``value_and_grad(has_aux=True)``), it also finds the parameters the
    loss has no gradient path to (``reach``: a head the loss never uses, a
    branch behind ``stop_gradient``), listed in ``unreached``. ``jax.grad``
    gives them zeros, which would read as a layer whose every unit is dead;
    ``monitor`` stores their gradient rows as MISSING instead, as TensorFlow
    and PyTorch store a variable whose gradient is None. Given the forward
    pass, it cannot know which outputs the loss uses, and every parameter
    counts as reached.

    ``params`` may be an NNX module: then ``fn`` takes the module, and
    the names are those of its ``nnx.Param`` state.

    Example:

        order = tb_gradcheck.jax.depth_order(loss_fn, params, x, y)  # Linen: loss_fn(params, x, y)
        order = tb_gradcheck.jax.depth_order(lambda m: loss_fn(m(x), y), model)  # NNX
        tx = tb_gradcheck.jax.monitor(optax.adam(1e-3), order=order)

    Returns:
      A ``DepthOrder``: a list of names with ``stacked`` and ``unreached``.
    """
    if not callable(fn):
        raise TypeError(
            "Expected `fn` to be the loss (or forward pass) called as fn(params, *args, **kwargs). "
            f"Received: {type(fn).__name__}"
        )
    rebuild = nnx_rebuild(params)
    if rebuild is not None:  # an NNX module: trace over its parameters' State, as nnx.grad differentiates it
        params, merge = rebuild
        call = lambda p: fn(merge(p), *args, **kwargs)  # noqa: E731
    else:
        call = lambda p: fn(p, *args, **kwargs)  # noqa: E731
    closed, out_shape = jax.make_jaxpr(call, return_shape=True)(params)
    parts = path_names(params)
    names = ["/".join(p) for p in parts]
    first, views = {}, {}
    _walk(closed.jaxpr, {v: (i, ()) for i, v in enumerate(closed.jaxpr.invars)}, first, views, [0])
    # Stacked: every read is of a slice, through scans over the same number of axes in the same directions.
    paths = {}
    for leaf, seen in views.items():
        flags = {tuple(r for _, r in path) for path in seen}
        if len(flags) == 1 and () not in flags:
            paths[leaf] = seen[0]
    unreached = reach.unreached(call, params, out_shape) or ()
    return DepthOrder(
        [names[i] for i in sorted(first, key=first.get)],
        stacks.infer(parts, paths),
        [n for n, no_path in zip(names, unreached) if no_path],
    )


def nnx_rebuild(obj):
    """``(Param state, state -> module)`` of an NNX module, or None for anything else (flax is not imported here)."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None or not isinstance(obj, nnx.Module):
        return None
    graphdef, state, rest = nnx.split(obj, nnx.Param, ...)
    return state, lambda p: nnx.merge(graphdef, p, rest)


# Primitives whose output is their operand in another dtype or placement: a
# parameter cast (bfloat16 compute), constrained or gathered along its layer
# axis (which ``scan`` needs unsplit) before a scan is still stacked.
_SAME_VALUE = frozenset(
    {"convert_element_type", "copy", "copy_p", "sharding_constraint", "reshard", "mesh_cast", "reduce_precision"}
)


def _walk(jaxpr, leaf_of, first, views, clock):
    """Walks equations in program order, recursing into sub-jaxprs.

    ``leaf_of`` maps a variable to ``(leaf index, path)``, ``path`` the
    scans it was sliced by, ``(scan's clock, reverse)`` outermost first.
    Records per leaf the clock of the first equation that reads it
    (``first``) and, per equation that reads it other than by passing it
    into a sub-jaxpr, the path it was read through (``views``).
    """
    for eqn in jaxpr.eqns:
        operands = [
            (k, leaf_of[v]) for k, v in enumerate(eqn.invars) if not isinstance(v, core.Literal) and v in leaf_of
        ]
        here = clock[0]
        passed = set()
        if operands and eqn.primitive.name in _SAME_VALUE and len(eqn.outvars) == 1:
            if tuple(eqn.outvars[0].aval.shape) == tuple(eqn.invars[0].aval.shape):
                leaf_of[eqn.outvars[0]] = operands[0][1]
                passed.add(operands[0][0])
        inner = _sub_jaxprs(eqn)
        if inner and operands:
            # A scan's operands are its consts, its carry, then its xs: an xs is sliced along axis 0.
            scanned = eqn.params["num_consts"] + eqn.params["num_carry"] if eqn.primitive.name == "scan" else None
            for sub in inner:
                # A call's body takes the call's operands as its invars
                # (trailing ones, where a loop adds its own carry first).
                offset = len(sub.invars) - len(eqn.invars)
                mapping = {}
                for k, (leaf, path) in operands:
                    if 0 <= k + offset < len(sub.invars):
                        if scanned is not None and k >= scanned:
                            path = path + ((here, bool(eqn.params["reverse"])),)
                        mapping[sub.invars[k + offset]] = (leaf, path)
                        passed.add(k)
                _walk(sub, mapping, first, views, clock)
        for k, (leaf, path) in operands:
            if leaf not in first:
                first[leaf] = clock[0]
            if k not in passed:
                views.setdefault(leaf, []).append(path)
        clock[0] += 1


def _sub_jaxprs(eqn):
    out = []
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, core.ClosedJaxpr):
                out.append(item.jaxpr)
            elif isinstance(item, core.Jaxpr):
                out.append(item)
    return out
