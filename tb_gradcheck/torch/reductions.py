"""Per-parameter reductions of the gradients on their own device, and one copy of them to the host.

What each statistic means is ``rowstats``' (the definitions every writer
shares); this module computes its inputs with few kernels and no host
synchronisation:

- the L2 norm of every gradient: ``torch._foreach_norm(grads, 2,
  dtype=torch.float64)``, one fused multi-tensor kernel on a GPU that
  accumulates in float64, so a gradient of 1e-30s is not rounded to 0 and
  one of 1e30s does not overflow;
- non-finite elements: ``isfinite`` over the gradients laid out flat, and
  the fused 1-norm of each gradient's flags (``_nonfinite``); the flat copy
  and the flags are temporaries, made a bounded chunk of gradients at a
  time (``CHUNK_BYTES``), so they never hold more than that;
- max |g|: the inf-norm (NaN propagates);
- per unit, the nonzero elements (``unit_nonzeros``: a ``segment_reduce``
  over the units that are runs of the flat gradients, ``count_nonzero``
  over the axes that are not the unit's for the rest, ``modules.UnitSpec``):
  a unit is dead when it has none (NaN is nonzero), and a parameter's
  nonzero count is their sum.

A window's step needs only the first two (``step_norms``); a written step
all of them (``full``). ``Pack`` gathers what a written step sends to the
host into one float64 vector: one device-to-host copy per written step.

A sparse gradient (``nn.Embedding(sparse=True)``) is coalesced first (rows
that repeat are summed, as the optimizer applies them); its values stand
for the whole gradient, whose other elements are zeros. Coalescing has a
result whose size depends on the data, so on a GPU it waits for the device.
"""

import math

import torch

F64 = torch.float64
# Largest total size of the gradients laid out flat at once (their copy and flags are temporaries).
CHUNK_BYTES = 256 << 20


def values(grad):
    """The dense gradient itself, or a sparse gradient's coalesced values."""
    if grad.is_sparse:
        return grad.coalesce().values()
    return grad


def step_norms(tensors, out):
    """Writes float64 L2 norms to ``out[0]`` and non-finite counts to ``out[1]`` (``out`` ``[2, n]``).

    On a GPU both are fused multi-tensor kernels, a few launches for all the
    gradients. On a CPU there is no device to wait for, so the counts are
    taken only for the gradients whose norm is not finite (a finite sum of
    squares proves there are none), and the norms one tensor at a time,
    which the CPU does several times faster than the fused float64 kernel.
    """
    if tensors[0].device.type == "cpu":
        torch.stack(norms(tensors), out=out[0])
        out[1].zero_()
        bad = (~torch.isfinite(out[0])).nonzero().flatten().tolist()
        if bad:
            out[1].index_copy_(0, torch.tensor(bad), nonfinite_counts([tensors[i] for i in bad]))
        return out
    torch.stack(norms(tensors), out=out[0])
    torch.stack(_nonfinite(tensors), out=out[1])
    return out


def present_norms(tensors, where, constants, out):
    """``step_norms`` of the present gradients placed at their parameters' columns of ``out`` ``[2, V]``, 0 elsewhere.

    Args:
      tensors: The present gradients (dense).
      where: Their parameters' indices (a list).
      constants: The writer's ``Constants``.
      out: float64 ``[2, V]``, returned.
    """
    if len(where) == out.shape[1]:
        return step_norms(tensors, out)
    out.zero_()
    if where:
        device = out.device
        index = constants.get(("where", tuple(where)), device, lambda: torch.tensor(where))
        found = step_norms(tensors, torch.empty((2, len(where)), dtype=F64, device=device))
        out.index_copy_(1, index, found)
    return out


def nonfinite_counts(tensors):
    """float64 ``[n]``: NaN and Inf elements of each tensor (see the module docstring)."""
    return torch.stack(_nonfinite(tensors))


def _nonfinite(tensors):
    """Per tensor, a float64 0-d count of its NaN and Inf elements, in a handful of kernels for all of them.

    There is no fused per-tensor count, and one ``count`` kernel per
    tensor is what made the window's steps cost milliseconds on a GPU. So a
    bounded chunk of the gradients is laid out flat (one copy), flagged
    (``isfinite``), and the flags of each tensor summed by the fused
    multi-tensor 1-norm over views of the flat flags, accumulated in float64.
    """
    out = []
    for chunk in chunks(tensors):
        flat = torch.cat([t.reshape(-1) for t in chunk])
        bad = torch.isfinite(flat).logical_not_().to(torch.float32)
        out += torch._foreach_norm(bad.split([t.numel() for t in chunk]), 1, dtype=F64)
    return out


def chunks(tensors):
    chunk, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if chunk and size + nbytes > CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(t)
        size += nbytes
    if chunk:
        yield chunk


def norms(tensors, order=2, dtype=F64):
    """Per tensor, its ``order``-norm as a 0-d tensor: fused on a GPU, one tensor at a time on a CPU.

    PyTorch's fused multi-tensor norm runs a slow per-tensor loop on a CPU
    (several times the plain norm's time, and float64 accumulation makes it
    worse), so there each tensor gets its own reduction, and the float64
    L2 norm of a float32 tensor and its inf-norm take the fast ways below.
    """
    if tensors and tensors[0].device.type == "cpu":
        if order == 2 and dtype == F64:
            return _cpu_l2(tensors)
        if order == float("inf") and dtype is None:
            return [_cpu_max_abs(t) for t in tensors]
        return [torch.linalg.vector_norm(t, order, dtype=dtype) for t in tensors]
    return list(torch._foreach_norm(tensors, order, dtype=dtype))


# Norms whose float32 squares lose nothing against float64 ones. At ||g|| >= 1e-9
# (squares summing to 1e-18 or more), the squares float32 flushes to zero
# (each below 1.2e-38) lose at most n * 1.2e-38 of the sum, under 1e-10 of
# it for any n below 1e10; at ||g|| <= 1e9 no partial sum comes near
# float32's largest value (3.4e38). Outside the band the tensor is divided by
# its largest |element| first (LAPACK's scaled norm): the squares are then at
# most 1 and sum to at least 1, inside the band again. A float64 cast of the
# tensor would do as well at 15 times the cost, and a deep network's
# vanishing gradients and updates put many tensors outside the band.
F32_BAND = (1e-9, 1e9)


def _cpu_l2(tensors):
    """float64 L2 norms of CPU tensors: float32 ones in float32 (15x a float64 cast's speed), scaled outside ``F32_BAND``."""
    f32 = [t.dtype == torch.float32 for t in tensors]
    out = [_float32_l2(t) if fast else torch.linalg.vector_norm(t, 2, dtype=F64) for t, fast in zip(tensors, f32)]
    found = torch.stack(out).to(F64)  # one cast for all (stack promotes a mix of float32 and float64)
    low, high = F32_BAND
    for i, value in enumerate(found.tolist()):
        if f32[i] and not low <= value <= high and tensors[i].numel():
            found[i] = _scaled_l2(tensors[i])
    return list(found.unbind())


def _scaled_l2(t):
    """float64 0-d: the L2 norm of a float32 CPU tensor whose float32 norm left ``F32_BAND`` (0, tiny, huge, not finite)."""
    largest = _cpu_max_abs(t).to(F64)
    value = largest.item()
    if not value or not math.isfinite(value):
        return largest  # all zeros: 0; a NaN element: NaN; an Inf element (and no NaN): Inf
    return _float32_l2(t / largest.to(t.dtype)).to(F64) * largest


# A CPU's float32 sum rounds more the more elements it adds: relative error
# 8e-8 at 65,536 elements, 5e-6 at 590,000, 6e-4 at 16 million (measured,
# torch 2.13). A longer tensor is summed in rows of ROW elements, each short
# enough to keep float32's error at its ~1e-7, and the rows' squares are
# added in float64: exact to about 1e-8 at any length, at the cost of one
# more small kernel.
ROW = 4096
LONG = 16 * ROW


def _float32_l2(t):
    """The L2 norm of a float32 CPU tensor, 0-d: float32 up to ``LONG`` elements, float64 from rows beyond."""
    n = t.numel()
    if n <= LONG:
        return torch.linalg.vector_norm(t)
    flat = t.reshape(-1)
    full = n - n % ROW
    squares = torch.linalg.vector_norm(flat[:full].view(-1, ROW), dim=1).to(F64).square().sum()
    if full < n:
        squares = squares + torch.linalg.vector_norm(flat[full:]).to(F64).square()
    return squares.sqrt()


def _cpu_max_abs(t):
    """The largest |element| of a non-empty CPU tensor (NaN if it has one): ``aminmax``, 10x the inf-norm's speed there."""
    low, high = torch.aminmax(t)
    return torch.maximum(high, low.neg())


def max_abs(tensors):
    """float64 ``[n]``: the largest |element| of each tensor (0 for an empty one; NaN if it has a NaN)."""
    nonempty = [t for t in tensors if t.numel()]
    found = norms(nonempty, float("inf"), None) if nonempty else []
    if len(nonempty) < len(tensors):
        found = iter(found)
        zero = torch.zeros((), dtype=tensors[0].dtype, device=tensors[0].device)
        found = [next(found) if t.numel() else zero for t in tensors]
    return torch.stack(found).to(F64)


def unit_nonzeros(tensors, specs, sparse, constants):
    """float64 ``[units]``: nonzero elements of each unit of each gradient, in parameter order.

    Units that are contiguous runs of a gradient (outputs first: every
    ``Linear``, ``ConvNd`` and vector) are counted together: the gradients
    laid out flat, compared with 0, and each run summed by one
    ``segment_reduce`` (a unit has fewer than 2**24 elements, exact in
    float32). Every other gradient takes one ``count_nonzero``. A sparse
    gradient's coalesced values are rows of the whole: a unit over the last
    axis counts them as they are, any other unit needs the dense gradient
    (made here, at a written step).
    """
    runs = [i for i, s in enumerate(specs) if s.dims == (1,) and len(s.view) == 2 and sparse[i] is None]
    pieces = [None] * len(tensors)
    if runs:
        device = tensors[runs[0]].device
        layout = tuple((specs[i].units, specs[i].view[1]) for i in runs)
        lengths = constants.get(
            ("unit_lengths", layout), device, lambda: torch.tensor([per for units, per in layout for _ in range(units)])
        )
        flags = (torch.cat([tensors[i].reshape(-1) for i in runs]) != 0).to(torch.float32)
        counts = torch.segment_reduce(flags, "sum", lengths=lengths, unsafe=True)
        at = 0
        for i in runs:
            pieces[i] = counts[at : at + specs[i].units]
            at += specs[i].units
    for i, (t, spec, rows) in enumerate(zip(tensors, specs, sparse)):
        if pieces[i] is not None:
            continue
        if rows is not None and spec.dims == (0,):
            pieces[i] = torch.count_nonzero(t.reshape(-1, spec.units), dim=0)
            continue
        if rows is not None:
            t = rows.to_dense()
        if t.numel() == 0:
            pieces[i] = torch.zeros(spec.units, dtype=torch.int64, device=t.device)
        else:
            pieces[i] = torch.count_nonzero(t.reshape(spec.view), dim=spec.dims).reshape(-1)
    return torch.cat(pieces).to(F64)


def extras(tensors, specs, constants, sparse=None):
    """The reductions a written step takes besides the norms: ``{"max_abs", "nonzero": [n], "unit_nonzero": [units]}``.

    Args:
      tensors: The present gradients (dense, or a sparse one's coalesced values).
      specs: Their ``modules.UnitSpec``s.
      constants: The writer's ``Constants``.
      sparse: Per tensor, the coalesced sparse gradient it came from, or None.

    ``unit_nonzero`` is 0 exactly where a unit is dead: its nonzero count on
    a GPU, its largest |element| on a CPU (``_cpu_units``). A unit of a
    gradient that has units but no elements (a Linear with no inputs) is
    dead, as TensorFlow counts it.
    """
    sparse = sparse or [None] * len(tensors)
    if tensors and tensors[0].device.type == "cpu":
        return _cpu_extras(tensors, specs, sparse, constants)
    counts = unit_nonzeros(tensors, specs, sparse, constants)
    units = tuple(s.units for s in specs)
    owner = constants.get(
        ("unit_owner", units),
        counts.device,
        lambda: torch.repeat_interleave(torch.arange(len(units)), torch.tensor(units)),
    )
    nonzero = torch.zeros(len(tensors), dtype=F64, device=counts.device).index_add_(0, owner, counts)
    return {"unit_nonzero": counts, "max_abs": max_abs(tensors), "nonzero": nonzero}


def _cpu_extras(tensors, specs, sparse, constants):
    """``extras`` on a CPU, where each kernel launch costs about as much as a small reduction.

    Each unit's value is its largest |element| (0 exactly where the unit is
    dead; NaN, alive, where it has a NaN): a CPU takes the largest and the
    smallest element over an axis at four times the speed it counts
    nonzeros over it. A gradient's max |g| is the largest of its units'. A
    gradient whose units are single elements (biases, norms' scales) needs
    no reduction of its own: its units are its elements, and its nonzero
    count is its units'; every other gradient takes one ``count_nonzero``.
    What is left is done once for all the gradients.
    """
    highs, lows, counts, single = [], [], [], []
    for t, spec, rows in zip(tensors, specs, sparse):
        view, dims = spec.view, spec.dims
        if rows is not None and dims == (0,):
            view = (-1, spec.units)  # the coalesced values are rows: units on the last axis, as they are
        elif rows is not None:
            t = rows.to_dense()
        if t.numel() == spec.units:  # one element per unit (or an empty gradient with no units)
            highs.append(t.reshape(-1))
            lows.append(highs[-1])
            single.append(True)
            continue
        if t.numel() == 0:  # units with no elements (a Linear with no inputs): dead
            highs.append(torch.zeros(spec.units, dtype=t.dtype))
            lows.append(highs[-1])
        else:
            t = t.reshape(view)
            highs.append(t.amax(dim=dims).reshape(-1))
            lows.append(t.amin(dim=dims).reshape(-1))
        counts.append(torch.count_nonzero(t))
        single.append(False)
    units = torch.maximum(torch.cat(highs), torch.cat(lows).neg_()).to(F64)  # NaN propagates
    layout = tuple(s.units for s in specs)
    lengths = constants.get(("unit_lengths", layout), units.device, lambda: torch.tensor(layout))
    largest = torch.segment_reduce(units, "max", lengths=lengths, unsafe=True)
    nonzero = torch.segment_reduce((units != 0).to(F64), "sum", lengths=lengths, unsafe=True)
    if counts:
        at = [i for i, one in enumerate(single) if not one]
        nonzero[at] = torch.stack(counts).to(F64)
    return {"unit_nonzero": units, "max_abs": largest, "nonzero": nonzero}


class Constants:
    """Small index tensors made on the host once and kept on each device.

    A host-to-device copy of pageable memory makes the host wait for the
    device, so no step between writes may make one: every index a step
    needs is built here once and reused.
    """

    def __init__(self):
        self._held = {}
        self._sources = []  # pinned host copies of what was sent to a GPU

    def get(self, key, device, make):
        """The tensor ``make()`` (built on the host) on ``device``, made at the first call for ``key``.

        On a GPU the first call copies from pinned memory without waiting
        (the pinned source is kept with it until the writer goes), so even
        a new index made between writes does not synchronise the host.
        """
        held = self._held.get((key, str(device)))
        if held is None:
            host = make()
            if device.type == "cuda":
                host = host.pin_memory()
                self._sources.append(host)
                held = host.to(device, non_blocking=True)
            else:
                held = host.to(device)
            self._held[(key, str(device))] = held
        return held
