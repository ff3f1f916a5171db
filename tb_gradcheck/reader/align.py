"""Which rows of one run are which rows of another: by name, or by structure; numpy only.

Two runs of one architecture rarely share row names. Keras numbers every
layer of a process, not only the model, so two ``keras.Sequential`` models
built one after the other are ``sequential/dense, sequential/dense_1, ...``
and ``sequential_1/dense_4, sequential_1/dense_5, ...``; an experiment's
runs may name their models after the experiment (``he_init/...`` and
``wrong_gradient/...``). What does not change is what the rows are: their
order in depth and their variables' shapes. Aligning "by structure" is
therefore a global sequence alignment of the two depth-ordered row lists
(``tb_gradcheck.reader.sequence``) in which two rows may only be paired when their
signatures are equal: their variables' shapes, up to the order of their axes
(``shapes`` in the layout,
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

from tb_gradcheck.reader import sequence

NAME = "name"
STRUCTURE = "structure"
AUTO = "auto"
# What a request may ask for; AUTO picks one of the first two (``choose``).
REQUESTS = (NAME, STRUCTURE, AUTO)

# The largest dynamic-programming table (rows of one run x rows of the other,
# after the common ends are taken off) a structure alignment fills. Its
# traceback costs 2 bits a cell (12 MiB here), its time ~12 ns a cell (0.6 s
# here, benchmarks/align.py). Past it the alignment is by name, and says so.
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
      basis: What a structure match required: ``"shapes"``, ``"sizes"`` or
        ``"names"`` (see ``_basis``); ``"names"`` for a name alignment.
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
        pairs = sequence.pairs(sig_a, sig_b, _ties(a.names, codes), _ties(b.names, codes), MAX_CELLS)
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
    """What a structure match requires of two rows, best first.

    Equal shapes (every row of both runs has them), equal element counts
    (logs written before shapes were stored), or equal names once the root
    scope and numeric suffixes are dropped (rows only a check layout names,
    which stores neither).
    """
    if all(s is not None for s in a.shapes + b.shapes):
        return "shapes"
    if all(s is not None for s in a.sizes + b.sizes):
        return "sizes"
    return "names"


def _ties(names, codes):
    """What names say about rows, for the tiebreak (``sequence.pairs``): integer codes at three levels.

    The name without its root scope, then also without numeric suffixes
    (``normalized``), then its last component without its suffix (the kind:
    ``dense``, ``kernel``). ``codes`` (text -> code) is shared by the two
    sides compared, so equal codes mean equal text.
    """

    def code(texts):
        return np.array([codes.setdefault(t, len(codes)) for t in texts], np.int64)

    rest = code([_rest(n) for n in names])
    return [rest, code([normalized(n) for n in names]), code([_SUFFIX.sub("", n.rsplit("/", 1)[-1]) for n in names])]


def _signatures(side_, basis):
    if basis == "shapes":
        # Each shape as its dimensions sorted: frameworks lay the same
        # parameter's axes out in different orders (a Keras Dense kernel is
        # [in, out], a PyTorch Linear weight [out, in]; conv kernels HWIO
        # and OIHW), and a PyTorch run must pair with its TensorFlow twin.
        return [None if s is None else tuple(tuple(sorted(v)) for v in s) for s in side_.shapes]
    if basis == "sizes":
        return list(side_.sizes)
    return [normalized(n) for n in side_.names]


# --- variables inside their layers -----------------------------------------------


def _variables(a, b, sig_a, sig_b):
    """Variable pairs: layers (groups of consecutive variables with one owner) first, then inside each pair."""
    groups_a, groups_b = _groups(a), _groups(b)
    codes = {}
    layer_pairs = sequence.pairs(
        [tuple(sig_a[k] for k in rows) for _, rows in groups_a],
        [tuple(sig_b[k] for k in rows) for _, rows in groups_b],
        _ties([owner for owner, _ in groups_a], codes),
        _ties([owner for owner, _ in groups_b], codes),
        MAX_CELLS,
    )
    if layer_pairs is None:
        return None
    ties_a, ties_b = _ties(a.names, codes), _ties(b.names, codes)
    pairs = []
    for ga, gb in layer_pairs:
        if gb is None:
            pairs += [(i, None) for i in groups_a[ga][1]]
        elif ga is None:
            pairs += [(None, j) for j in groups_b[gb][1]]
        else:
            rows_a, rows_b = groups_a[ga][1], groups_b[gb][1]
            inner = sequence.pairs(
                [sig_a[k] for k in rows_a],
                [sig_b[k] for k in rows_b],
                [t[rows_a] for t in ties_a],
                [t[rows_b] for t in ties_b],
                MAX_CELLS,
            )
            pairs += [(None if i is None else rows_a[i], None if j is None else rows_b[j]) for i, j in inner]
    return pairs


def _groups(side_):
    """``[(owner, [variable row indices])]``: runs of consecutive variables of one layer row, in order."""
    layers = set(side_.layers or ())
    groups = []
    for k, name in enumerate(side_.names):
        # A variable's layer is its parent path: ``/`` in Keras' and JAX's
        # names, ``.`` in PyTorch's (``dense_0.weight`` is in ``dense_0``).
        parents = [name.rsplit(sep, 1)[0] for sep in ("/", ".") if sep in name]
        owner = name if name in layers else next((p for p in parents if p in layers), name)
        if groups and groups[-1][0] == owner:
            groups[-1][1].append(k)
        else:
            groups.append((owner, [k]))
    return groups
