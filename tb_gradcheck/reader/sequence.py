"""A global alignment of two sequences that pairs only equal signatures, ties broken by points; numpy only.

``pairs`` is Needleman-Wunsch without gap costs, i.e. a weighted longest
common subsequence: of the alignments that pair the most elements (each
pair's signatures equal), the one with the most tiebreak points. An element
carries one integer code per tiebreak level (for rows: codes of their name
at several levels of detail, ``tb_gradcheck.reader.align``), and a pair earns one
point per level whose codes agree. ``tb_gradcheck.reader.align`` aligns two runs'
rows with it; this module knows nothing of names or shapes.
"""

import numpy as np


def pairs(sig_a, sig_b, ties_a, ties_b, max_cells):
    """Aligns ``sig_a`` with ``sig_b``.

    Args:
      sig_a, sig_b: Hashable signatures, one per element; only equal ones pair.
      ties_a, ties_b: Tiebreak levels: lists of int arrays, one code per
        element, the same number of levels on both sides. The first level
        is expected to differ from element to element (cached per row); the
        others to repeat (their weights are cached per combination).
      max_cells: The largest table (elements x elements, after equal ends are
        paired) to fill.

    Returns:
      ``[(i, j)]`` in order, ``i`` or ``j`` None for an element only one side
      has: matched pairs in both sides' order, and between two of them the
      unmatched elements of ``a``, then those of ``b``. None past ``max_cells``.
    """
    codes = {}
    ca = np.array([codes.setdefault(s, len(codes)) for s in sig_a], np.int64)
    cb = np.array([codes.setdefault(s, len(codes)) for s in sig_b], np.int64)
    n, m = len(ca), len(cb)
    # Equal ends pair directly when no element of the other side could earn
    # either of them more points: no alignment pairs more, and none earns
    # more. Two runs of one architecture are done here, at any size.
    best_a, best_b = _best(ca, cb, ties_a, ties_b), _best(cb, ca, ties_b, ties_a)

    def sure(i, j):
        return ca[i] == cb[j] and _points(ties_a, i, ties_b, j) == best_a[i] == best_b[j]

    head = 0
    while head < min(n, m) and sure(head, head):
        head += 1
    tail = 0
    while tail < min(n, m) - head and sure(n - 1 - tail, m - 1 - tail):
        tail += 1
    a_part, b_part = slice(head, n - tail), slice(head, m - tail)
    middle = _table(ca[a_part], cb[b_part], [t[a_part] for t in ties_a], [t[b_part] for t in ties_b], max_cells)
    if middle is None:
        return None
    return (
        [(k, k) for k in range(head)]
        + [(None if i is None else i + head, None if j is None else j + head) for i, j in middle]
        + [(n - tail + k, m - tail + k) for k in range(tail)]
    )


def _points(ties_a, i, ties_b, j):
    return sum(int(ta[i] == tb[j]) for ta, tb in zip(ties_a, ties_b))


def _best(ca, cb, ties_a, ties_b):
    """Per element of ``a``, at most the points any element of ``b`` with its signature could give it."""
    best = np.zeros(len(ca), np.int64)
    for ta, tb in zip(ties_a, ties_b):
        keys = set(zip(cb.tolist(), tb.tolist()))
        best += np.array([(s, t) in keys for s, t in zip(ca.tolist(), ta.tolist())], np.int64)
    return best


def _table(ca, cb, ties_a, ties_b, max_cells):
    """The alignment by dynamic programming over ``len(ca) x len(cb)`` cells, or None past ``max_cells``.

    Row ``i`` of the score table from row ``i - 1`` (``prev``):
    ``through[j] = prev[j - 1] + w[i, j]`` where the signatures are equal,
    then ``row = running max of max(prev, through)``, because a cell is the
    best of the cell above, the diagonal and the cell to its left. That is a
    handful of numpy operations per row; the traceback keeps two bits a cell
    (packed): whether the cell equals its left neighbour, and whether the
    diagonal reached it.
    """
    n, m = len(ca), len(cb)
    if n == 0 or m == 0:
        return [(i, None) for i in range(n)] + [(None, j) for j in range(m)]
    if n * m > max_cells:
        return None
    # A pair weighs big, more than the tiebreak points of any alignment, so
    # no tiebreak outweighs one more pair. Scores stay below
    # (levels + 1) * (cells + ...) < 2**30 for the tables align.MAX_CELLS
    # allows; a cell whose signatures differ weighs -2**30, so the diagonal
    # never wins there and no sum leaves int32.
    levels = len(ties_a)
    big = (levels + 1) * (min(n, m) + 1)
    first_a, first_b = (ties_a[0], ties_b[0]) if levels else (np.zeros(n, np.int64), np.ones(m, np.int64))
    # A row's weights but for the first level's point depend on its
    # signature and other levels only: kept for reuse, up to 16 MiB of them.
    weights, room = {}, max(1, 2**22 // m)
    # Bit j of a row: cell j + 1 of the table (cell 0 never needs one).
    left = np.zeros((n + 1, (m + 7) // 8), np.uint8)
    diag = np.zeros((n + 1, (m + 7) // 8), np.uint8)
    prev = np.zeros(m + 1, np.int32)
    row = np.zeros(m + 1, np.int32)
    for i in range(n):
        key = (ca[i], *(t[i] for t in ties_a[1:]))
        if key in weights:
            base = weights[key]
        else:
            match = cb == ca[i]
            base = None
            if match.any():
                points = sum(((tb == ta[i]) for ta, tb in zip(ties_a[1:], ties_b[1:])), np.zeros(m, np.int32))
                base = np.where(match, big + points, -(2**30)).astype(np.int32)
            if len(weights) < room:
                weights[key] = base
        if base is None:
            row[1:] = prev[1:]
        else:
            through = base + prev[:-1]
            through += first_b == first_a[i]
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
    """Matches in order, with each gap's unmatched elements: ``a``'s first, then ``b``'s."""
    out = []
    i = j = 0
    for mi, mj in matches + [(n, m)]:
        out += [(k, None) for k in range(i, mi)] + [(None, k) for k in range(j, mj)]
        if mi < n:
            out.append((mi, mj))
        i, j = mi + 1, mj + 1
    return out
