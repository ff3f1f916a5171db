"""Statistics of each layer row's forward output, from forward hooks registered once, read at written steps.

What is recorded (``metadata.ACTIVATION_STAT_COLUMNS``, the sums
``rowstats.ACTIVATION_SUMS``). A layer row is the module that owns the row's
parameters (``modules``); its output is what its ``forward`` returns (a
tuple's first tensor: ``MultiheadAttention``'s attention output, an LSTM's
output sequence). Every call of the module in training mode at a recorded
step counts: gradient accumulation's micro-batches and a module used twice
add up. A module in eval mode (a validation pass between training steps)
is not counted.

- Dead by output (``act_dead_fraction``): where the very tensor a row's
  module returned goes into a ``torch.nn.ReLU`` or ``ReLU6`` module (an
  ``nn.Sequential``'s next module, or a module-form activation in any
  ``forward``), a unit (an output channel: the last axis, axis 1 for
  convolutions and batch/group/instance norms) is dead when the ReLU's
  output is 0 for every element of the step's batch: no positive input
  anywhere, so its output and its gradient are exactly 0 for that batch.
  A functional ``F.relu`` cannot be seen by a hook: those rows have no
  dead fraction (MISSING), nor do rows followed by anything else.
- Saturation (``act_saturated_fraction``): the same for a following
  ``torch.nn.Tanh`` or ``Sigmoid`` module, the fraction of its outputs
  within 1% of its range from a bound (``metadata`` gives the reason).

Cost. The hooks are registered once, when the writer is made, before
``torch.compile`` traces the model (a compiled graph ignores hooks added
later). At a step that is not written they check one flag and return. At a
recorded step each call reduces its output on the output's device (a norm, a
max, a count; no host synchronisation) into a few numbers kept on the
device; the writer stacks them into the written step's one copy to the host
(``host.Pack``). Which step is recorded is decided before its forward pass:
after ``write(step)`` the recorder is armed when ``step + 1`` is a written
step (and from the start, for the first step); a recorded step that turns
out not to be written is dropped, a written step without a record has
MISSING activation columns.

Activation checkpointing. ``torch.utils.checkpoint`` runs a module's forward
again during the backward pass; that second call is not counted (it runs
inside the autograd engine: ``torch._C._current_graph_task_id() != -1``), so
a checkpointed layer counts once.
"""

import torch

from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.torch import modules

F64 = torch.float64
_RELUS = (torch.nn.ReLU, torch.nn.ReLU6)
_SQUASHES = (torch.nn.Tanh, torch.nn.Sigmoid)
_CHANNELS_FIRST = (
    torch.nn.modules.conv._ConvNd,
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.GroupNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
)
_SUMS = {name: k for k, name in enumerate(rowstats.ACTIVATION_SUMS)}
# Within 1% of the range from a bound (metadata.ACTIVATION_STAT_COLUMNS says why).
_TANH_SATURATED = 0.98
_SIGMOID_SATURATED = 0.01


def _in_backward():
    """Whether this forward call runs inside the autograd engine: a checkpoint's recomputation."""
    if torch.compiler.is_compiling():
        return False  # a compiled graph recomputes checkpointed layers without running Python hooks
    return torch._C._current_graph_task_id() != -1


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    return None


def recorder(model, group, activations):
    """The writer's ``Recorder`` for ``activations=True`` (``Off`` otherwise, or on a rank that computes nothing).

    Args:
      model: The unwrapped ``torch.nn.Module``.
      group: The writer's ``distributed.Group``.
      activations: The writer's ``activations`` argument.

    Raises:
      TypeError: ``activations`` is not a bool.
      ValueError: ``activations=True`` with sharded parameters.
    """
    if not isinstance(activations, bool):
        raise TypeError(f"Expected `activations` to be a bool. Received: {activations!r}")
    if activations and group.sharded:
        raise ValueError(
            "Expected `activations=False` with sharded (FSDP2 / DTensor) parameters: the ranks' outputs are "
            "not combined yet. Received: activations=True and DTensor parameters"
        )
    # Under DistributedDataParallel rank 0 writes its own batch's outputs; the other ranks record nothing.
    return Recorder(model) if activations and group.computes else Off()


class Off:
    """No activations: what the writer calls when ``activations=False``."""

    columns = ()

    def at_write(self, due, next_due, rows, device):
        return {}

    def remove(self):
        pass


class Recorder:
    """Forward hooks on a model's row modules and the activations that follow them.

    Args:
      model: The unwrapped ``torch.nn.Module``.
    """

    columns = metadata.ACTIVATION_STAT_COLUMNS

    def __init__(self, model):
        self.armed = True  # the first step's number is not known yet: record it
        self._records = {}  # module path -> [per-call float64 [len(ACTIVATION_SUMS)] device tensors]
        self._alive = {}  # module path -> [per-call bool [units]] of the ReLU that follows it
        self._last = None  # (path, output, unit axis) of the latest row output at a recorded step
        self._handles = []
        owners = {modules.owner_path(n) for n, p in model.named_parameters() if p.requires_grad}
        for path, module in model.named_modules():
            if path in owners:
                axis = 1 if isinstance(module, _CHANNELS_FIRST) else -1
                self._handles.append(module.register_forward_hook(self._row_hook(path, axis)))
            elif isinstance(module, _RELUS + _SQUASHES):
                self._handles.append(module.register_forward_hook(self._follower_hook(module)))

    def _row_hook(self, path, axis):
        def hook(module, args, output):
            if not self.armed or not module.training or _in_backward():
                return
            out = _first_tensor(output)
            if out is None or not (out.is_floating_point() or out.is_complex()):
                return
            self._records.setdefault(path, []).append(_reduce(out.detach()))
            self._last = (path, out, axis)

        return hook

    def _follower_hook(self, activation):
        squash = isinstance(activation, _SQUASHES)

        def hook(module, args, output):
            last = self._last
            if not self.armed or last is None or not args or args[0] is not last[1] or _in_backward():
                return
            path, _, axis = last
            out = output.detach()
            if squash:
                if isinstance(activation, torch.nn.Tanh):
                    saturated = (out.abs() > _TANH_SATURATED).sum()
                else:
                    saturated = ((out < _SIGMOID_SATURATED) | (out > 1 - _SIGMOID_SATURATED)).sum()
                record = self._records[path][-1]
                record[_SUMS["saturated"]] += saturated.to(F64)
                record[_SUMS["squashed"]] += out.numel()
            elif out.dim() > 0:
                # A unit is alive where the ReLU passed a positive value anywhere in the batch.
                units = out.movedim(axis, -1).reshape(-1, out.shape[axis])
                self._alive.setdefault(path, []).append((units > 0).any(dim=0))

        return hook

    def at_write(self, due, next_due, rows, device):
        """At the writer's ``write(step)``: ``{"act": sums}`` for a written step (``take``), else ``{}``; arms the next.

        Args:
          due: Whether ``step`` is a written step.
          next_due: Whether ``step + 1`` is: the next forward pass is recorded.
          rows: The writer's ``modules.Parameters``.
          device: Where the sums go (the step's other statistics').
        """
        taken = {"act": self.take(rows.structure.layer_names, device)} if due else {}
        self.clear()
        # Decided before the next forward pass, whose hooks only check this flag.
        self.armed = next_due
        return taken

    def take(self, layer_names, device):
        """float64 ``[L, len(ACTIVATION_SUMS)]`` on ``device``: the recorded step's sums per layer row; then clears.

        A row without a record (its module did not run, or is not a module)
        has elements 0, which ``rowstats.activation_values`` reads as MISSING.
        """
        empty = torch.zeros(len(rowstats.ACTIVATION_SUMS), dtype=F64, device=device)
        rows = []
        for name in layer_names:
            calls = self._records.get(name)
            if not calls:
                rows.append(empty)
                continue
            calls = torch.stack([c.to(device) for c in calls])
            row = calls.sum(dim=0)
            # The maximum of the calls' maxima, NaN if any is NaN (amax propagates NaN).
            row[_SUMS["max_abs"]] = calls[:, _SUMS["max_abs"]].amax()
            alive = self._alive.get(name)
            if alive and len({a.numel() for a in alive}) == 1:
                alive = torch.stack([a.to(device) for a in alive]).any(dim=0)
                row[_SUMS["dead_units"]] = (~alive).sum().to(F64)
                row[_SUMS["units"]] = alive.numel()
            rows.append(row)
        self.clear()
        return torch.stack(rows)

    def clear(self):
        """Drops what was recorded (a recorded step that was not written)."""
        self._records, self._alive, self._last = {}, {}, None

    def remove(self):
        """Removes the hooks (the writer's ``close``)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()


def _reduce(out):
    """float64 ``[len(ACTIVATION_SUMS)]``: one call's sums, on the output's device, without a host sync.

    The squares are summed in float32 at least (a bf16 or fp16 output's
    squares would overflow or lose the sum's precision in its own dtype).
    """
    n = out.numel()
    if out.is_complex():
        out = out.abs()
    wide = torch.float64 if out.dtype == torch.float64 else torch.float32
    norm = torch.linalg.vector_norm(out, dtype=wide).to(F64) if n else torch.zeros((), dtype=F64, device=out.device)
    max_abs = out.abs().amax().to(F64) if n else torch.zeros((), dtype=F64, device=out.device)
    nonfinite = (~torch.isfinite(out)).sum().to(F64)
    zero = torch.zeros((), dtype=F64, device=out.device)
    count = torch.full((), float(n), dtype=F64, device=out.device)
    return torch.stack([norm * norm, count, max_abs, nonfinite, zero, zero, zero, zero])
