"""Findings at scale: ``diagnose.find`` over 2,000 layers x 10,000 writes, against reading the slabs it reads.

The matrix is made in memory (``merge.Matrix``, what ``queries.findings``
hands to ``diagnose.find`` after ``merge.matrix``), so the figure is the
rules' own time, not the provider's or the merge's: a deep network's norms
falling with depth under log-normal mini-batch noise, with every kind of
pathology planted somewhere (one-write spikes, exponential growth, NaN
stretches, a vanishing input side, units dying, a silent tail). The baseline,
in the same process, is what any rule over those columns pays first:
``rules.StatsView``, the nine slabs taken out of the matrix as float64.

``python -m benchmarks --only findings_scale`` (``--quick``: 1,000 writes).
The findings' correctness is ``tests/findings/test_corpus.py``'s and ``--only
findings``'s; this measures speed only.
"""

import time

import numpy as np

from benchmarks.common import row

LAYERS = 2_000
PARTS = ("attn/q", "attn/k", "attn/v", "attn/o", "mlp/in", "mlp/out", "ln1", "ln2")


def matrix(layers=LAYERS, steps=10_000, seed=0, updates=False):
    """A stats ``merge.Matrix`` at layer granularity, every step written (``last`` only), pathologies planted.

    ``updates``: with the optimizer's update measured too (``update_to_weight``
    about 1e-3 per step, as a writer given the optimizer records it), which
    the not-learning rule and vanishing's float32 reason read.
    """
    from tb_gradcheck.core import metadata
    from tb_gradcheck.reader import merge

    rng = np.random.default_rng(seed)
    columns = merge.stat_columns()
    c = columns.index
    names = [f"model/block_{b:03d}/{p}" for b in range(layers // len(PARTS) + 1) for p in PARTS][:layers]
    norm = 10.0 ** (-np.arange(layers) / 400) * 10 ** rng.normal(0, 0.3, (steps, layers))
    for j in rng.choice(layers, 20, replace=False):  # one-write spikes
        norm[rng.integers(100, steps - 10, 3), j] *= 1e4
    for j in rng.choice(layers, 5, replace=False):  # exponential growth over 100 writes
        t = rng.integers(steps // 10, steps - steps // 10)
        norm[t : t + 100, j] *= 10 ** np.linspace(0, 5, len(norm[t : t + 100]))
    norm[:, :30] *= 1e-5  # the input side vanishes
    nonfinite = np.zeros((steps, layers))
    for j in rng.choice(layers, 5, replace=False):
        t = rng.integers(100, steps)
        nonfinite[t : t + 3, j] = 7
        norm[t : t + 3, j] = np.nan
    dead = np.clip(rng.normal(0.05, 0.03, (steps, layers)), 0, 1)
    for j in rng.choice(layers, 10, replace=False):  # units die
        dead[rng.integers(100, steps) :, j] = 0.95
    dead[:, -10:] = 1.0  # a silent tail
    values = np.zeros((steps, 1, layers, len(columns)), np.float32)
    missing = np.zeros(values.shape, bool)
    values[:, 0, :, c("grad_norm")] = norm
    values[:, 0, :, c("grad_max_abs")] = norm * 0.05
    values[:, 0, :, c("grad_nonfinite")] = nonfinite
    values[:, 0, :, c("dead_unit_fraction")] = dead
    values[:, 0, :, c("weight_norm")] = 10.0
    values[:, 0, :, c("grad_to_weight")] = norm / 10.0
    values[:, 0, :, c("grad_norm_finite")] = np.where(np.isnan(norm), -1, norm)
    for name in (*metadata.OPTIMIZER_STAT_COLUMNS, "first_nonfinite_offset", "clip_ratio"):
        if name in columns:
            missing[..., c(name)] = True
    if updates:
        ratio = 1e-3 * 10 ** rng.normal(0, 0.3, (steps, layers))
        values[:, 0, :, c("update_to_weight")] = ratio
        values[:, 0, :, c("update_norm")] = ratio * 10.0
        missing[..., [c("update_to_weight"), c("update_norm")]] = False
    return merge.Matrix(names, columns, ["last"], np.arange(steps, dtype=np.int64), values, missing)


def run(quick=False):
    from tb_gradcheck.findings import diagnose
    from tb_gradcheck.findings import rules

    steps = 1_000 if quick else 10_000
    rows = []
    for updates in (False, True):
        m = matrix(steps=steps, updates=updates)
        started = time.perf_counter()
        rules.StatsView(m)
        baseline = time.perf_counter() - started
        started, cpu = time.perf_counter(), time.process_time()
        found = diagnose.find("scale", m)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        label = f"{LAYERS:,} layers x {steps:,} writes{', updates measured' if updates else ''}, {len(found)} findings"
        rows += [
            row(f"findings: diagnose.find, {label}, vs taking out the slabs it reads", baseline, wall, "s"),
            row(f"findings: diagnose.find CPU time, {label}", None, cpu, "s"),
        ]
    return rows


if __name__ == "__main__":
    import sys

    from benchmarks.__main__ import print_table

    print_table(run("--quick" in sys.argv))
