"""Which rows of one run are which rows of another: by name, or by structure; numpy only.

Two runs of one architecture rarely share row names. Keras numbers every
layer of a process, not only the model, so two ``keras.Sequential`` models
built one after the other are ``sequential/dense, sequential/dense_1, ...``
and ``sequential_1/dense_4, sequential_1/dense_5, ...``; an experiment's
runs may name their models after the experiment (``he_init/...`` and
``wrong_gradient/...``). What does not change is what the rows are: their
order in depth and their variables' shapes. Aligning "by structure" is
therefore a global sequence alignment of the two depth-ordered row lists
(Needleman-Wunsch without gap costs, i.e. a weighted longest common
subsequence) in which two rows may only be paired when their signatures
are equal: their variables' shapes (``shapes`` in the layout,
``metadata.stats_layout``), or for logs written before shapes were stored,
their element counts. Among alignments that pair equally many rows, the one
whose paired names agree best wins (names without the root scope, then
without Keras' numeric suffixes, then the last path component: the layer or
variable kind, ``dense``, ``kernel``). An inserted or removed layer then
leaves the rest paired, and shows as a row only one run has, at its depth.

Variable rows are aligned inside aligned layers: the layers first (a layer's
signature is its variables' signatures), then each pair's variables in order,
so the variable granularity pairs what the layer granularity pairs.
"""

import dataclasses
import re

import numpy as np

NAME = "name"
STRUCTURE = "structure"
AUTO = "auto"
# What a request may ask for; AUTO picks one of the first two (``choose``).
REQUESTS = (NAME, STRUCTURE, AUTO)

# What a structure match requires of two rows, best first: equal shapes
# (every row of both runs has them), equal element counts (older logs), or
# equal names once the root scope and numeric suffixes are dropped (rows that
# only a check layout names, which stores neither).
BASES = ("shapes", "sizes", "names")

# The largest dynamic-programming table (rows of one run x rows of the other,
# after the common ends are taken off) a structure alignment fills. Its
# traceback costs 2 bits a cell (12 MiB here), its time ~0.1 us a cell. Past
# it the alignment falls back to names, and says so.
MAX_CELLS = 50_000_000

_SUFFIX = re.compile(r"(_\d+|#\d+)$")


@dataclasses.dataclass
class Side:
    """One run's rows as an alignment sees them.

    Attributes:
      names: Row names in depth order.
      shapes: Per row, a tuple of its variables' shapes (tuples of ints), or
        None where no layout stores them.
      sizes: Per row, its element count, or None where no layout names it.
      layers: At variable granularity, the run's layer row names, which say
        which layer a variable belongs to; None at layer granularity.
    """

    names: list
    shapes: list
    sizes: list
    layers: object = None


@dataclasses.dataclass
class Alignment:
    """Rows of two runs set against each other.

    Attributes:
      mode: ``NAME`` or ``STRUCTURE``: how the rows were paired.
      basis: What a structure match required (one of ``BASES``); ``"names"``
        for a name alignment.
      pairs: ``(i, j)`` in display order: ``i`` a row of the run, ``j`` of
        the other, either None where only one run has the row.
      rows: ``(the run's row names, the other's)`` that ``i`` and ``j`` index.
    """

    mode: str
    basis: str
    pairs: list
    rows: tuple = ((), ())

    @property
    def matched(self):
        return sum(1 for i, j in self.pairs if i is not None and j is not None)


def side(contents, granularity, names):
    """The ``Side`` of the rows ``names`` (one granularity) of a run whose stats layouts are ``contents``.

    A row several layouts name takes its shapes and size from the first.
    Rows no stats layout names (a check layout's own) get None for both.
    """
    shapes, sizes = {}, {}
    for content in contents:
        block = content[granularity]
        for k, name in enumerate(block["rows"]):
            sizes.setdefault(name, block["sizes"][k])
            if "shapes" in block:
                shapes.setdefault(name, tuple(tuple(s) for s in block["shapes"][k]))
    layers = None
    if granularity == "variable":
        layers = list(dict.fromkeys(n for c in contents for n in c["layer"]["rows"]))
    return Side(list(names), [shapes.get(n) for n in names], [sizes.get(n) for n in names], layers)


def by_name(a_names, b_names):
    """Rows of the same name: the run's rows in order, then rows only the other has."""
    jb = {}
    for j, name in enumerate(b_names):
        jb.setdefault(name, j)
    used = set()
    pairs = []
    for i, name in enumerate(a_names):
        j = jb.get(name)
        if j is not None and j not in used:
            used.add(j)
            pairs.append((i, j))
        else:
            pairs.append((i, None))
    pairs += [(None, j) for j in range(len(b_names)) if j not in used]
    return Alignment(NAME, "names", pairs, (list(a_names), list(b_names)))


def by_structure(a, b):
    """Rows aligned by depth order and signature, names breaking ties; a ``NAME`` alignment if too large.

    Args:
      a, b: ``Side`` of the run and of the other run.

    Returns:
      An ``Alignment``. Its pairs run in depth order: matched rows in both
      runs' order, and between two matches the rows only the run has, then
      those only the other has.
    """
    basis = _basis(a, b)
    sig_a, sig_b = _signatures(a, basis), _signatures(b, basis)
    if a.layers is None:
        codes = {}
        pairs = _sequence(sig_a, sig_b, _Names(a.names, codes), _Names(b.names, codes))
    else:
        pairs = _variables(a, b, sig_a, sig_b)
    if pairs is None:
        return by_name(a.names, b.names)
    return Alignment(STRUCTURE, basis, pairs, (list(a.names), list(b.names)))


def choose(a, b, request):
    """The alignment a request asks for; ``AUTO`` picks structure or name.

    ``AUTO`` takes the structure alignment when it pairs more rows than the
    name alignment pairs rows of equal signature: two runs of one model
    (same names, same shapes) stay aligned by name, models named apart
    (``sequential`` and ``sequential_1``) align by structure, and runs whose
    layers kept their names but changed their shapes (a width sweep) align by
    name, which is the only alignment that pairs them at all.
    """
    if request == NAME:
        return by_name(a.names, b.names)
    structure = by_structure(a, b)
    if request == STRUCTURE or structure.mode == NAME:
        return structure
    name = by_name(a.names, b.names)
    sig_a, sig_b = _signatures(a, structure.basis), _signatures(b, structure.basis)
    consistent = sum(1 for i, j in name.pairs if i is not None and j is not None and sig_a[i] == sig_b[j])
    return structure if structure.matched > consistent else name


def normalized(name):
    """A row name without its root scope and without Keras' numeric suffixes.

    ``"sequential_1/dense_4/kernel"`` -> ``"dense/kernel"``,
    ``"he_init/hidden"`` -> ``"hidden"``; a name without ``/`` keeps its
    only component (``"dense_3"`` -> ``"dense"``).
    """
    return "/".join(_SUFFIX.sub("", p) for p in _rest(name).split("/"))


def _rest(name):
    """The name without its root scope: ``"sequential_1/dense/kernel"`` -> ``"dense/kernel"``."""
    _, sep, rest = name.partition("/")
    return rest if sep and rest else name


# --- signatures and names ---------------------------------------------------------


def _basis(a, b):
    if all(s is not None for s in a.shapes + b.shapes):
        return "shapes"
    if all(s is not None for s in a.sizes + b.sizes):
        return "sizes"
    return "names"


def _signatures(side_, basis):
    if basis == "shapes":
        return list(side_.shapes)
    if basis == "sizes":
        return list(side_.sizes)
    return [normalized(n) for n in side_.names]


class _Names:
    """Integer codes of what names say about rows, for the tiebreak: the same codes mean the same text."""

    def __init__(self, names, codes=None):
        self.codes = codes if codes is not None else {}
        rest = [_rest(n) for n in names]
        norm = [normalized(n) for n in names]
        kind = [_SUFFIX.sub("", n.rsplit("/", 1)[-1]) for n in names]
        self.rest, self.norm, self.kind = (self._code(x) for x in (rest, norm, kind))

    def _code(self, texts):
        return np.array([self.codes.setdefault(t, len(self.codes)) for t in texts], np.int64)


# --- the sequence alignment -------------------------------------------------------


def _sequence(sig_a, sig_b, names_a, names_b):
    """Pairs of a weighted longest common subsequence of two signature lists, or None if too large.

    A pair scores ``big`` (so no tiebreak outweighs one more pair) plus one
    point for each of: equal names without the root scope, equal normalized
    names, equal kinds (the last component without its suffix).
    """
    codes = {}
    ca = np.array([codes.setdefault(s, len(codes)) for s in sig_a], np.int64)
    cb = np.array([codes.setdefault(s, len(codes)) for s in sig_b], np.int64)
    n, m = len(ca), len(cb)
    # Equal ends pair directly when no other row of the other run would pair
    # with either one better: then no alignment pairs more, and none agrees
    # better by name. Two runs of one architecture end here, at any size.
    best_a, best_b = _best(ca, cb, names_a, names_b), _best(cb, ca, names_b, names_a)

    def sure(i, j):
        return ca[i] == cb[j] and _sim(names_a, i, names_b, j) == best_a[i] == best_b[j]

    head = 0
    while head < min(n, m) and sure(head, head):
        head += 1
    tail = 0
    while tail < min(n, m) - head and sure(n - 1 - tail, m - 1 - tail):
        tail += 1
    middle = _table(ca[head : n - tail], cb[head : m - tail], names_a, names_b, head)
    if middle is None:
        return None
    return (
        [(k, k) for k in range(head)]
        + [(None if i is None else i + head, None if j is None else j + head) for i, j in middle]
        + [(n - tail + k, m - tail + k) for k in range(tail)]
    )


def _sim(names_a, i, names_b, j):
    return sum(int(getattr(names_a, k)[i] == getattr(names_b, k)[j]) for k in ("rest", "norm", "kind"))


def _best(ca, cb, names_a, names_b):
    """Per row of ``a``, the highest tiebreak any row of ``b`` with its signature could give it."""
    best = np.zeros(len(ca), np.int64)
    for level in ("rest", "norm", "kind"):
        keys = set(zip(cb.tolist(), getattr(names_b, level).tolist()))
        best += np.array([(s, t) in keys for s, t in zip(ca.tolist(), getattr(names_a, level).tolist())], np.int64)
    return best


def _table(ca, cb, names_a, names_b, offset):
    """The alignment of the middle part, by dynamic programming over ``len(ca) x len(cb)`` cells.

    Row ``i`` of the score table from row ``i - 1`` (``prev``):
    ``diag[j] = prev[j - 1] + w[i, j]`` where the signatures are equal, then
    ``row = running max of max(prev, diag)``, because a row's cell is the
    best of the cell above, the diagonal and the cell to its left. That is
    a handful of numpy operations per row; the traceback keeps two bits a
    cell (packed): whether the cell equals its left neighbour, and whether
    the diagonal reached it.
    """
    n, m = len(ca), len(cb)
    if n == 0 or m == 0:
        return [(i, None) for i in range(n)] + [(None, j) for j in range(m)]
    if n * m > MAX_CELLS:
        return None
    big = 4 * (min(n, m) + 1)  # above the largest total tiebreak, 3 points a pair
    # Scores stay below big * (min(n, m) + 1) < 2**30 for any table under
    # MAX_CELLS; a cell whose signatures differ weighs -2**30, so the
    # diagonal never wins there and no sum leaves int32.
    rest_a, norm_a, kind_a = (getattr(names_a, k)[offset : offset + n] for k in ("rest", "norm", "kind"))
    rest_b, norm_b, kind_b = (getattr(names_b, k)[offset : offset + m] for k in ("rest", "norm", "kind"))
    # A row's weights but for the rest-of-name point depend on its signature,
    # normalized name and kind only, which a model's repeated blocks share:
    # kept for reuse, up to 16 MiB of them.
    weights, room = {}, max(1, 2**22 // m)
    # Bit j of a row: cell j + 1 of the table (cell 0 never needs one).
    left = np.zeros((n + 1, (m + 7) // 8), np.uint8)
    diag = np.zeros((n + 1, (m + 7) // 8), np.uint8)
    prev = np.zeros(m + 1, np.int32)
    row = np.zeros(m + 1, np.int32)
    for i in range(n):
        key = (ca[i], norm_a[i], kind_a[i])
        if key in weights:
            base = weights[key]
        else:
            match = cb == ca[i]
            base = None
            if match.any():
                tiebreak = (norm_b == norm_a[i]).astype(np.int32) + (kind_b == kind_a[i])
                base = np.where(match, big + tiebreak, -(2**30)).astype(np.int32)
            if len(weights) < room:
                weights[key] = base
        if base is None:
            row[1:] = prev[1:]
        else:
            through = base + prev[:-1]
            through += rest_b == rest_a[i]
            np.maximum(through, prev[1:], out=row[1:])
            diag[i + 1] = np.packbits(through >= prev[1:])
        np.maximum.accumulate(row, out=row)
        left[i + 1] = np.packbits(row[1:] == row[:-1])
        prev, row = row, prev
    return _traceback(left, diag, n, m)


def _traceback(left, diag, n, m):
    def bit(bits, i, j):  # the bit of cell (i, j), j >= 1
        return (bits[i, (j - 1) >> 3] >> (7 - ((j - 1) & 7))) & 1

    matches = []
    i, j = n, m
    while i > 0 and j > 0:
        if bit(left, i, j):
            j -= 1
        elif bit(diag, i, j):
            matches.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        else:
            i -= 1
    return _with_gaps(matches[::-1], n, m)


def _with_gaps(matches, n, m):
    """Matches in order, with each gap's unmatched rows: the run's first, then the other's."""
    out = []
    i = j = 0
    for mi, mj in matches + [(n, m)]:
        out += [(k, None) for k in range(i, mi)] + [(None, k) for k in range(j, mj)]
        if mi < n:
            out.append((mi, mj))
        i, j = mi + 1, mj + 1
    return out


# --- variables inside their layers -----------------------------------------------


def _variables(a, b, sig_a, sig_b):
    """Variable pairs: layers (groups of consecutive variables with one owner) first, then inside each pair."""
    groups_a, groups_b = _groups(a), _groups(b)
    codes = {}
    owners_a = _Names([owner for owner, _ in groups_a], codes)
    owners_b = _Names([owner for owner, _ in groups_b], codes)
    layer_pairs = _sequence(
        [tuple(sig_a[k] for k in rows) for _, rows in groups_a],
        [tuple(sig_b[k] for k in rows) for _, rows in groups_b],
        owners_a,
        owners_b,
    )
    if layer_pairs is None:
        return None
    names_a, names_b = _Names(a.names, codes), _Names(b.names, codes)
    pairs = []
    for ga, gb in layer_pairs:
        if gb is None:
            pairs += [(i, None) for i in groups_a[ga][1]]
        elif ga is None:
            pairs += [(None, j) for j in groups_b[gb][1]]
        else:
            rows_a, rows_b = groups_a[ga][1], groups_b[gb][1]
            inner = _sequence(
                [sig_a[k] for k in rows_a], [sig_b[k] for k in rows_b], _take(names_a, rows_a), _take(names_b, rows_b)
            )
            pairs += [(None if i is None else rows_a[i], None if j is None else rows_b[j]) for i, j in inner]
    return pairs


def _groups(side_):
    """``[(owner, [variable row indices])]``: runs of consecutive variables of one layer row, in order."""
    layers = set(side_.layers or ())
    groups = []
    for k, name in enumerate(side_.names):
        parent = name.rsplit("/", 1)[0]
        owner = name if name in layers else parent if parent in layers else name
        if groups and groups[-1][0] == owner:
            groups[-1][1].append(k)
        else:
            groups.append((owner, [k]))
    return groups


def _take(names, rows):
    out = _Names([], names.codes)
    out.rest, out.norm, out.kind = (getattr(names, k)[rows] for k in ("rest", "norm", "kind"))
    return out
