"""Parameters that stack layers for ``lax.scan``: one row per layer (slice), named and ordered; no device work.

A model that runs a repeated block with ``lax.scan`` (Flax Linen
``nn.scan(..., variable_axes={"params": 0})``, NNX ``nnx.scan`` over an
``nnx.vmap``-made stack, MaxText, Levanter) keeps each of the block's
parameters as one array whose leading axis holds the layers: a Dense kernel
``[L, in, out]``. As one row, its L layers' gradients would be pooled into one
norm; here each slice ``i`` is a parameter of its own.

Which leaves are stacked is a ``stacked`` mapping ``{prefix: axes}``: every
leaf whose name is ``prefix`` or under ``prefix/`` has ``axes`` leading
stacked axes (an int), or one per flag of a tuple of booleans (what
``layout.depth_order`` finds: whether the scan over that axis runs in
reverse). Slice ``i`` of ``ScanBlock_0/Dense_0/kernel`` under
``{"ScanBlock_0": 1}`` is ``ScanBlock_0/i/Dense_0/kernel`` (layer
``ScanBlock_0/i/Dense_0``): the name a list of blocks would have, which the
tab groups as repeated blocks. A leaf under two prefixes (a scan inside a
scanned block) takes the shorter prefix's axes first, each index after its
own prefix (``Outer_0/3/Inner_0/2/Dense_0/kernel``).

Row order: the slices sit where the first leaf under their prefix sits in
depth order; slice by slice in scan order (a reverse scan's last slice
first), and within a slice the leaves in their depth order.
"""

import functools
import itertools
import numbers

import numpy as np


def normalise(stacked):
    """``{prefix: tuple of reverse flags}`` of a user's ``stacked`` (None: {}).

    Raises:
      TypeError: Not a dict of str -> int or tuple of bools.
      ValueError: An axis count below 1.
    """
    if stacked is None:
        return {}
    if not isinstance(stacked, dict):
        raise TypeError(
            f"Expected `stacked` to be a dict {{parameter name prefix: stacked axes}}. Received: {type(stacked).__name__}"
        )
    out = {}
    for prefix, axes in stacked.items():
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"Expected `stacked` keys to be parameter name prefixes (str). Received: {prefix!r}")
        if isinstance(axes, bool) or not isinstance(axes, (numbers.Integral, tuple)):
            raise TypeError(
                f"Expected `stacked[{prefix!r}]` to be a number of leading axes (int) or a tuple of reverse flags. "
                f"Received: {axes!r}"
            )
        flags = (False,) * int(axes) if isinstance(axes, numbers.Integral) else tuple(bool(f) for f in axes)
        if not flags:
            raise ValueError(f"Expected `stacked[{prefix!r}]` to be at least 1 axis. Received: {axes!r}")
        out[prefix] = flags
    return out


def matched(stacked, parts):
    """The prefixes of ``stacked`` (``normalise``d) that ``parts`` (a leaf's name parts) is under, shortest first."""
    out = [p for p in stacked if tuple(parts[: len(p.split("/"))]) == tuple(p.split("/"))]
    return sorted(out, key=lambda p: len(p.split("/")))


def expand(parts, shapes, index, stacked):
    """The rows of leaves in depth order, each stacked leaf one row per slice.

    Args:
      parts: Per leaf (flattening order), its name parts.
      shapes: Per leaf, its shape.
      index: Leaf indices in depth order.
      stacked: ``normalise``d ``{prefix: flags}``.

    Returns:
      Rows in order, each ``(leaf, slice, name parts, owner parts, stack dims)``:
      ``slice`` the flat index of the slice in the leaf's stacked axes (0
      for an unstacked leaf), ``stack dims`` the leaf's stacked dimensions
      (``()`` unstacked); the row's shape is the leaf's after them.

    Raises:
      ValueError: A prefix under which no leaf lies; a leaf with fewer axes than are stacked, or a stack of length 0.
    """
    names = ["/".join(p) for p in parts]
    prefixes = {i: matched(stacked, parts[i]) for i in index}
    unused = sorted(p for p in stacked if not any(p in m for m in prefixes.values()))
    if unused:
        raise ValueError(
            f"Expected `stacked` to name prefixes of parameter names. Received: {unused[:5]}, under which no "
            f"parameter lies; the names are {names[:5]}{'...' if len(names) > 5 else ''}"
        )
    position = {leaf: k for k, leaf in enumerate(index)}
    first = {}  # prefix -> depth position of the first leaf under it
    for leaf in index:
        for p in prefixes[leaf]:
            first.setdefault(p, position[leaf])
    rows = []
    for leaf in index:
        flags = [f for p in prefixes[leaf] for f in stacked[p]]
        dims = tuple(shapes[leaf][: len(flags)])
        if len(shapes[leaf]) < len(flags) or 0 in dims:
            raise ValueError(
                f"Expected {names[leaf]!r} to have {len(flags)} stacked leading axes of nonzero length (`stacked`). "
                f"Received: shape {tuple(shapes[leaf])}"
            )
        for flat, at in enumerate(itertools.product(*[range(d) for d in dims])):
            key, name, axis = [], list(parts[leaf]), 0
            for p in prefixes[leaf]:
                key.append(first[p])
                for f in stacked[p]:
                    key.append(dims[axis] - 1 - at[axis] if f else at[axis])
                    axis += 1
            key.append(position[leaf])
            # Indices go in from the deepest prefix out, so the shallower insertion points stay put.
            axis = len(at)
            for p in reversed(prefixes[leaf]):
                k = len(p.split("/"))
                axis -= len(stacked[p])
                name[k:k] = [str(i) for i in at[axis : axis + len(stacked[p])]]
            whole = not prefixes[leaf] or len(prefixes[leaf][-1].split("/")) < len(parts[leaf])
            owner = name[:-1] if whole and len(name) > 1 else name
            rows.append((tuple(key), leaf, flat if dims else 0, tuple(name), tuple(owner), dims))
    rows.sort(key=lambda r: r[0])
    return [r[1:] for r in rows]


def infer(parts, paths):
    """The ``stacked`` mapping of the stacks a trace found (``layout.depth_order``).

    Args:
      parts: Per leaf, its name parts.
      paths: ``{leaf: ((scan id, reverse), ...)}`` for each leaf that enters
        scans as a scanned-over operand only, outermost scan first.

    A group is the leaves one scan stacks; its prefix is their owners'
    common path, or, when they share one owner, that owner's parent (a
    scanned Linen block of one Dense is ``ScanBlock_0/Dense_0``: the index
    goes after ``ScanBlock_0``), its grandparent for a scan in a scan... A
    scan inside a scanned block gets its own, longer prefix. Where a prefix would take in a leaf outside its group, or
    nesting gives no longer prefix, each leaf of that outer group becomes
    its own prefix with all its axes (``ScanBlock_0/Dense_0/kernel/3``).
    """
    stacked = {}
    outer = {}
    for leaf, path in paths.items():
        outer.setdefault(path[0][0], []).append(leaf)
    for leaves in outer.values():
        candidate = _nested(parts, paths, leaves)
        if candidate is None or not _exact(candidate, parts, paths, leaves):
            candidate = {"/".join(parts[leaf]): tuple(r for _, r in paths[leaf]) for leaf in leaves}
        stacked.update(candidate)
    return stacked


def _nested(parts, paths, leaves):
    """``{prefix: flags}`` with a prefix per scan level, or None where a level's prefix is no longer than its parent's."""
    out = {}
    previous = {leaf: () for leaf in leaves}
    for level in range(max(len(paths[leaf]) for leaf in leaves)):
        groups = {}
        for leaf in leaves:
            if len(paths[leaf]) > level:
                groups.setdefault(tuple(c for c, _ in paths[leaf][: level + 1]), []).append(leaf)
        for members in groups.values():
            floor = max(len(previous[leaf]) for leaf in members)
            prefix = _common(parts, members, floor, max(len(paths[leaf]) for leaf in members) - level)
            if any(len(prefix) <= len(previous[leaf]) for leaf in members):
                return None
            joined = "/".join(prefix)
            if joined in out:
                return None
            out[joined] = (paths[members[0]][level][1],)
            for leaf in members:
                previous[leaf] = prefix
    return out


def _common(parts, leaves, floor, levels):
    """The owners' common path; for one owner, its ancestor ``levels`` up (one per scan level left), longer than ``floor``.

    Linen names a scanned block ``ScanBlock_0`` and its Dense ``ScanBlock_0/Dense_0``:
    the index goes after ``ScanBlock_0``; a scan in a scan, after each ``Scan...`` of the two.
    """
    owners = [tuple(parts[leaf][:-1]) or tuple(parts[leaf]) for leaf in leaves]
    common = owners[0]
    for owner in owners[1:]:
        n = 0
        while n < min(len(common), len(owner)) and common[n] == owner[n]:
            n += 1
        common = common[:n]
    if len(set(owners)) == 1:
        common = common[: max(len(common) - levels, floor + 1)]
    return common


def _exact(candidate, parts, paths, group):
    """Whether ``candidate`` stacks exactly the group's leaves, each with its own flags, and no other leaf."""
    group = set(group)
    for leaf, leaf_parts in enumerate(parts):
        flags = tuple(f for p in matched(candidate, leaf_parts) for f in candidate[p])
        want = tuple(r for _, r in paths[leaf]) if leaf in group else ()
        if flags != want:
            return False
    return True


@functools.lru_cache(maxsize=64)
def gathers(lay):
    """``(rows, dead)`` int arrays that put per-leaf reductions in row order, or ``(None, None)`` when none is stacked.

    Per-leaf reductions come concatenated in the order leaves first appear
    among the rows, each stacked leaf's slices in flat order (``parts``);
    ``rows`` picks each row's value from that vector, ``dead`` each unit's
    flag from the concatenated per-unit flags. Made once per layout.
    """
    if not any(lay.stacks):
        return None, None
    start, unit_start = {}, {}
    at = unit_at = 0
    for leaf, row in parts(lay):
        start[leaf], unit_start[leaf] = at, unit_at
        count = int(np.prod(lay.stacks[row]))  # 1 for an unstacked leaf
        at += count
        unit_at += count * lay.units[row]
    rows = np.array([start[leaf] + s for leaf, s in zip(lay.order, lay.slices)], np.int32)
    dead = [np.arange(u) + unit_start[leaf] + s * u for leaf, s, u in zip(lay.order, lay.slices, lay.units)]
    return rows, np.concatenate(dead).astype(np.int32) if dead else np.zeros(0, np.int32)


def parts(lay):
    """``[(leaf, its first row)]``: each leaf once, in the order it first appears among the rows of a ``Layout``."""
    seen = {}
    for row, leaf in enumerate(lay.order):
        seen.setdefault(leaf, row)
    return list(seen.items())
