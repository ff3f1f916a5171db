"""The TensorFlow writer's rows that issue 46 targets, alone: the 20-layer MLP's custom loop and ``model.fit``.

``python -m benchmarks --only writer`` times four models and takes about an
hour on a 2-core machine; the targets of issue 46 (the MLP at or under 1.20x
written every step and 1.05x every 10; ``model.fit`` with the callback every
10 at or under 1.05x with XLA) and issue 44 (``activations=True`` every 10
within 2%) are on the MLP and the fit, which this measures in the same way
(``benchmarks.writer``'s own functions and rounds) in about a quarter of it.
"""

from benchmarks import writer


def run(quick=False):
    return writer.run(quick, models=("mlp20_w256_b64",))
