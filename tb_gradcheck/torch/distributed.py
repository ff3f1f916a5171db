"""Several processes: which rank writes, and whole-parameter statistics from sharded parameters.

- One process, or ``DistributedDataParallel``: every rank holds the same
  all-reduced gradient after ``backward``, so rank 0 computes and writes
  one event per step and the other ranks do nothing (not even the
  reductions, whose result they would throw away).
- FSDP2 and other ``DTensor``-sharded parameters: each rank holds a shard
  of each gradient. Every rank reduces its shards (norms as sums of
  squares, element counts, per-unit nonzero counts placed at their units'
  whole-parameter index, max |g| in a slot of its own), and at a written
  step the ranks sum those vectors in one all-reduce; rank 0 writes. The
  gradients themselves are never gathered. Every rank must call ``write``
  at every step (the all-reduce is a collective), as it calls
  ``backward``. Supported placements: ``Shard(d)`` on a one-dimensional mesh
  of every rank (FSDP2's).
"""

import math

import numpy as np
import torch

from tb_gradcheck.torch import host
from tb_gradcheck.torch import modules
from tb_gradcheck.torch import reductions
from tb_gradcheck.torch import window

F64 = torch.float64


_DTENSOR = []


def _dtensor_class():
    """``DTensor``, or None in a torch built without distributed (looked up once)."""
    if not _DTENSOR:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:
            DTensor = None
        _DTENSOR.append(DTensor)
    return _DTENSOR[0]


def rank():
    """This process's rank in the default process group (0 without one)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


class Group:
    """This process's part in recording a model: whether it computes, whether it writes, and its shards.

    Args:
      model: The unwrapped model.
    """

    def __init__(self, model):
        self.rank = rank()
        self.sharded = any(_is_dtensor(p) for p in model.parameters())
        self.writes = self.rank == 0
        self.computes = self.writes or self.sharded
        self._units = None  # sharded: per parameter, (first global unit, local units)

    # -- tensors as this rank holds them ---------------------------------------

    def local(self, tensor):
        """The part of ``tensor`` this rank holds (a DTensor's local shard; anything else as is)."""
        return tensor.to_local() if _is_dtensor(tensor) else tensor

    def check(self, rows):
        """Checks the placements of sharded parameters and lays out their units; called once, with the rows."""
        if not self.sharded:
            return
        self._units = []
        for name, p, spec in zip(rows.names, rows.params, rows.specs):
            self._units.append(_local_units(name, p, spec, self.local(p)))

    def spec(self, rows, i):
        """The ``modules.UnitSpec`` of parameter ``i`` as this rank holds it."""
        spec = rows.specs[i]
        if not self.sharded:
            return spec
        return _local_spec(spec, tuple(self.local(rows.params[i]).shape), self._units[i][1])

    def window(self, structure, constants):
        """A new window for the steps between writes (held for the all-reduce when sharded)."""
        cls = window.HeldWindow if self.sharded else window.DeviceWindow
        return cls(structure, constants)

    def weight_norms(self, params, device):
        """float64 ``[V]`` norms of this rank's part of each parameter (partial until ``reduce``)."""
        return reductions.norms([self.local(p) for p in params]).to(device)  # under no_grad: no detach

    # -- collectives ---------------------------------------------------------------

    def sum_shards(self, squares):
        """Per-parameter sums of squares over the shards (an all-reduce when sharded)."""
        if self.sharded:
            squares = squares.clone()
            torch.distributed.all_reduce(squares)
        return squares

    def total_norm(self, tensors, norm_type):
        """The ``norm_type`` norm of all ``tensors`` (this rank's shards) together."""
        if not self.sharded:
            return torch.nn.utils.get_total_norm(tensors, norm_type)
        if math.isinf(norm_type):
            local = torch.stack([t.abs().max() if t.numel() else t.new_zeros(()) for t in tensors]).max().to(F64)
            torch.distributed.all_reduce(local, op=torch.distributed.ReduceOp.MAX)
            return local
        local = torch.stack([torch.linalg.vector_norm(t, norm_type, dtype=F64) ** norm_type for t in tensors]).sum()
        torch.distributed.all_reduce(local)
        return local ** (1.0 / norm_type)

    def reduce(self, pack, present, unit_present):
        """The host values of a written step's ``pack``; None on a rank that does not write.

        One process: one copy. Sharded: the partial sums of every rank are
        summed in one all-reduce first, then copied (``_sharded``).
        ``present`` (per parameter) and ``unit_present`` (the present
        parameters' indices) say which units the pack's per-unit counts are of.
        """
        if not self.sharded:
            return pack.to_host() if self.writes else None
        return self._sharded(pack, unit_present)

    def send(self, pack, present, unit_present, buffers):
        """``reduce`` without waiting where it can: a ``host.Copy`` of the pack's values; None on a rank that does not write.

        One process: the copy is started and the host goes on (``host.send``).
        Sharded: the all-reduce and its copy are waited for, as in ``reduce``.
        """
        if not self.sharded:
            return pack.send(buffers) if self.writes else None
        values = self._sharded(pack, unit_present)
        return None if values is None else host.arrived(values)

    def _sharded(self, pack, where):
        names = list(pack.names)
        parts = dict(zip(names, pack.parts))
        device = next(iter(parts.values())).device
        world = torch.distributed.get_world_size()
        vectors = {}
        for name, value in parts.items():
            if name in ("norm", "weight"):
                vectors[name] = value * value
            elif name == "unit_nonzero":
                vectors[name] = self._global_units(value, where, device)
            elif name == "max_abs":
                slots = torch.zeros((world, value.numel()), dtype=F64, device=device)
                slots[self.rank] = value
                vectors[name] = slots.reshape(-1)
            elif name in ("before_clip", "loss_scale"):
                # Already whole (the clip reduced its norms) or the same on every rank.
                vectors[name] = value * (1.0 if self.rank == 0 else 0.0)
            else:  # counts, the held window steps, the update's squares: sums over shards
                vectors[name] = value
        flat = torch.cat([v.reshape(-1) for v in vectors.values()])
        torch.distributed.all_reduce(flat)
        if not self.writes:
            return None
        flat = flat.cpu().numpy()
        out, at = {}, 0
        for name, v in vectors.items():
            n = v.numel()
            out[name] = flat[at : at + n].reshape(v.shape)
            at += n
        for name in ("norm", "weight"):
            if name in out:
                out[name] = np.sqrt(out[name])
        if "max_abs" in out:
            slots = out["max_abs"].reshape(world, -1)
            out["max_abs"] = np.where(np.isnan(slots).any(axis=0), np.nan, slots.max(axis=0))
        return out

    def _global_units(self, counts, where, device):
        """This rank's per-unit nonzero counts placed at their units' index among the present parameters' units."""
        sizes = [self._units[i][2] for i in where]
        total = int(sum(sizes))
        out = torch.zeros(total, dtype=F64, device=device)
        starts = np.concatenate([[0], np.cumsum(sizes)])[:-1]
        at = 0
        for k, i in enumerate(where):
            first, local = self._units[i][0], self._units[i][1]
            if local:
                out[int(starts[k]) + first : int(starts[k]) + first + local] += counts[at : at + local]
            at += local
        return out


def _is_dtensor(tensor):
    cls = _dtensor_class()
    return cls is not None and isinstance(tensor, cls)


def _local_units(name, param, spec, local):
    """``(first global unit, local units, global units)`` of a parameter as this rank holds it."""
    if not _is_dtensor(param):
        return (0, spec.units, spec.units)
    from torch.distributed.tensor import Shard

    mesh = param.device_mesh
    placements = tuple(param.placements)
    world = torch.distributed.get_world_size()
    if mesh.ndim != 1 or len(placements) != 1 or not isinstance(placements[0], Shard) or mesh.size() != world:
        raise ValueError(
            "Expected parameters sharded with Shard(d) on a one-dimensional mesh of every rank (FSDP2's). "
            f"Received: {name} with placements {placements} on a mesh of shape {tuple(mesh.shape)}, "
            f"{world} ranks"
        )
    placement = placements[0]
    unit_axis = _unit_axis(spec, param.shape)
    if placement.dim != unit_axis:
        return (0, spec.units, spec.units)
    # torch.chunk's split, as Shard(d) lays a dimension out: ceil(n / world) per rank.
    n, world = int(param.shape[unit_axis]), mesh.size()
    per = -(-n // world)
    first = min(mesh.get_local_rank() * per, n)
    # Units per index of the sharded axis: 1, or a stacked experts weight's outputs per expert (modules).
    each = spec.units // n if unit_axis == 0 else 1
    return (first * each, int(local.shape[unit_axis]) * each, spec.units)


def _unit_axis(spec, shape):
    """The parameter axis that indexes a spec's units: 0 (outputs first) or the last (tables), None otherwise."""
    if spec.dims == (1,) and len(spec.view) == 2:
        return 0 if len(shape) else None
    if spec.dims == (0,):
        return len(shape) - 1
    return None


def _local_spec(spec, local_shape, local_units):
    """A ``UnitSpec`` over a shard: the same unit axis, ``local_units`` of them, the rest of the shard per unit."""
    numel = int(np.prod(local_shape, dtype=np.int64))
    if spec.dims == (0,):
        return modules.UnitSpec((numel // max(local_units, 1), local_units), (0,), local_units)
    if spec.dims == (1,) and len(spec.view) == 2:
        return modules.UnitSpec((local_units, numel // max(local_units, 1)), (1,), local_units)
    raise ValueError(f"Expected a unit over the first or the last axis of a sharded parameter. Received: {spec}")
