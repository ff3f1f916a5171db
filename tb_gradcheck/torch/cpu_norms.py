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
nothing and dispatches no operator); the rare tensors outside the band (0, tiny, huge, not finite: a
vanishing or exploding gradient) are scaled by powers of two and normed
again in float32 (``_scaled_l2``), a fixed number of operators for all of
them. A step costs the same few operators whatever the number of tensors;
only a tensor longer than ``LONG`` adds a few of its own (it takes far
longer to sum than to dispatch).
"""

import math

import torch

F64 = torch.float64

# Norms whose float32 squares lose nothing against float64 ones. At ||g|| >= 1e-9
# (squares summing to 1e-18 or more), the squares float32 flushes to zero
# (each below 1.2e-38) lose at most n * 1.2e-38 of the sum, under 1e-10 of
# it for any n below 1e10; at ||g|| <= 1e9 no partial sum comes near
# float32's largest value (3.4e38). Outside the band the tensor is scaled by a
# power of two first (``_scaled_l2``), which brings its squares into the band.
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
    scaled = [i for i in outside if tensors[i].numel() <= LONG]
    if scaled:
        for i, norm in zip(scaled, _scaled_l2([tensors[i] for i in scaled], [values[i] for i in scaled])):
            found[i] = norm
    wide = [i for i in outside if tensors[i].numel() > LONG]
    if wide:
        # float32 squares accumulated in float64 neither underflow nor overflow, at any length (``reductions``).
        for i, norm in zip(wide, torch._foreach_norm([tensors[i] for i in wide], 2, dtype=F64)):
            found[i] = norm
    return found


def _scaled_l2(tensors, norms):
    """float64 0-d L2 norms of float32 tensors of up to ``LONG`` elements whose float32 norms ``norms`` left ``F32_BAND``.

    Each tensor is multiplied by a power of two (exact) that brings its norm
    near 1, and its float32 norm is taken again and divided by it: two
    multi-tensor operators for all of them, in float32 (a float64 cast
    costs a CPU 18 times the float32 norm). Why the scaled squares lose
    nothing: a nonzero float32 norm is at least 3.7e-23 (the squares of the
    smallest normal and subnormal float32 flush below 1.4e-45) and misses at
    most n * 1.2e-38 of the squares, so scaled by 2**-floor(log2(norm)) the
    squares sum to at least 1 and at most 1 + 1.2 * n, far from float32's
    limits; the squares flushed after scaling are under n * 1.4e-45 of a
    sum of at least 1. A float32 norm of 0 means every element is under
    3.7e-23 (or 0): scaled by 2**100 the smallest float32 squares to 3e-30
    and the largest (3.7e-23 * 2**100) to 2e15. An Inf or NaN float32 norm
    is an overflow (an element above 1.8e19) or an Inf or NaN element:
    scaled by 2**-100 the largest float32 squares to 7e16, and Inf and NaN
    stay.
    """
    scales = []
    for v in norms:
        if v == 0:
            scales.append(2.0**100)
        elif v != v or v == float("inf"):
            scales.append(2.0**-100)
        else:
            scales.append(2.0 ** -math.floor(math.log2(v)))
    again = torch.stack(torch._foreach_norm(torch._foreach_mul(tensors, scales), 2)).to(F64)
    return list((again / torch.tensor(scales, dtype=F64)).unbind())


def _long_l2(t):
    """The L2 norm of a float32 CPU tensor of more than ``LONG`` elements, float64 0-d: float64 sums of float32 rows."""
    flat = t.reshape(-1)
    n = t.numel()
    full = n - n % ROW
    squares = torch.linalg.vector_norm(flat[:full].view(-1, ROW), dim=1).to(F64).square().sum()
    if full < n:
        squares = squares + torch.linalg.vector_norm(flat[full:]).to(F64).square()
    return squares.sqrt()
