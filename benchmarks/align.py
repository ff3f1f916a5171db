"""Compare by structure on 2,000-row runs: the row alignment against one compare answer of the same runs.

Two transformer-sized runs of 250 blocks x 8 rows (2,000 rows; ``--quick``:
1,000), 1,000 written steps each, held in memory as the plugin holds them
(``queries.Heatmap``): no TensorBoard, no TensorFlow.

- baseline: ``wire.compare_body`` by name, binned to a 1,200-pixel-wide tab
  with the f32 encoding: what the tab pays at every refresh of a ratio.
- value: ``align.choose(..., "structure")``, which the plugin caches until a
  run's layout changes. Worst case: the other run has one layer more at the
  start and one block less at the end, so no common first or last rows can
  be paired before the dynamic-programming table (2,000 x 1,993 cells).
  Also the common case: the same architecture named apart (auto-numbered
  Keras twins), where the common ends pair every row and no table is filled.

Target: one alignment costs no more than one compare answer (ratio <= 1).
"""

import numpy as np

from benchmarks.common import interleaved
from benchmarks.common import row

STEPS = 1000
WIDTH = 1200
PARTS = {
    "attn/q": ((512, 512), (512,)),
    "attn/k": ((512, 512), (512,)),
    "attn/v": ((512, 512), (512,)),
    "attn/o": ((512, 512), (512,)),
    "mlp/in": ((512, 2048), (2048,)),
    "mlp/out": ((2048, 512), (512,)),
    "ln1": ((512,), (512,)),
    "ln2": ((512,), (512,)),
}


def _side(root, blocks, embed=False, drop_last_block=False):
    from tb_gradcheck.reader import align

    rows = [(f"block_{b:03d}/{p}", s) for b in range(blocks) for p, s in PARTS.items()]
    if embed:
        rows.insert(0, ("embed", ((32000, 512),)))
    if drop_last_block:
        rows = rows[: -len(PARTS)]
    names = [f"{root}/{n}" for n, _ in rows]
    shapes = [s for _, s in rows]
    return align.Side(names, shapes, [int(sum(np.prod(x) for x in s)) for s in shapes])


def _heatmap(run, names, rng):
    from tb_gradcheck.reader import queries

    values = rng.lognormal(size=(STEPS, len(names))).astype(np.float32)
    steps = np.arange(STEPS, dtype=np.int64)
    return queries.Heatmap(run, "grad_norm", "layer", "last", names, steps, values, np.zeros(values.shape, bool))


def _case(case, a, b, expected, rng, quick):
    from tb_gradcheck.reader import align
    from tb_gradcheck.reader import wire

    ha, hb = _heatmap("a", a.names, rng), _heatmap("b", b.names, rng)
    by_name = align.by_name(a.names, b.names)
    found = align.choose(a, b, align.STRUCTURE)  # also the warm-up
    assert (found.mode, found.matched) == (align.STRUCTURE, expected), (found.mode, found.matched)
    wire.compare_body(ha, hb, by_name, WIDTH, "max", "f32")
    times = interleaved(
        {
            "compare": lambda: wire.compare_body(ha, hb, by_name, WIDTH, "max", "f32"),
            "align": lambda: align.choose(a, b, align.STRUCTURE),
        },
        repeats=5 if quick else 11,
        inner=1,
    )
    name = f"compare by structure, {len(a.names):,} x {len(b.names):,} rows, {case}: alignment vs one compare answer"
    return row(name, times["compare"] * 1e3, times["align"] * 1e3, "ms", target=1.0)


def run(quick=False):
    blocks = 125 if quick else 250
    rng = np.random.default_rng(0)
    a = _side("t", blocks)
    cases = {  # the other run, and the rows a right alignment pairs
        "inserted and removed": (_side("t_1", blocks, embed=True, drop_last_block=True), len(a.names) - len(PARTS)),
        "same architecture": (_side("t_1", blocks), len(a.names)),
    }
    return [_case(case, a, b, expected, rng, quick) for case, (b, expected) in cases.items()]


if __name__ == "__main__":
    for r in run():
        print(r)
