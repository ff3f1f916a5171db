"""What the store keeps of a tag's points, cut from decoded points and grown as the tag grows; numpy only.

The store (``store.py``) keeps, per tag, its ``points.Summary`` and one
cache entry per product: ``VALUES`` (every readable point, what the findings
and the checks read) or a block (one column of one slab and granularity,
``[S, r]`` data and keep: what a heatmap reads, a small share of the tag).
A product is a tuple of ``growing.Stack`` objects; when the tag grows, the rows of
its new points are cut (``rows``) and appended.
"""

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.reader import merge
from tb_gradcheck.reader import points

VALUES = "tag"  # the product of every readable point: cache key ("tag", experiment, run, tag)


def block_product(content, granularity, column, aggregate):
    """The product (a cache key's head) of one column's block in a layout, or None if it stores no such column."""
    if column not in content["columns"]:
        return None
    if content["kind"] == metadata.KIND_CHECK:
        return ("block", granularity, column, None)
    slab = merge.slab_index(content, aggregate)
    # Keyed by the slab, not the aggregate's name: in a layout written every
    # step, max, min and mean are all the last slab, kept once.
    return None if slab is None else ("block", granularity, column, slab)


def opening_products(content):
    """What the tab opens on, made at every read of a stats tag: its heatmap then needs no read of its own.

    The tab's first request after ``GET runs`` (which reads every tag that
    changed) is the layer-level ``grad_norm``, of the ``max`` aggregate in a
    windowed layout; a poll that finds new steps does the same. A block is a
    small share of the tag, cut out while the read is in hand.
    """
    if content["kind"] != metadata.KIND_STATS:
        return frozenset()
    aggregate = "max" if "max" in content["aggregates"] else "last"
    product = block_product(content, "layer", "grad_norm", aggregate)
    return frozenset() if product is None else frozenset([product])


def rows(content, product, arrays):
    """The rows a product holds of decoded points (``points.decode``'s arrays): ``(values,)`` or ``(data, keep)``."""
    shape = metadata.shape_of(content)
    if product == VALUES:
        return (points.stack(arrays, shape),)
    _, granularity, column, slab = product
    names, row_slice = metadata.rows_of(content, granularity)
    if slab is None:  # a check tag: small, taken whole
        part = merge.Part(content, np.zeros(len(arrays), np.int64), points.stack(arrays, shape))
        b = merge.block(part, granularity, column, None)
        return b.data, b.keep
    # One column of one slab cut from each point: stacking whole points first
    # would copy the tag (twelve times the bytes, most of a first read's time).
    c = content["columns"].index(column)
    data = np.stack([a[slab, row_slice, c] for a in arrays]) if arrays else np.zeros((0, len(names)), np.float32)
    return merge.stats_cells(data)
