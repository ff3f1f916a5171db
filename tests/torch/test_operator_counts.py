"""The PyTorch writer's per-step work does not grow with the number of parameter tensors (issue 36).

Counted, not timed: a ``TorchDispatchMode`` sees every operator dispatched
around ``writer.write(step)`` and ``optimizer.step()`` (each is a kernel
launch on a GPU, a dispatch on a CPU), and the optimizer step's own
operators, counted alone on the same model, are taken off. ReLU MLPs of
64-wide layers (12 and 102 parameter tensors), SGD, the writer following the
optimizer (its step hooks measure the update at written steps), a write
every 10 steps. The counts are deterministic.
"""

import collections

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tb_gradcheck.torch import GradientWriter
from tb_gradcheck.torch import reductions

EVERY = 10
# A written step: one reduction per tensor for its dead units is the only per-tensor work left; the
# issue allows about 4 operators per tensor, everything else is a fixed number of multi-tensor kernels.
WRITTEN_PER_TENSOR = 4


class _Count(TorchDispatchMode):
    """Counts the operators dispatched while it is active, by name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self):
        return sum(self.ops.values())


@pytest.fixture(scope="module", autouse=True)
def _the_gpu_way_to_norms():
    """Counts the multi-tensor norms a GPU runs: a CPU's own way sums float32 tensors one by one (``cpu_norms``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reductions, "CPU_WAYS", False)
        yield


def _mlp(layers):
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*modules[:-1])


def _backward(model, x, y):
    nn.functional.mse_loss(model(x), y).backward()


def _counts(layers, tmp_path, steps=2 * EVERY + 2):
    """``{step: operators}`` of write + optimizer step, less the optimizer step's own."""
    x, y = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 64)
    bare = _mlp(layers)
    optimizer = torch.optim.SGD(bare.parameters(), lr=1e-3)
    _backward(bare, x, y)
    own = _Count()
    with own:
        optimizer.step()
    model = _mlp(layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    counts = {}
    with GradientWriter(tmp_path / f"mlp{layers}", model, every_n_steps=EVERY, optimizer=optimizer) as writer:
        for step in range(steps):
            optimizer.zero_grad()
            _backward(model, x, y)
            counted = _Count()
            with counted:
                writer.write(step)
                optimizer.step()
            counts[step] = counted.total - own.total
    return counts


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("counts")
    return {2 * layers: _counts(layers, tmp_path) for layers in (6, 51)}


def test_a_step_between_writes_costs_the_same_operators_for_12_and_102_tensors(counts):
    between = {n: {c for s, c in by_step.items() if s % EVERY} for n, by_step in counts.items()}
    assert between[12] == between[102]
    assert len(between[12]) == 1  # and the same at every step between writes
    assert max(between[12]) <= 20


def test_a_written_step_costs_at_most_four_operators_per_tensor(counts):
    written = {n: {by_step[s] for s in (EVERY, 2 * EVERY)} for n, by_step in counts.items()}
    assert all(len(c) == 1 for c in written.values()), written  # every written step alike
    (small,), (large,) = written[12], written[102]
    # The operators each tensor adds (the fixed part, the window's fold and the pack, cancels out) ...
    per_tensor = (large - small) / (102 - 12)
    assert per_tensor <= WRITTEN_PER_TENSOR, per_tensor
    # ... and all of a written step's, spread over the 102 tensors.
    assert large <= WRITTEN_PER_TENSOR * 102, large
