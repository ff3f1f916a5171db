"""A step's reductions on the gradients' device: the window's norms at every step, a written step's statistics.

What the writer runs between reading the gradients and packing a written
step for the host. Between writes a step computes two columns per
parameter (``reductions.present_norms``: its norm and whether it has a
non-finite element) in a fixed number of multi-tensor operators, written
straight into the window's row; a written step adds ``reductions.extras``
and the weights' norms. On a GPU, dense gradients of one process take one
CUDA graph replay for each (``graphs``).
"""

import functools
import operator

import torch

from tb_gradcheck.torch import graphs
from tb_gradcheck.torch import reductions

F64 = torch.float64
_DATA_PTR = torch.Tensor.data_ptr
_IS_SPARSE = operator.attrgetter("is_sparse")


class StepReductions:
    """One writer's device reductions: its constants (index tensors made once) and its CUDA graphs.

    Args:
      group: The writer's ``distributed.Group``.
    """

    def __init__(self, group):
        self._group = group
        self.constants = reductions.Constants()
        self.graphs = graphs.StepGraphs()
        self._wheres = {}  # present flags -> indices of the present parameters

    def gather(self, params, dense):
        """This step's gradients as the reductions take them: ``(present, where, tensors, sparse, coalesced)``.

        ``present``: per parameter, whether it has a ``.grad``; ``where``: the
        present ones' indices (one list per pattern); ``tensors``: their
        gradients as this rank holds them, a sparse one's coalesced values;
        ``sparse``: per parameter, whether its gradient is sparse (``dense``,
        the all-False tuple, when none is); ``coalesced``: per present
        gradient, the coalesced sparse gradient or None (None when none is
        sparse). A few passes over the parameters, each in C where it can
        be: on a GPU a window's step is otherwise one graph replay.
        """
        grads = [p.grad for p in params]
        present = tuple([g is not None for g in grads])
        where = self._wheres.get(present)
        if where is None:
            where = self._wheres[present] = [i for i, p in enumerate(present) if p]
        tensors = grads if len(where) == len(grads) else [grads[i] for i in where]
        sparse = dense
        if any(map(_IS_SPARSE, tensors)):
            sparse = tuple([g is not None and g.is_sparse for g in grads])
        local = self._group.local
        coalesced = None
        if sparse is not dense:
            coalesced = [local(grads[i]).coalesce() if sparse[i] else None for i in where]
            tensors = [c.values() if c is not None else local(grads[i]) for i, c in zip(where, coalesced)]
        elif self._group.sharded:
            tensors = [local(t) for t in tensors]
        return present, where, tensors, sparse, coalesced

    def _graphed(self, tensors, device):
        return tensors and device.type == "cuda" and not self._group.sharded

    def norms(self, n, tensors, where, device, dense, window):
        """float64 ``[2, n]`` on the device: each parameter's gradient norm and non-finite flag, 0 where absent.

        Written into the window's own row where there is a ``window``.
        """
        out = window.slot(device) if window is not None else torch.empty((2, n), dtype=F64, device=device)
        if dense and self._graphed(tensors, device):
            fill = functools.partial(reductions.present_norms, tensors, where, self.constants)
            return self.graphs.run(graphs.key(where, tensors), tensors, fill, out)
        return reductions.present_norms(tensors, where, self.constants, out)

    def written(self, rows, tensors, where, device, coalesced):
        """A written step's other reductions (``reductions.extras`` where a gradient is, the weight norms): a dict.

        On a GPU, one graph replay for dense gradients of one process, keyed
        by the gradients' and the weights' addresses (``graphs``); its
        outputs are sent to the host before the next step replays it.
        """
        group = self._group

        masks = [] if group.sharded else [(i, getattr(module, name)) for i, module, name in rows.masks]

        def compute():
            out = {}
            if where:
                specs = [group.spec(rows, i) for i in where]
                out.update(reductions.extras(tensors, specs, self.constants, coalesced))
                if masks:
                    out["unit_nonzero"] = _mark_pruned(out["unit_nonzero"], masks, where, specs)
            out["weight"] = group.weight_norms(rows.params, device)
            return out

        if coalesced is None and self._graphed(tensors, device):
            masked = [m for _, m in masks]  # pruning again replaces a mask: its address is part of the key
            key = (graphs.key(where, tensors), tuple(map(_DATA_PTR, rows.params + masked)))
            static = self.graphs.outputs("written", key, tensors + list(rows.params) + masked, compute)
            if static is not None:
                return dict(static)
        return compute()


def _mark_pruned(units, masks, where, specs):
    """``units`` (each unit's largest |g|) with -1 at the units that a pruning mask zeroes whole (``core/deadunits``).

    ``masks``: ``[(parameter index, its mask)]`` (``modules.Parameters.masks``). A
    unit is pruned where its every mask element is 0 (the mask's units,
    reduced as the gradient's are); its gradient is then 0 by construction.
    The host reads -1 as pruned: a largest |g| is never negative.
    """
    position = {i: k for k, i in enumerate(where)}
    starts = [0]
    for spec in specs:
        starts.append(starts[-1] + spec.units)
    units = units.clone()
    for index, mask in masks:
        k = position.get(index)
        if k is not None:
            kept = reductions.unit_maxima([mask.abs()], [specs[k]], [None]).to(units.device)
            part = units[starts[k] : starts[k + 1]]
            units[starts[k] : starts[k + 1]] = torch.where(kept == 0, -1.0, part)
    return units
