"""Statistics of each layer row's forward output, from forward hooks registered once, read at written steps.

What is recorded (``metadata.ACTIVATION_STAT_COLUMNS``, the sums
``rowstats.ACTIVATION_SUMS``). A layer row is the module that owns the row's
parameters (``modules``); its output is what its ``forward`` returns (a
tuple's first tensor: an LSTM's output sequence). A ``MultiheadAttention``
returns its ``out_proj``'s output, never calling that Linear: the output is
``out_proj``'s row's, and the attention's own row has none (``_output_rows``).
Every call of the module in training mode at a recorded
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
  dead fraction (MISSING), nor do rows followed by anything else. In an
  ``nn.Sequential`` the row's own hook measures it on the activation's
  input (a channel's largest input above 0 is a positive output), and the
  activation module gets no hook: every hook costs every forward call a few
  microseconds, written step or not.
- Saturation (``act_saturated_fraction``): the same for a following
  ``torch.nn.Tanh`` or ``Sigmoid`` module, the fraction of its outputs
  within 1% of its range from a bound (``metadata`` gives the reason).

Cost. The hooks are registered once, when the writer is made, before
``torch.compile`` traces the model (a compiled graph ignores hooks added
later). At a step that is not written they check one flag and return. At a
recorded step each call reduces its output on the output's device (a norm, a
max, a count; no host synchronisation; on a CPU, where reading a number waits
for no device, the count only where the norm is not finite) into a few numbers kept on the
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

import warnings

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
# Device constants kept (Recorder._constant): a few per model; more means shapes that change from step to step.
_MAX_CONSTANTS = 64


def _in_backward():
    """Whether this forward call runs inside the autograd engine: a checkpoint's recomputation."""
    if torch.compiler.is_compiling():
        return False  # a compiled graph recomputes checkpointed layers without running Python hooks
    return torch._C._current_graph_task_id() != -1


def _kind(activation):
    if isinstance(activation, _RELUS):
        return "relu"
    return "tanh" if isinstance(activation, torch.nn.Tanh) else "sigmoid"


def _output_rows(model, owners):
    """``{module path: the row whose output its forward returns}``: a row module's own, with one exception.

    ``nn.MultiheadAttention`` applies its ``out_proj`` inside its functional
    forward and never calls that Linear's ``forward``: what it returns is
    ``out_proj``'s output, which is that row's; its own row (the packed q, k,
    v projections) has an output no hook sees, so its columns are MISSING.
    """
    rows = {path: path for path in owners}
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.MultiheadAttention):
            out_proj = f"{path}.out_proj" if path else "out_proj"
            rows.pop(path, None)
            if rows.pop(out_proj, None) is not None:
                rows[path] = out_proj
    return rows


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
        self.ran = False  # whether a row hook was called since the last write, armed
        self._hooked = True  # whether a row module has a hook (known at the first write)
        self._warned = False
        self._handles = []
        self._constants = {}  # (device, host numbers) -> their device tensor, made once
        self.clear()
        # Every module that holds a parameter: a tied one's row is its holder that runs first (``modules``),
        # known at the first write; the other holders' hooks are removed then (``at_write``).
        owners = {modules.owner_path(n) for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
        self._row_hooks = {}  # module path -> its row hook, until the rows are known
        # A row module followed by an activation module in an nn.Sequential: its hook measures the activation
        # from its own output (the pre-activation), and the activation module needs no hook of its own (each
        # hook costs every forward call a few microseconds, written step or not).
        after, claimed = {}, set()
        for path, module in model.named_modules():
            if isinstance(module, torch.nn.Sequential):
                children = list(module.named_children())
                for (name, _), (_, following) in zip(children, children[1:]):
                    child_path = f"{path}.{name}" if path else name
                    if child_path in owners and isinstance(following, _RELUS + _SQUASHES):
                        after[child_path] = _kind(following)
                        claimed.add(id(following))
        rows = _output_rows(model, owners)
        for path, module in model.named_modules():
            row = rows.get(path)
            if row is not None:
                axis = 1 if isinstance(module, _CHANNELS_FIRST) else -1
                handle = module.register_forward_hook(self._row_hook(module, row, axis, after.get(path)))
                self._handles.append(handle)
                self._row_hooks[row] = handle
            elif isinstance(module, _RELUS + _SQUASHES) and id(module) not in claimed:
                self._handles.append(module.register_forward_hook(self._follower_hook(_kind(module))))

    def _row_hook(self, owner, path, axis, follower):
        def hook(module, args, output):
            # ``copy.deepcopy`` of the model copies its hooks: an EMA or SWA copy (``AveragedModel``), a
            # teacher or target network made after the writer calls this hook with its own module. Its outputs
            # are not the model's.
            if not self.armed or module is not owner:
                return
            self.ran = True  # this step's forward ran the hooks (``at_write`` warns of a graph that skips them)
            if not module.training or _in_backward():
                return
            out = _first_tensor(output)
            if out is None or not (out.is_floating_point() or out.is_complex()) or out.numel() == 0:
                return
            flat = out.detach().reshape(-1)
            if flat.is_complex():
                flat = flat.abs()
            # Three reductions a call, each one operator; they are combined per layer at the write.
            # The squares in float32 at least: a bf16 or fp16 output's would overflow in its own dtype.
            wide = torch.float64 if flat.dtype == torch.float64 else torch.float32
            norm = torch.linalg.vector_norm(flat, dtype=wide)
            self._norms.append(norm)
            # max |a| from the extremes: one pass, NaN if any is NaN (the inf-norm takes ten times as long on a CPU).
            self._extremes.append(torch.aminmax(flat))
            if flat.device.type == "cpu" and not torch.compiler.is_compiling() and bool(torch.isfinite(norm)):
                # A finite sum of squares has no NaN or Inf element. On a CPU reading it waits for no device, so
                # the count's three passes over the output (half a written step's work) run only when needed.
                self._nonfinite.append(torch.zeros((), dtype=wide))
            else:
                # a - a is 0 where a is finite and NaN where it is NaN or Inf: as 1s, their sum counts the
                # non-finite elements, in float operators (a boolean mask and its count take longer on a CPU).
                self._nonfinite.append(torch.nan_to_num(flat - flat, nan=1.0).sum(dtype=wide))
            self._calls.append((path, flat.numel()))
            if follower is not None:
                self._follow(path, axis, follower, out.detach(), before_activation=True)
            else:
                self._last = (path, out, axis)

        return hook

    def _follower_hook(self, kind):
        def hook(module, args, output):
            last = self._last
            if not self.armed or last is None or not args or args[0] is not last[1] or _in_backward():
                return
            path, _, axis = last
            self._follow(path, axis, kind, output.detach(), before_activation=False)

        return hook

    def _follow(self, path, axis, kind, out, before_activation):
        """Records what the activation ``kind`` after row ``path`` makes of ``out`` (its input or its output)."""
        if kind != "relu":
            # |tanh(x)| > 0.98 where |x| > atanh(0.98); sigmoid(x) within 0.01 of 0 or 1 where |x| > log(99).
            if before_activation:
                near = out.abs() > (rowstats.TANH_INPUT if kind == "tanh" else rowstats.SIGMOID_INPUT)
            elif kind == "tanh":
                near = out.abs() > rowstats.TANH_OUTPUT
            else:
                band = rowstats.SATURATION_BAND
                near = (out < band) | (out > 1 - band)
            self._saturated.append((path, out.numel(), torch.count_nonzero(near)))
        elif out.dim() > 0:
            # A unit is alive where the ReLU passes a positive value anywhere in the batch: where the largest
            # value of its channel, before the ReLU or after it, is above 0.
            unit = axis % out.dim()
            peak = out.amax(dim=[d for d in range(out.dim()) if d != unit]) if out.dim() > 1 else out
            before = self._alive.get(path)
            if before is not None and before.shape == peak.shape:
                peak = torch.maximum(before, peak)  # another call of the layer at this step: the same units
            self._alive[path] = peak

    def at_write(self, due, next_due, rows, device):
        """At the writer's ``write(step)``: ``{"act": sums}`` for a written step (``take``), else ``{}``; arms the next.

        Args:
          due: Whether ``step`` is a written step.
          next_due: Whether ``step + 1`` is: the next forward pass is recorded.
          rows: The writer's ``modules.Parameters``.
          device: Where the sums go (the step's other statistics').
        """
        if self._row_hooks:
            # The rows are known now: a holder of tied parameters that is not their row (a tied LM head) would
            # reduce its output at every recorded step for nothing.
            layers = set(rows.structure.layer_names)
            for path, handle in self._row_hooks.items():
                if path not in layers:
                    handle.remove()
            self._hooked = bool(layers & set(self._row_hooks))
            self._row_hooks = {}
        if due and self.armed and self._hooked and not self.ran and not self._warned:
            self._warned = True
            warnings.warn(
                "tb_gradcheck: activations=True, but no layer's forward hook ran in this step's forward pass, so "
                "its act_* columns are MISSING. A graph torch.compile made before this writer added its hooks "
                "runs none of them: compiled from this model, or from another instance of its class earlier in "
                "this process (dynamo does not guard on hooks: torch._dynamo.config.skip_nnmodule_hook_guards). "
                "Make the writer before the first compiled call, or call torch._dynamo.reset() before making it.",
                stacklevel=4,
            )
        taken = {"act": self.take(rows.structure.layer_names, device)} if due else {}
        self.clear()
        # Decided before the next forward pass, whose hooks only check this flag.
        self.armed = next_due
        return taken

    def take(self, layer_names, device):
        """float64 ``[L, len(ACTIVATION_SUMS)]`` on ``device``: the recorded step's sums per layer row.

        A fixed number of operators whatever the layers: each per-call list
        stacked once and added into its layers (``index_add_``,
        ``scatter_reduce_``). A row without a record (its module did not
        run, or is not a module) has elements 0, which
        ``rowstats.activation_values`` reads as MISSING.
        """
        at = {name: i for i, name in enumerate(layer_names)}
        n = len(layer_names)
        # What the host knows (elements, units, squashed elements per layer), as Python numbers: one constant.
        host = [[0.0] * n for _ in range(3)]
        calls = [(k, at[p]) for k, (p, size) in enumerate(self._calls) if p in at]
        for k, i in calls:
            host[0][i] += self._calls[k][1]
        alive = [(at[p], a) for p, a in self._alive.items() if p in at]
        for i, a in alive:
            host[1][i] = float(a.numel())
        saturated = [(at[p], size, count) for p, size, count in self._saturated if p in at]
        for i, size, _ in saturated:
            host[2][i] += size
        zero = torch.zeros(n, dtype=F64, device=device)
        sums = dict.fromkeys(rowstats.ACTIVATION_SUMS, zero)
        sums["elements"], sums["units"], sums["squashed"] = self._constant(device, host, dtype=F64).unbind(0)

        def stacked(values):
            return torch.stack([v.to(device) for v in values]).to(F64)

        if calls:
            index = self._constant(device, [i for _, i in calls])
            keep = [k for k, _ in calls]
            sums["squares"] = zero.index_add(0, index, stacked([self._norms[k] for k in keep]) ** 2)
            lowest = stacked([self._extremes[k][0] for k in keep])
            largest = torch.maximum(-lowest, stacked([self._extremes[k][1] for k in keep]))  # NaN propagates
            sums["max_abs"] = zero.scatter_reduce(0, index, largest, "amax", include_self=False)
            sums["nonfinite"] = zero.index_add(0, index, stacked([self._nonfinite[k] for k in keep]))
        if alive:
            # Every unit's peak in one vector; its layer's alive count by one index_add.
            peaks = torch.cat([a.to(device).reshape(-1) for _, a in alive])
            # Keyed by (layer, units), not by the expanded list: building that list is the cost being saved.
            shape = [(i, a.numel()) for i, a in alive]
            owner = self._constant(device, shape, lambda: [i for i, units in shape for _ in range(units)])
            # A unit whose output holds a NaN is not dead (its output is not 0): it shows in the non-finite count.
            alive = (peaks > 0) | torch.isnan(peaks)
            sums["dead_units"] = sums["units"] - zero.index_add(0, owner, alive.to(F64))
        if saturated:
            index = self._constant(device, [i for i, _, _ in saturated])
            sums["saturated"] = zero.index_add(0, index, stacked([c for _, _, c in saturated]))
        return torch.stack([sums[name] for name in rowstats.ACTIVATION_SUMS], dim=1)

    def _constant(self, device, values, make=None, dtype=torch.int64):
        """``values`` (Python numbers, nested lists; or ``make()``'s) on ``device``, made once: then no copy, no wait.

        Keyed by ``values``; the cache is emptied when it holds many (steps
        whose shapes keep changing), so it stays small.
        """
        key = (device, dtype, repr(values))
        found = self._constants.get(key)
        if found is None:
            if len(self._constants) >= _MAX_CONSTANTS:
                self._constants.clear()
            values = torch.tensor(make() if make is not None else values, dtype=dtype)
            if device.type == "cuda":
                values = values.pin_memory().to(device, non_blocking=True)  # staged: the host does not wait
            found = self._constants[key] = values.to(device)
        return found

    def clear(self):
        """Drops what was recorded (a recorded step that was not written)."""
        self._norms, self._extremes, self._nonfinite, self._calls = [], [], [], []
        self._alive, self._saturated, self._last = {}, [], None
        self.ran = False

    def remove(self):
        """Removes the hooks (the writer's ``close``)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()
