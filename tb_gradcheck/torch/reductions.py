"""Per-parameter reductions of the gradients on their own device, in multi-tensor kernels: a fixed number of operators.

What each statistic means is ``rowstats``' (the definitions every writer
shares); this module computes its inputs with no host synchronisation and,
between writes, with a number of operators that does not grow with the
number of parameters (each operator is a kernel launch on a GPU and a
dispatch on a CPU: a model of a few hundred parameters paid both per
parameter). The tensors are grouped by device and dtype as
``torch.nn.utils.clip_grad_norm_`` groups them, each group takes one
``torch._foreach_*`` call per quantity, and the per-tensor results are
stacked into one vector:

- the L2 norm of every gradient (``norms``): ``torch._foreach_norm(grads,
  2, dtype=torch.float64)``, which accumulates the squares in float64. A
  float32, float16 or bfloat16 element's square is then never lost: the
  smallest float32 (1.4e-45) squares to 2e-90 and the largest (3.4e38) to
  1.2e77, both far inside float64's range, so a gradient of 1e-42s is not 0,
  one of 1e30s does not overflow, and a long one is not rounded by a float32
  sum (6e-4 relative at 16 million elements on a CPU). float64 gradients,
  whose squares can leave float64's range (below 1e-154, above 1e154), are
  divided by their largest |element| first (LAPACK's scaled norm), which
  ``torch.where`` selects on the device: no branch on the host. A CPU's
  float32 gradients take the same multi-tensor norm summing in float32
  (``cpu_norms``: no float64 copy of the model per step, exact inside a
  proven band; the rare tensors outside it scaled by powers of two first);
- whether a gradient has a NaN or Inf element, at every step: its norm is
  not finite exactly then (the squares above cannot overflow), so the flag
  costs nothing beside the norm. The window counts such steps (``window``);
- at a written step (``extras``), from one multi-tensor copy of |g|: per
  unit, its largest |element| (``unit_maxima``: one ``amax`` over each
  gradient's non-unit axes, the one reduction per tensor; gradients whose
  units are single elements, biases and norms' scales, are their own),
  which is 0 exactly where the unit is dead (NaN keeps it alive); a
  gradient's max |g|, the largest of its units' (one ``segment_reduce``);
  and per gradient a ``count_nonzero`` of it (zeros) and of ``|g| * 0``
  (NaN and Inf elements: 0 where finite, NaN where not). A CPU, where a
  fresh copy costs page faults and reading a value waits for nothing, takes
  each unit's ``amax`` and ``amin`` of the gradient itself instead, and
  counts NaN and Inf only where max |g| is not finite (``_cpu_unit_maxima``,
  ``_cpu_nonfinite``).

A sparse gradient (``nn.Embedding(sparse=True)``) is coalesced first (rows
that repeat are summed, as the optimizer applies them); its values stand
for the whole gradient, whose other elements are zeros. Coalescing has a
result whose size depends on the data, so on a GPU it waits for the device.
"""

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from tb_gradcheck.torch import cpu_norms

F64 = torch.float64
INF = float("inf")
# A CPU's float32 gradients take ``cpu_norms``' float32 multi-tensor norm; False takes the float64 one there
# too (what a GPU runs: the operator-count tests count both ways).
CPU_WAYS = True


def values(grad):
    """The dense gradient itself, or a sparse gradient's coalesced values."""
    if grad.is_sparse:
        return grad.coalesce().values()
    return grad


def _by_group(tensors, reduce):
    """Per tensor, ``reduce``'s 0-d results, ``reduce`` called once per device and dtype: a tuple of lists.

    ``reduce(group)`` returns a tuple of lists of 0-d tensors, one per
    tensor of the group; the lists come back in ``tensors``' order, moved to
    the first tensor's device when there are several.
    """
    grouped = _group_tensors_by_device_and_dtype([list(tensors)], with_indices=True)
    if len(grouped) == 1:
        (((group,), _),) = grouped.values()
        return reduce(group)
    device = tensors[0].device
    out = None
    for (group,), index in grouped.values():
        found = reduce(group)
        if out is None:
            out = tuple([None] * len(tensors) for _ in found)
        for into, values_ in zip(out, found):
            for i, value in zip(index, values_):
                into[i] = value.to(device)
    return out


def _l2(group):
    if CPU_WAYS and group[0].device.type == "cpu" and group[0].dtype == torch.float32:
        return (cpu_norms.l2(group),)  # no float64 copy of the model per step (cpu_norms says why)
    if group[0].dtype.is_complex:
        # ||z|| over |z|^2 = re^2 + im^2, summed in complex128's float64 parts: the float32 parts' squares are
        # never lost, as below (a complex128 tensor's parts are float64: its squares can leave the range).
        if group[0].dtype == torch.complex128:
            return _l2([torch.view_as_real(t) for t in group])
        return (torch._foreach_norm(group, 2, dtype=torch.complex128),)
    if group[0].dtype != F64:
        return (torch._foreach_norm(group, 2, dtype=F64),)
    # float64: the squares could leave float64's range; the scaled norm is exact at every magnitude.
    sized = [t if t.numel() else t.new_zeros(1) for t in group]  # the inf-norm of nothing is undefined: 0
    largest = torch.stack(torch._foreach_norm(sized, INF))
    fine = torch.isfinite(largest) & (largest > 0)
    scale = torch.where(fine, largest, 1.0)
    scaled = torch.stack(torch._foreach_norm(torch._foreach_div(group, list(scale.unbind())), 2)) * scale
    # All zeros: 0. An Inf element (and no NaN): Inf, which the scaled copy would make NaN. NaN: NaN.
    return (list(torch.where(fine, scaled, torch.where(largest == 0, 0.0, largest)).unbind()),)


@torch.no_grad()
def norms(tensors):
    """float64 ``[n]``: the L2 norm of each tensor, exact at every magnitude (module docstring), one kernel per dtype."""
    if not tensors:
        return torch.zeros(0, dtype=F64)
    return torch.stack(_by_group(tensors, _l2)[0])


@torch.no_grad()
def step_norms(tensors, out):
    """Writes float64 L2 norms to ``out[0]`` and non-finite flags (1.0: a NaN or Inf element) to ``out[1]``.

    ``out`` is ``[2, n]``. A fixed number of operators whatever ``n``.
    """
    norm = out[0]
    torch.stack(_by_group(tensors, _l2)[0], out=norm)
    torch.logical_not(torch.isfinite(norm), out=out[1])
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


def _elementwise(t, spec, rows):
    """Whether each unit of ``t`` is one element, in ``t``'s own order (a bias, a norm's scale, a weight norm's g)."""
    return rows is None and t.dim() >= 1 and t.numel() == spec.units and t.numel() > 0


def unit_maxima(magnitudes, specs, sparse):
    """``[units]``: the largest |element| of each unit of each gradient, in parameter order; 0 exactly where dead.

    ``magnitudes`` are the gradients' |g| (NaN stays NaN: such a unit is
    alive). A gradient whose units are its first axis (every ``Linear``,
    ``ConvNd``, ``[out, ...]`` weight) takes one ``amax`` over its other axes;
    gradients whose units are single elements (biases, norms' scales) are
    their own maxima, laid out flat together (``torch._chunk_cat``, one copy);
    any other unit layout (an embedding table's last axis, a transposed
    convolution's groups) is reshaped to its ``modules.UnitSpec`` first. A
    sparse gradient's coalesced values are rows of the whole: a unit over the
    last axis takes them as they are, any other unit needs the dense
    gradient (made here, at a written step). A unit with no elements (a
    Linear with no inputs) is dead, as TensorFlow counts it.
    """
    pieces = [None] * len(magnitudes)
    flat = [i for i, (t, s, r) in enumerate(zip(magnitudes, specs, sparse)) if _elementwise(t, s, r)]
    if len({(magnitudes[i].device, magnitudes[i].dtype) for i in flat}) == 1:
        chunk = torch._chunk_cat([magnitudes[i] for i in flat], 0, 1).view(-1)
        for i, part in zip(flat, chunk.split([specs[i].units for i in flat])):
            pieces[i] = part
    for i, (t, spec, rows) in enumerate(zip(magnitudes, specs, sparse)):
        if pieces[i] is not None:
            continue
        if _elementwise(t, spec, rows):
            pieces[i] = t.reshape(-1)
        elif rows is not None and spec.dims == (0,):
            pieces[i] = t.reshape(-1, spec.units).amax(dim=0) if t.numel() else t.new_zeros(spec.units)
        else:
            t = rows.to_dense().abs() if rows is not None else t
            if t.numel() == 0:
                pieces[i] = t.new_zeros(spec.units)
            elif spec.dims == (1,) and len(spec.view) == 2 and t.dim() >= 2 and t.shape[0] == spec.units:
                pieces[i] = t.amax(dim=tuple(range(1, t.dim())))
            else:
                pieces[i] = t.reshape(spec.view).amax(dim=spec.dims).reshape(-1)
    return torch.cat([p.to(F64) for p in pieces]) if len({p.dtype for p in pieces}) > 1 else torch.cat(pieces).to(F64)


@torch.no_grad()
def extras(tensors, specs, constants, sparse=None, cpu=None):
    """A written step's reductions besides the norms: ``{"max_abs", "nonzero", "nonfinite": [n], "unit_nonzero": [units]}``.

    Args:
      tensors: The present gradients (dense, or a sparse one's coalesced values).
      specs: Their ``modules.UnitSpec``s.
      constants: The writer's ``Constants``.
      sparse: Per tensor, the coalesced sparse gradient it came from, or None.
      cpu: Whether to take a CPU's ways (``_cpu_unit_maxima``, ``_cpu_nonfinite``);
        None (the default): where the gradients are.

    All float64. ``unit_nonzero`` is each unit's largest |element|
    (``unit_maxima``): 0 exactly where the unit is dead. A gradient's max
    |g| is the largest of its units'; its nonzero elements (NaN and Inf
    count) and its NaN and Inf elements (the nonzeros of ``|g| * 0``: 0 where
    finite, NaN where not) take a ``count_nonzero`` each, except where its
    units are its elements: those are counted from the units, for all such
    gradients in one ``segment_reduce``. Between writes the steps only flag
    non-finite gradients (``step_norms``).
    """
    sparse = sparse or [None] * len(tensors)
    # A complex gradient's statistics are its moduli's: |z| is 0 exactly where z is, NaN or Inf exactly where a
    # part is, and its largest |z| is the largest modulus (not a part's). One real copy, at a written step.
    tensors = [t.abs() if t.is_complex() else t for t in tensors]
    sparse = [r.abs() if r is not None and r.is_complex() else r for r in sparse]
    cpu = tensors[0].device.type == "cpu" if cpu is None else cpu
    magnitudes = None if cpu else torch._foreach_abs(tensors)  # one copy, multi-tensor; NaN stays NaN
    units = _cpu_unit_maxima(tensors, specs, sparse) if cpu else unit_maxima(magnitudes, specs, sparse)
    layout = tuple(s.units for s in specs)
    lengths = constants.get(("unit_lengths", layout), units.device, lambda: torch.tensor(layout))
    largest = torch.segment_reduce(units, "max", lengths=lengths, unsafe=True, initial=0.0)  # NaN propagates
    # A gradient whose units are its elements has its counts in its units: summed for all such at once.
    single = tuple(_elementwise(t, s, r) for t, s, r in zip(tensors, specs, sparse))
    flags = torch.stack([units != 0, torch.isfinite(units).logical_not_()], dim=1).to(F64)
    from_units = torch.segment_reduce(flags, "sum", lengths=lengths, axis=0, unsafe=True, initial=0.0)
    zero = largest.new_zeros((), dtype=torch.int64)
    nonzero = torch.stack([zero if one else torch.count_nonzero(t) for t, one in zip(tensors, single)])
    if cpu:
        bad = _cpu_nonfinite(tensors, single, largest)
    else:
        torch._foreach_mul_(magnitudes, 0.0)  # 0 where finite, NaN where NaN or Inf
        bad = torch.stack([zero if one else torch.count_nonzero(t) for t, one in zip(magnitudes, single)])
    if any(single):
        mask = constants.get(("single", single), units.device, lambda: torch.tensor(single))
        nonzero = torch.where(mask, from_units[:, 0], nonzero.to(F64))
        bad = torch.where(mask, from_units[:, 1], bad.to(F64))
    return {"unit_nonzero": units, "max_abs": largest, "nonzero": nonzero.to(F64), "nonfinite": bad.to(F64)}


def _cpu_unit_maxima(tensors, specs, sparse):
    """``unit_maxima`` on a CPU, from the gradients themselves: no copy of |g| (a fresh one costs page faults).

    A unit's largest |element| is the larger of its largest element and
    minus its smallest (``amax`` and ``amin`` over the unit's axes, which a
    CPU takes four times faster than a nonzero count over them); single-element
    units are laid out flat together and made positive there.
    """
    lows, highs = [None] * len(tensors), [None] * len(tensors)
    flat = [i for i, (t, s, r) in enumerate(zip(tensors, specs, sparse)) if _elementwise(t, s, r)]
    if len({tensors[i].dtype for i in flat}) == 1:
        chunk = torch._chunk_cat([tensors[i] for i in flat], 0, 1).view(-1).abs_()
        for i, part in zip(flat, chunk.split([specs[i].units for i in flat])):
            lows[i] = highs[i] = part
    for i, (t, spec, rows) in enumerate(zip(tensors, specs, sparse)):
        if highs[i] is not None:
            continue
        if rows is not None and spec.dims == (0,):
            t = t.reshape(-1, spec.units).t()
        elif rows is not None:
            t = rows.to_dense()
        if _elementwise(t, spec, None) and rows is None:
            lows[i] = highs[i] = t.reshape(-1)
        elif t.numel() == 0:
            lows[i] = highs[i] = t.new_zeros(spec.units)
        elif (rows is not None and spec.dims == (0,)) or (spec.dims == (1,) and len(spec.view) == 2):
            dims = tuple(range(1, t.dim())) if t.dim() >= 2 and t.shape[0] == spec.units else None
            part = t.reshape(spec.view) if dims is None else t
            dims = dims or (1,)
            lows[i], highs[i] = part.amin(dim=dims), part.amax(dim=dims)  # twice aminmax's speed over an axis
        else:
            part = t.reshape(spec.view)
            lows[i], highs[i] = part.amin(dim=spec.dims).reshape(-1), part.amax(dim=spec.dims).reshape(-1)
    low, high = torch.cat(lows), torch.cat(highs)
    return torch.maximum(high, low.neg_()).to(F64)  # NaN propagates


def _cpu_nonfinite(tensors, single, largest):
    """int64 ``[n]`` NaN and Inf elements, counted (on a CPU, where reading a value waits for nothing) only where
    a gradient's largest |element| says it has some: a written step's gradients seldom do."""
    counts = torch.zeros(len(tensors), dtype=torch.int64)
    for i in torch.isfinite(largest).logical_not_().nonzero().flatten().tolist():
        if not single[i]:
            counts[i] = torch.isfinite(tensors[i]).logical_not_().sum()
    return counts


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
