"""A CPU's way to exact L2 norms of float32 gradients: float32 sums inside a proven band, no float64 copy.

On a GPU a step is bound by kernel launches, so ``reductions`` takes every
norm in one multi-tensor kernel that accumulates in float64. A CPU has no
launch to save, and there that kernel first casts each tensor to float64: a
copy of the whole model per step (ResNet-50's 25.6 M gradients: 1.5x its
step between writes on this machine's CPU, measured with
``python -m benchmarks --only torch_models --models resnet50``). So a CPU
sums float32 gradients in float32, per tensor, where that loses nothing
against float64, and only the rare tensor outside the band is rescaled.
"""

import torch

F64 = torch.float64

# Norms whose float32 squares lose nothing against float64 ones. At ||g|| >= 1e-9
# (squares summing to 1e-18 or more), the squares float32 flushes to zero
# (each below 1.2e-38) lose at most n * 1.2e-38 of the sum, under 1e-10 of
# it for any n below 1e10; at ||g|| <= 1e9 no partial sum comes near
# float32's largest value (3.4e38). Outside the band the tensor is divided by
# its largest |element| first (LAPACK's scaled norm): the squares are then at
# most 1 and sum to at least 1, inside the band again.
F32_BAND = (1e-9, 1e9)

# A CPU's float32 sum rounds more the more elements it adds: relative error
# 8e-8 at 65,536 elements, 5e-6 at 590,000, 6e-4 at 16 million (measured,
# torch 2.13). A longer tensor is summed in rows of ROW elements, each short
# enough to keep float32's error at its ~1e-7, and the rows' squares are
# added in float64: exact to about 1e-8 at any length, at the cost of one
# more small kernel.
ROW = 4096
LONG = 16 * ROW


def l2(tensors):
    """float64 0-d L2 norms of float32 CPU tensors (a list), exact at every magnitude.

    Reads the norms on the host to find the ones outside ``F32_BAND``: on a
    CPU that waits for nothing.
    """
    found = torch.stack([_float32_l2(t) for t in tensors]).to(F64)
    low, high = F32_BAND
    for i, value in enumerate(found.tolist()):
        if not low <= value <= high and tensors[i].numel():
            found[i] = _scaled_l2(tensors[i])
    return list(found.unbind())


def _scaled_l2(t):
    """float64 0-d: the L2 norm of a float32 CPU tensor whose float32 norm left ``F32_BAND`` (0, tiny, huge, not finite)."""
    low, high = torch.aminmax(t)  # 10x the inf-norm's speed on a CPU
    largest = torch.maximum(high, low.neg()).to(F64)
    value = largest.item()
    if not value or value != value or value == float("inf"):
        return largest  # all zeros: 0; a NaN element: NaN; an Inf element (and no NaN): Inf
    return _float32_l2(t / largest.to(t.dtype)).to(F64) * largest


def _float32_l2(t):
    """The L2 norm of a float32 CPU tensor, 0-d: float32 up to ``LONG`` elements, float64 from rows beyond."""
    n = t.numel()
    if n <= LONG:
        return torch.linalg.vector_norm(t).to(F64)
    flat = t.reshape(-1)
    full = n - n % ROW
    squares = torch.linalg.vector_norm(flat[:full].view(-1, ROW), dim=1).to(F64).square().sum()
    if full < n:
        squares = squares + torch.linalg.vector_norm(flat[full:]).to(F64).square()
    return squares.sqrt()
