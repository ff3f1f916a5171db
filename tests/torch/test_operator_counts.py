"""The PyTorch writer's per-step work does not grow with the number of parameter tensors (issue 36).

Counted, not timed: a ``TorchDispatchMode`` sees every operator dispatched
around ``writer.write(step)`` and ``optimizer.step()`` (each is a kernel
launch on a GPU, a dispatch on a CPU), and the optimizer step's own
operators, counted alone on the same model, are taken off. ReLU MLPs of
64-wide layers (12 and 102 parameter tensors), SGD, the writer following the
optimizer (its step hooks measure the update at written steps), a write
every 10 steps. Both ways to the norms are counted: a GPU's (float64
multi-tensor norms) and a CPU's (float32 ones inside a proven band,
``cpu_norms``), each with every gradient inside that band and with every
gradient vanishing below it (the loss scaled by 1e-30), where a CPU takes
those tensors again in float64. The counts are deterministic.
"""

import collections
import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tb_gradcheck.torch import GradientWriter
from tb_gradcheck.torch import cpu_norms
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


# The loss's scales: every gradient inside the CPU's float32 band (1e-9 to 1e9), and every one below it.
REGIMES = {"inside the band": 1.0, "vanishing": 1e-30}
# A CPU takes the norms outside the band again, scaled by powers of two, in a fixed number of operators
# for all of them (a multi-tensor multiply and norm, the stack, cast, division and unbinding of the results).
OUTSIDE_BAND = 7


def _mlp(layers):
    """A ReLU MLP whose gradients keep their size through its depth (He-scaled orthogonal weights, zero biases)."""
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        linear = nn.Linear(64, 64)
        nn.init.orthogonal_(linear.weight, gain=math.sqrt(2))
        nn.init.zeros_(linear.bias)
        modules += [linear, nn.ReLU()]
    return nn.Sequential(*modules[:-1])


def _backward(model, x, y, scale=1.0):
    (nn.functional.mse_loss(model(x), y) * scale).backward()


def _counts(layers, tmp_path, scale, steps=2 * EVERY + 2):
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
    with GradientWriter(tmp_path / f"mlp{layers}_{scale:g}", model, every_n_steps=EVERY, optimizer=optimizer) as writer:
        for step in range(steps):
            optimizer.zero_grad()
            _backward(model, x, y, scale)
            counted = _Count()
            with counted:
                writer.write(step)
                optimizer.step()
            counts[step] = counted.total - own.total
    return counts


@pytest.fixture(scope="module", params=["cpu", "gpu"], ids=lambda way: f"{way}_way")
def counts(request, tmp_path_factory):
    """``{regime: {tensors: {step: operators}}}`` for a CPU's way to the norms or a GPU's (``reductions.CPU_WAYS``)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reductions, "CPU_WAYS", request.param == "cpu")
        return {
            regime: {2 * layers: _counts(layers, tmp_path, scale) for layers in (6, 51)}
            for regime, scale in REGIMES.items()
        }


def test_the_regimes_put_every_gradient_inside_the_band_or_below_it():
    low, high = cpu_norms.F32_BAND
    x, y = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 64)
    for layers in (6, 51):
        for regime, scale in REGIMES.items():
            model = _mlp(layers)
            _backward(model, x, y, scale)
            norms = [p.grad.norm(dtype=torch.float64).item() for p in model.parameters()]
            if regime == "vanishing":
                assert 0 < max(norms) < low, (layers, max(norms))
            else:
                assert low <= min(norms) and max(norms) <= high, (layers, min(norms), max(norms))


def test_a_step_between_writes_costs_the_same_operators_for_12_and_102_tensors(counts):
    between = {
        regime: {n: {c for s, c in by_step.items() if s % EVERY} for n, by_step in by_size.items()}
        for regime, by_size in counts.items()
    }
    for regime, by_size in between.items():
        assert by_size[12] == by_size[102], regime
        assert len(by_size[12]) == 1, regime  # and the same at every step between writes
        assert max(by_size[12]) <= 20, regime
    ((inside,), (vanishing,)) = between["inside the band"][12], between["vanishing"][12]
    assert 0 <= vanishing - inside <= OUTSIDE_BAND


def test_a_written_step_costs_at_most_four_operators_per_tensor(counts):
    for regime, by_size in counts.items():
        written = {n: {by_step[s] for s in (EVERY, 2 * EVERY)} for n, by_step in by_size.items()}
        assert all(len(c) == 1 for c in written.values()), (regime, written)  # every written step alike
        (small,), (large,) = written[12], written[102]
        # The operators each tensor adds (the fixed part, the window's fold and the pack, cancels out) ...
        per_tensor = (large - small) / (102 - 12)
        assert per_tensor <= WRITTEN_PER_TENSOR, (regime, per_tensor)
        # ... and all of a written step's, spread over the 102 tensors.
        assert large <= WRITTEN_PER_TENSOR * 102, (regime, large)
