"""running: a window's state in array operations; several steps added at once equal one at a time."""

import numpy as np
import pytest
import torch

from tb_gradcheck.core import running
from tb_gradcheck.core.rowstats import MISSING


def _steps(seed=0, steps=9, rows=6):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(steps, rows, 3)) * 10.0 ** rng.integers(-3, 3, (steps, rows, 1))
    xs[:, :, 1] = rng.integers(0, 2, (steps, rows)) * rng.integers(0, 4, (steps, rows))
    xs[2, 1] = MISSING  # a row without a gradient at one step
    xs[:, 5] = MISSING  # and one that never has one
    xs[4, 2, 0] = np.nan
    return xs


@pytest.mark.parametrize("xp", [np, torch], ids=["numpy", "torch"])
def test_add_steps_equals_add_one_step_at_a_time(xp):
    xs = _steps()
    convert = np.asarray if xp is np else torch.from_numpy

    def full(shape, value):
        return np.full(shape, value) if xp is np else torch.full(shape, value, dtype=torch.float64)

    one = running.init(full, xs.shape[1])
    for x in xs:
        one = running.add(xp, one, convert(x))
    batched = running.init(full, xs.shape[1])
    for part in (xs[:1], xs[1:5], xs[5:]):
        batched = running.add_steps(xp, batched, convert(part))
    for name, a, b in zip(running.State._fields, one, batched):
        # Sums in another order, of terms up to ~1e3: a few units in the last place of the largest apart.
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-11, err_msg=name)
    first = np.asarray(batched.first_nonfinite)
    assert first[5] == -1 and np.isnan(np.asarray(batched.max)[2, 0])


def test_step_columns_of_several_steps_equal_each_steps():
    rng = np.random.default_rng(1)
    layers = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], bool)
    norms, counts = rng.random((3, 4)), rng.integers(0, 2, (3, 4)) * 1.0
    present = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 1]], bool)
    layer_present = present @ layers.T > 0
    together = running.step_columns(np, norms, counts, present, layers, layer_present)
    for s in range(3):
        alone = running.step_columns(np, norms[s], counts[s], present[s], layers, layer_present[s])
        np.testing.assert_array_equal(together[s], alone)
    assert (together[1, 1] == MISSING).all()  # layer 1 had no gradient at step 1
