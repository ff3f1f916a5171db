"""Merging a run's layouts (tags) into one steps x rows matrix, by row name; pure numpy.

A run holds several layouts of one kind when the model changed (a layer
added, a restart with another architecture, two models through one writer).
They are merged here by row name, never by position: a row both layouts have
continues as one row, a row only one has is missing at the other's steps,
and where two layouts wrote the same row at the same step the later-written
layout wins. Columns are read by name from each layout, so a layout with
columns this version does not know, or without a column it knows, still
merges (the unknown column is skipped, the absent one is missing).

Nothing here reads files or imports TensorBoard: ``store.py`` hands over
decoded tags as ``Part`` objects, or one column of each as ``Block`` objects
(what a heatmap needs, kept by the store as tags grow).
"""

import dataclasses
import weakref

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.reader import growing_arrays

# Statistics computed on read from stored columns of the same aggregate:
# Ratios of two columns (see metadata.DERIVED_STAT_COLUMNS).
DERIVED = {
    "grad_to_weight": ("grad_norm", "weight_norm"),
    "clip_ratio": ("grad_norm_before_clip", "grad_norm"),
}


@dataclasses.dataclass
class Part:
    """One layout's decoded points.

    Attributes:
      content: The parsed layout (``metadata.parse``).
      steps: int64 ``[S]``, ascending, unique.
      values: float32 ``[S, A, L + V + 1, C]`` (stats) or ``[S, R, C]`` (check).
    """

    content: dict
    steps: np.ndarray
    values: np.ndarray


@dataclasses.dataclass
class Matrix:
    """A run's merged data for one kind and granularity.

    Attributes:
      rows: Row names, merged in order of first appearance.
      columns: Column names (``stat_columns()`` or ``metadata.CHECK_COLUMNS``).
      aggregates: Slab names (stats) or ``[None]`` (check).
      steps: int64 ``[S]``, ascending.
      values: float32 ``[S, A, R, C]``.
      missing: bool ``[S, A, R, C]``: no value (no gradient, row absent from
        that step's layout, or an aggregate the layout did not store).
      problems: ``points.Problem`` for every point or tag that was skipped.
    """

    rows: list
    columns: list
    aggregates: list
    steps: np.ndarray
    values: np.ndarray
    missing: np.ndarray
    problems: list = dataclasses.field(default_factory=list)

    def slab(self, column, aggregate=None):
        """``(values [S, R], missing [S, R])`` of one column and aggregate."""
        a = 0 if aggregate is None else self.aggregates.index(aggregate)
        c = self.columns.index(column)
        return self.values[:, a, :, c], self.missing[:, a, :, c]


def stat_columns():
    """The statistics a stats matrix holds: the served ones, then any other stored column, in order."""
    return list(dict.fromkeys(metadata.STAT_COLUMNS + metadata.STORED_STAT_COLUMNS))


def rows(contents, granularity):
    """Row names of every layout, merged by name in order of first appearance."""
    names, seen = {}, set()
    for content in contents:
        # The spans of a layout share one parsed content (the store parses
        # each distinct content once): its rows are taken once.
        if id(content) in seen:
            continue
        seen.add(id(content))
        for name in metadata.rows_of(content, granularity)[0]:
            names.setdefault(name, None)
    return list(names)


def union_steps(step_arrays):
    """The ascending union of several ascending, unique int64 step arrays."""
    arrays = [np.asarray(s, np.int64) for s in step_arrays]
    if len(arrays) == 1:
        return arrays[0]
    return np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, np.int64)


def aggregates(contents):
    """Aggregates any stats layout can answer, in canonical order (``metadata.AGGREGATES``)."""
    found = {a for content in contents for a in content["aggregates"]}
    return [a for a in metadata.AGGREGATES if a in found]


def slab(parts, granularity, column, aggregate=None, row_names=None):
    """One column of one aggregate over every layout: ``(steps [S], values [S, R], missing [S, R])``.

    Args:
      parts: ``Part`` objects of one kind, earliest-written first (later ones
        win where two wrote the same row at the same step).
      granularity: ``"layer"`` or ``"variable"``.
      column: A stored column name, or a ``DERIVED`` one.
      aggregate: For stats, the slab name (``"last"``, ...); None for checks.
      row_names: The rows to lay out, default ``rows(...)`` of the parts.

    Returns:
      float32 values, NaN where missing.
    """
    if row_names is None:
        row_names = rows([p.content for p in parts], granularity)
    return derived(lambda c: lay_out([block(p, granularity, c, aggregate) for p in parts], row_names), column)


def derived(plain, column):
    """One column, stored or ``DERIVED``: ``(steps [S], values [S, R], missing [S, R])``.

    Args:
      plain: ``stored column -> (steps, values, missing)``, the column laid
        out (``lay_out``); called twice for a ``DERIVED`` column.
      column: A stored column name, or a ``DERIVED`` one.
    """
    if column not in DERIVED:
        return plain(column)
    numerator, denominator = DERIVED[column]
    steps, nv, nm = plain(numerator)
    _, dv, dm = plain(denominator)
    # Undefined (missing, not Inf) where the weights are all zero, as for
    # a fresh bias; NaN stays NaN.
    defined = ~nm & ~dm & (dv > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(defined, nv / dv, np.nan).astype(np.float32)
    return steps, values, ~defined


def lay_out(blocks, row_names, spare=0):
    """Layouts' ``Block`` objects of one column on the union of their steps: ``(steps [S], values [S, R], missing [S, R])``.

    Args:
      blocks: One ``Block`` per layout, earliest-written first (later ones
        win where two wrote the same row at the same step).
      row_names: The rows to lay out.
      spare: Int, rows to allocate after the ``S`` laid out (``grow``): the
        arrays returned are then ``S + spare`` long, the rows after ``S``
        unspecified.

    Returns:
      float32 values, NaN where missing.
    """
    steps = union_steps([b.steps for b in blocks])
    values = np.full((len(steps) + spare, len(row_names)), np.nan, np.float32)
    missing = np.ones(values.shape, bool)
    where = {name: j for j, name in enumerate(row_names)}
    for b in blocks:
        if b.data is None or not len(b.steps):
            continue
        r = [where[n] for n in b.names if n in where]
        if len(r) < len(b.names):  # a row the caller did not ask for
            continue
        at = np.searchsorted(steps, b.steps)
        rs = np.asarray(r, np.int64)
        if isinstance(_as_slice(at), slice) and isinstance(_as_slice(rs), slice):
            # The common case (one layout, or layouts that follow each other
            # in steps with the same rows): views, no fancy-index copies.
            at, rs = _as_slice(at), _as_slice(rs)
            np.copyto(values[at, rs], b.data, where=b.keep)
            missing[at, rs] &= ~b.keep
        else:
            ix = np.ix_(at, rs)
            values[ix] = np.where(b.keep, b.data, values[ix])
            missing[ix] &= ~b.keep
    if spare:
        steps = np.concatenate([steps, np.zeros(spare, np.int64)])
    return steps, values, missing


@dataclasses.dataclass
class Laid:
    """One column laid out (``lay_out``) and kept, so that a run that grows costs its new steps (``grow``).

    Attributes:
      rows: The row names laid out.
      basis: Per layout, what its block was: ``(names, steps, source)``,
        ``source`` a weak reference to the block's ``source`` (None for a
        block without data). Weak: the arrays belong to the store, whose
        cache may drop them; a heatmap must not keep them alive.
      steps, values, missing: ``growing_arrays.Stack`` objects.
    """

    rows: list
    basis: list
    steps: growing_arrays.Stack
    values: growing_arrays.Stack
    missing: growing_arrays.Stack

    @property
    def nbytes(self):
        return self.steps.nbytes + self.values.nbytes + self.missing.nbytes

    def views(self):
        """``(steps, values, missing)``, read-only views that later growth does not change."""
        return self.steps.view(), self.values.view(), self.missing.view()


def grow(previous, blocks, row_names):
    """A ``Laid`` of ``blocks``: ``previous`` extended when only new steps came, else laid out anew.

    Extending is exact when every layout's block holds what it held before
    (the same ``source``, the same steps first) plus rows at steps after the
    last one laid out, and the rows are the same: then the new cells are laid
    out alone, by the same rules, and appended. Anything else (a rewound or
    rewritten tag, a new layout, a step between the old ones, a block the
    store dropped) lays out all. ``previous`` is extended in place: the
    caller holds a lock for it.
    """
    basis = [(b.names, b.steps, None if b.data is None else weakref.ref(b.source)) for b in blocks]
    if previous is not None and _only_new_steps(previous, blocks, row_names):
        new = []
        for b, (_, old, _) in zip(blocks, previous.basis):
            n = len(old)
            new.append(Block(b.steps[n:], b.names, *(None if a is None else a[n:] for a in (b.data, b.keep))))
        # A layout that came after the others (a new tag) is new steps whole.
        steps, values, missing = lay_out(new + blocks[len(previous.basis) :], row_names)
        previous.steps.extend(steps)
        previous.values.extend(values)
        previous.missing.extend(missing)
        previous.basis = basis
        return previous
    # Laid out again over a view laid out before: the run is live, and the
    # arrays get room to grow into now rather than a copy at the next poll.
    count = len(union_steps([b.steps for b in blocks]))
    arrays = lay_out(blocks, row_names, 0 if previous is None else 1 + count // 4)
    return Laid(row_names, basis, *(growing_arrays.Stack(a, count) for a in arrays))


def _only_new_steps(previous, blocks, row_names):
    if previous.rows != row_names or len(blocks) < len(previous.basis):
        return False
    steps = previous.steps.view()
    last = steps[-1] if len(steps) else np.iinfo(np.int64).min
    if any(len(b.steps) and b.steps[0] <= last for b in blocks[len(previous.basis) :]):
        return False
    for b, (names, old, source) in zip(blocks, previous.basis):
        if (b.data is None) != (source is None) or b.names != names or len(b.steps) < len(old):
            return False
        if source is not None and (b.source is None or source() is not b.source):
            return False
        if not np.array_equal(b.steps[: len(old)], old) or (len(b.steps) > len(old) and b.steps[len(old)] <= last):
            return False
    return True


def _as_slice(index):
    """``index`` (int array) as an equivalent slice when it counts up by one, else itself."""
    if len(index) and index[-1] - index[0] == len(index) - 1 and (len(index) < 2 or np.all(np.diff(index) == 1)):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def matrix(parts, kind, granularity, problems=()):
    """Every column and aggregate of a run's layouts of one kind, as a ``Matrix``."""
    contents = [p.content for p in parts]
    row_names = rows(contents, granularity)
    if kind == metadata.KIND_STATS:
        columns, slabs = stat_columns(), aggregates(contents)
    else:
        columns, slabs = list(metadata.CHECK_COLUMNS), [None]
    steps = union_steps([p.steps for p in parts])
    shape = (len(steps), len(slabs), len(row_names), len(columns))
    values = np.full(shape, np.nan, np.float32)
    missing = np.ones(shape, bool)
    for a, aggregate in enumerate(slabs):
        for c, column in enumerate(columns):
            _, values[:, a, :, c], missing[:, a, :, c] = slab(parts, granularity, column, aggregate, row_names)
    return Matrix(row_names, columns, slabs, steps, values, missing, list(problems))


@dataclasses.dataclass
class Block:
    """One layout's cells of one column and aggregate, the unit ``lay_out`` merges.

    Attributes:
      steps: int64 ``[S]``, the layout's steps (also when it cannot answer:
        its steps still belong to the merged step axis).
      names: The layout's row names of the granularity.
      data: float32 ``[S, r]``, or None when the layout lacks the column or
        aggregate.
      keep: bool ``[S, r]``: the cells that hold a value (the writer stores
        -1 for "no value"; a check row with a NaN status was not checked).
      source: For ``grow``, an object that stays the same while the arrays
        only grow (what the store keeps them in), or None when unknown.
    """

    steps: np.ndarray
    names: list
    data: object = None
    keep: object = None
    source: object = None


def block(part, granularity, column, aggregate):
    """The ``Block`` of one ``Part``: views into its values where it can answer."""
    content = part.content
    names, row_slice = metadata.rows_of(content, granularity)
    if not len(part.steps) or column not in content["columns"]:
        return Block(part.steps, names)
    c = content["columns"].index(column)
    if content["kind"] == metadata.KIND_CHECK:
        cells = part.values[:, row_slice]
        # A check row with a NaN status was not checked at that step: every
        # column of it is missing. metadata.parse guarantees a status column.
        status = content["columns"].index("status")
        return Block(part.steps, names, cells[:, :, c], ~np.isnan(cells[:, :, status]))
    a = slab_index(content, aggregate)
    if a is None:
        return Block(part.steps, names)
    return Block(part.steps, names, *stats_cells(part.values[:, a, row_slice, c]))


def stats_cells(data):
    """``(data, keep)`` of stored statistics: the writer stores -1 for "no value" (a None gradient); NaN is data."""
    return data, ~(data < 0)


def slab_index(content, aggregate):
    """Index of the slab that answers ``aggregate`` in one stats layout, or None."""
    if aggregate in content["aggregates"]:
        return content["aggregates"].index(aggregate)
    # A one-step window's mean, max and min all equal its last value.
    if content["window"] == 1 and aggregate != "sum" and "last" in content["aggregates"]:
        return content["aggregates"].index("last")
    return None
