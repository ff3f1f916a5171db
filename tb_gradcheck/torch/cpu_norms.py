"""A CPU's way to exact L2 norms of float32 gradients: one float32 multi-tensor norm inside a proven band, no float64 copy.

On a GPU ``reductions`` takes every norm in one multi-tensor kernel that
accumulates in float64, ``torch._foreach_norm(tensors, 2, dtype=float64)``.
A CPU runs that kernel tensor by tensor and first casts each tensor to
float64: a copy of the whole model per step (ResNet-50's 25.6 M gradients:
1.5x its step between writes on this machine's CPU, measured with ``python
-m benchmarks --only torch_models --models resnet50``). So a CPU takes the
same multi-tensor norm without the cast, ``torch._foreach_norm(tensors,
2)`` summing float32 squares in float32: one operator for every tensor of
up to ``LONG`` elements, exact where that loses nothing against float64
(``F32_BAND``). The host then reads the norms (on a CPU that waits for
nothing and dispatches no operator); the rare tensors outside the band (0,
tiny, huge, not finite: a vanishing or exploding gradient) take the GPU's
float64 multi-tensor norm, one more operator for all of them, a float64
copy of those tensors only. A step costs the same few operators whatever
the number of tensors; only a tensor longer than ``LONG`` adds a few of
its own (it takes far longer to sum than to dispatch).
"""

import torch

F64 = torch.float64

# Norms whose float32 squares lose nothing against float64 ones. At ||g|| >= 1e-9
# (squares summing to 1e-18 or more), the squares float32 flushes to zero
# (each below 1.2e-38) lose at most n * 1.2e-38 of the sum, under 1e-10 of
# it for any n below 1e10; at ||g|| <= 1e9 no partial sum comes near
# float32's largest value (3.4e38). Outside the band the float32 squares are
# accumulated in float64, where they can do neither.
F32_BAND = (1e-9, 1e9)

# A CPU's float32 sum rounds more the more elements it adds: relative error
# 8e-8 at 65,536 elements, 5e-6 at 590,000, 6e-4 at 16 million (measured,
# torch 2.13). A longer tensor is summed in rows of ROW elements, each short
# enough to keep float32's error at its ~1e-7, and the rows' squares are
# added in float64: exact to about 1e-8 at any length, at the cost of a few
# more operators for each such tensor (a tensor that long takes far longer
# to sum than to dispatch).
ROW = 4096
LONG = 16 * ROW


def l2(tensors):
    """float64 0-d L2 norms of float32 CPU tensors (a list), exact at every magnitude (module docstring)."""
    short = [i for i, t in enumerate(tensors) if t.numel() <= LONG]
    found, values = [None] * len(tensors), [None] * len(tensors)
    if short:
        group = tensors if len(short) == len(tensors) else [tensors[i] for i in short]
        norms = torch.stack(torch._foreach_norm(group, 2)).to(F64)
        for i, norm, value in zip(short, norms.unbind(), norms.tolist()):
            found[i], values[i] = norm, value
    for i, t in enumerate(tensors):
        if found[i] is None:
            found[i] = _long_l2(t)
            values[i] = found[i].item()
    low, high = F32_BAND
    # NaN compares false both ways: outside. A tensor of no elements is 0 already.
    outside = [i for i, v in enumerate(values) if not low <= v <= high and tensors[i].numel()]
    if outside:
        # float32 squares accumulated in float64 neither underflow nor overflow (``reductions``).
        for i, norm in zip(outside, torch._foreach_norm([tensors[i] for i in outside], 2, dtype=F64)):
            found[i] = norm
    return found


def _long_l2(t):
    """The L2 norm of a float32 CPU tensor of more than ``LONG`` elements, float64 0-d: float64 sums of float32 rows."""
    flat = t.reshape(-1)
    n = t.numel()
    full = n - n % ROW
    squares = torch.linalg.vector_norm(flat[:full].view(-1, ROW), dim=1).to(F64).square().sum()
    if full < n:
        squares = squares + torch.linalg.vector_norm(flat[full:]).to(F64).square()
    return squares.sqrt()
