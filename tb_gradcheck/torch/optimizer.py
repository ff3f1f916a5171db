"""What the optimizer did, for the PyTorch writer: the update it applied, the norm before clipping, the loss scale.

The columns and their meaning are ``tb_gradcheck.tensorflow.optimizer``' (and
``rowstats.optimizer_values``'), taken at written steps only:

- ``update_norm``, ``update_to_weight``: ``Follower`` hooks the optimizer's
  step (``register_step_pre_hook`` / ``register_step_post_hook``, which
  every ``torch.optim`` optimizer has). Before a step that follows a
  written ``write``, it copies the weights; after it, it takes the norm of
  their change, and the written step's event is written then. At any
  other step the hooks return at once. A step the ``GradScaler`` refused
  never calls the optimizer: its update is 0, and its event is written at
  the next ``write`` (or ``flush`` / ``close``).
  At the first written step (and when the parameter groups change) it
  also warns of recorded parameters with a gradient that no parameter
  group holds (``Follower._check_held``), and lists them in the layout
  (``outside_optimizer``) so the findings can name them.
- ``grad_norm_before_clip``: ``GradientWriter.clip_grad_norm_`` (``clip``)
  computes the per-parameter norms that decide the clip once, keeps them
  on the device for the next ``write``, and clips with them.
- ``loss_scale``, ``refused_steps``: ``ScaleReader`` reads a
  ``torch.amp.GradScaler``'s scale tensor (no host read), and counts on the
  device the steps whose gradient had a NaN or Inf element: the steps the
  scaler skips, by its own rule.
"""

import warnings

import torch

from tb_gradcheck.core import metadata
from tb_gradcheck.core.rowstats import MISSING
from tb_gradcheck.torch import cleared
from tb_gradcheck.torch import reductions

F64 = torch.float64
# Weights whose update is taken in a wider type (Follower._copy).
_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class Link:
    """What a ``GradientWriter`` and its optimizer hooks share: the one interface between ``writer`` and this module.

    The writer owns it and keeps its fields current; ``Follower``, ``clip``
    and ``keep_norms_before_clip`` read it and hand their results back
    through it, never through the writer's own state.

    Attributes:
      group: The writer's ``distributed.Group`` (which rank computes; shards).
      constants: The writer's device constants (``step.StepReductions.constants``).
      emit: Called with no arguments: starts the copy of the pending written
        step and writes the steps whose copy has arrived.
      rows: The ``modules.Parameters`` once the first write fixed them, else None.
      called: Whether ``write`` has been called at least once.
      closed: Whether the writer is closed.
      pending: The written step waiting for the optimizer's step (a
        ``host.Pending``), or None.
      outside: Indices of the rows with a gradient that no parameter group
        holds (``Follower._check_held``; the layout's ``outside_optimizer``).
      not_cleared: Whether a ``backward()`` added into the gradients a step
        applied (``cleared.Cleared``; the layout's ``gradients_not_cleared``).
      before_clip: Per-row norms before clipping, kept for the next ``write``
        (device float64, MISSING where no gradient), or None.
    """

    def __init__(self, group, constants, emit):
        self.group = group
        self.constants = constants
        self.emit = emit
        self.rows = None
        self.called = False
        self.closed = False
        self.pending = None
        self.outside = ()
        self.not_cleared = False
        self.before_clip = None

    def take_before_clip(self):
        """The norms kept for this ``write`` (or None); the next ``write`` starts without them."""
        before_clip, self.before_clip = self.before_clip, None
        return before_clip


class Follower:
    """The optimizer step hooks that measure the update of each written step (the module docstring).

    Args:
      link: The writer's ``Link``.
      optimizer: The ``torch.optim.Optimizer`` to hook.
    """

    def __init__(self, link, optimizer):
        self._link = link
        self._snapshot = None
        self._buffers = None  # on a CPU: the weights' copy, kept between written steps (_copy)
        self.active = True
        self._warned = False
        self._groups_seen = None  # the param_groups the unheld check last ran on (``_check_held``)
        self._unheld_warned = False
        self._cleared = cleared.Cleared(self._warn_uncleared)
        self._handles = [
            # Eager under a compiled step, as the writer's own calls (writer._eager).
            optimizer.register_step_pre_hook(torch.compiler.disable(self._before)),
            optimizer.register_step_post_hook(torch.compiler.disable(self._after)),
        ]

    def expects_step(self):
        """Whether a written step waits for the optimizer's step to be written."""
        return self.active

    def detach(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._cleared.detach()
        self._snapshot = self._buffers = None

    def _before(self, optimizer, args, kwargs):
        link = self._link
        if link.closed or not self.active:
            return
        if not link.called:
            # The loop steps before it writes: the update a write would
            # record has been applied before the write sees the gradients.
            self.active = False
            warnings.warn(
                "tb_gradcheck: the optimizer stepped before GradientWriter.write() was first called. Call "
                "write(step) after backward() and before optimizer.step() to record update_norm; it is not recorded.",
                stacklevel=3,
            )
            return
        if link.pending is None:
            return
        self._check_held(optimizer)
        local = link.group.local
        weights = [local(p) for p in link.rows.params]  # no per-tensor detach: under no_grad
        with torch.no_grad():
            self._snapshot = self._copy(weights)

    def _warn_uncleared(self):
        self._link.not_cleared = True  # in the layouts written from now on, for the findings
        warnings.warn(
            "tb_gradcheck: backward() added this step's gradients to those optimizer.step() already applied: "
            "nothing cleared them. Every step then applies the sum of all gradients so far, and the recorded "
            "gradients are that sum. Expected optimizer.zero_grad() (or model.zero_grad()) once per step, before "
            "backward().",
            stacklevel=2,
        )

    def _check_held(self, optimizer):
        """Warns, once, of recorded parameters with a gradient that no parameter group of ``optimizer`` holds.

        In PyTorch a parameter is frozen with ``requires_grad=False``: one
        that requires a gradient, gets one, and is in no group was left out
        by mistake (the optimizer built from a backbone's parameters before
        a head was added). It never moves, and the stored columns cannot
        tell that from a group at learning rate 0 (an update of exactly 0
        either way), so the writer, which sees the groups, says it here and
        in the layouts it writes from then on (``Link.outside``: the
        layout's ``outside_optimizer`` rows, which the findings read).
        Runs at written steps when the groups change (``add_param_group``):
        a pass over the parameters' ids, not at every step.
        """
        groups = optimizer.param_groups
        seen = (id(groups), len(groups), sum(len(g["params"]) for g in groups))
        if seen == self._groups_seen:
            return
        self._groups_seen = seen
        held = {id(p) for g in groups for p in g["params"]}
        rows = self._link.rows
        outside = tuple(i for i, p in enumerate(rows.params) if p.grad is not None and id(p) not in held)
        # Stored in the layout (``outside_optimizer``) so the findings can say it too.
        self._link.outside = outside
        unheld = [rows.names[i] for i in outside]
        if unheld and not self._unheld_warned:
            self._unheld_warned = True
            shown = ", ".join(unheld[:5]) + (f" and {len(unheld) - 5} more" if len(unheld) > 5 else "")
            one = len(unheld) == 1
            verb, them = ("gets", "it") if one else ("get", "them")
            warnings.warn(
                f"tb_gradcheck: {shown} {verb} a gradient but no parameter group of the optimizer holds {them}, so "
                f"it never moves {them}. Pass {them} to the optimizer (or add_param_group), or set "
                f"requires_grad=False to freeze {them}; if another optimizer steps {them} (a GAN's other network), "
                "give that model a GradientWriter of its own: a writer follows one optimizer.",
                stacklevel=5,  # the user's optimizer.step(): past this, _before, the compiler wrapper, the step hook
            )

    def _copy(self, weights):
        """A copy of ``weights``: one fused copy on a GPU; on a CPU into buffers kept between written steps.

        A CPU pays page faults for every fresh copy of the weights (more
        than the copy itself), a GPU's caching allocator does not, and
        there the copy should not hold memory between written steps.
        float16 and bfloat16 weights are copied to float32: the difference
        of two bfloat16 numbers rounded back to bfloat16 would be off by up
        to 1e-2 of the update; in float32 it is exact.
        """
        dtypes = [_WIDE.get(w.dtype, w.dtype) for w in weights]
        if weights[0].device.type != "cpu":
            if all(d == w.dtype for d, w in zip(dtypes, weights)):
                return torch._foreach_mul(weights, 1.0)
            return [w.to(d, copy=True) for w, d in zip(weights, dtypes)]
        if self._buffers is None or [(b.shape, b.dtype) for b in self._buffers] != [
            (w.shape, d) for w, d in zip(weights, dtypes)
        ]:
            self._buffers = [torch.empty(w.shape, dtype=d) for w, d in zip(weights, dtypes)]
        torch._foreach_copy_(self._buffers, weights)
        return self._buffers

    def _after(self, optimizer, args, kwargs):
        link = self._link
        if link.rows is not None and not link.closed:
            # A parameter this optimizer holds: the gradient it has just applied.
            self._cleared.stepped(p for group in optimizer.param_groups for p in group["params"])
        if self._snapshot is None or link.pending is None:
            self._snapshot = None
            return
        local = link.group.local
        after = [local(p) for p in link.rows.params]
        with torch.no_grad():
            torch._foreach_sub_(self._snapshot, after)  # in place: the update, negated, with no new memory
            update = reductions.norms(self._snapshot)
        self._snapshot = None
        link.pending.pack.add("update", update * update)
        link.emit()


class _Scale:
    def __init__(self, value, inverse):
        self.value, self.inverse = value, inverse


class ScaleReader:
    """A ``GradScaler``'s scale at each step and the steps it refused, on the device.

    Args:
      scaler: The ``torch.amp.GradScaler``.
      optimizer: The optimizer it steps, or None: whether the gradients are
        already unscaled (``scaler.unscale_(optimizer)``) is read from the
        scaler's state for it (for any optimizer, when None).
    """

    def __init__(self, scaler, optimizer=None):
        self._scaler = scaler
        self._optimizer = optimizer
        self.enabled = bool(scaler.is_enabled())
        self._refused = None  # device float64: steps with a non-finite gradient so far
        self._at_write = None

    def read(self, device):
        """This step's scale (``value``) and the factor that unscales the gradients (``inverse``), or None."""
        if not self.enabled:
            return None
        scale = getattr(self._scaler, "_scale", None)
        if not isinstance(scale, torch.Tensor):  # nothing scaled yet
            return None
        value = scale.detach().to(device=device, dtype=F64).reshape(())
        inverse = torch.ones((), dtype=F64, device=device) if self._unscaled() else 1.0 / value
        return _Scale(value, inverse)

    def _unscaled(self):
        states = getattr(self._scaler, "_per_optimizer_states", {})
        from torch.amp.grad_scaler import OptState

        if self._optimizer is not None:
            state = states.get(id(self._optimizer)) if id(self._optimizer) in states else None
            return state is not None and state.get("stage") is OptState.UNSCALED
        return any(s.get("stage") is OptState.UNSCALED for s in states.values())

    def count(self, nonfinite):
        """Adds this step to the refused steps if ``nonfinite`` (per-parameter counts, device) has any."""
        bad = (nonfinite.sum() > 0).to(F64)
        self._refused = bad if self._refused is None else self._refused + bad
        if self._at_write is None:
            self._at_write = torch.zeros_like(bad)

    def since_last_write(self):
        """Device scalar: steps refused since the previous call."""
        if self._refused is None:
            return torch.zeros((), dtype=F64)
        out = self._refused - self._at_write
        self._at_write = self._refused
        return out


def columns(clipped, follows, scale):
    """The optimizer columns a writer's step has, in ``metadata.OPTIMIZER_STAT_COLUMNS`` order.

    Args:
      clipped: Whether ``clip_grad_norm_`` recorded the norms before clipping.
      follows: Whether a ``Follower`` records the update.
      scale: The writer's ``ScaleReader``, or None.
    """
    names = {"grad_norm_before_clip"} if clipped else set()
    if follows:
        names.update(("update_norm", "update_to_weight"))
    if scale is not None and scale.enabled:
        names.update(("loss_scale", "refused_steps"))
    return tuple(c for c in metadata.OPTIMIZER_STAT_COLUMNS if c in names)


def keep_norms_before_clip(link):
    """Keeps each parameter's gradient norm for the next ``write`` as ``grad_norm_before_clip``; changes nothing.

    For clipping done by someone else (a trainer's): the per-parameter
    norms ``clip`` keeps, taken on the device with no host read, and the
    gradients left as they are.

    Args:
      link: The writer's ``Link``, its rows fixed.
    """
    _keep_norms(link)


def _keep_norms(link):
    """The present gradients and their squared norms, the norms kept for the next ``write``: ``(grads, dense, squares)``.

    ``grads`` is None when no parameter has a gradient. Every rank takes
    part (``sum_shards`` is a collective when sharded); the ranks that
    compute keep the norms.
    """
    group = link.group
    params = link.rows.params
    where = [i for i, p in enumerate(params) if p.grad is not None]
    if not where:
        return None, None, None
    grads = [group.local(params[i].grad) for i in where]
    dense = [reductions.values(g) for g in grads]
    device = dense[0].device
    squares = group.sum_shards(reductions.norms(dense) ** 2)  # whole-parameter squares when sharded (one all-reduce)
    if group.computes:
        spread = torch.full((len(params),), MISSING, dtype=F64, device=device)
        index = link.constants.get(("where", tuple(where)), device, lambda: torch.tensor(where))
        link.before_clip = spread.index_copy(0, index, torch.sqrt(squares))
    return grads, dense, squares


def clip(link, max_norm, norm_type, error_if_nonfinite, foreach):
    """``GradientWriter.clip_grad_norm_``: clips the model's gradients, keeping their norms before for ``write``.

    Args:
      link: The writer's ``Link``, its rows fixed.
      max_norm, norm_type, error_if_nonfinite, foreach: As ``torch.nn.utils.clip_grad_norm_``'s.
    """
    group = link.group
    grads, dense, squares = _keep_norms(link)
    if grads is None:
        return torch.zeros(())
    if norm_type == 2.0:
        total = torch.sqrt(squares.sum())
    else:
        total = group.total_norm(dense, norm_type)
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
            "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`"
        )
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    dtype = grads[0].dtype
    for g in grads:
        if g.is_sparse:
            g.mul_(coef.to(g.dtype))
    plain = [g for g in grads if not g.is_sparse]
    by_kind = {}
    for g in plain:
        by_kind.setdefault((g.device, g.dtype), []).append(g)
    for (dev, kind), group_grads in by_kind.items():
        factor = coef.to(device=dev, dtype=kind)
        if foreach is False:
            for g in group_grads:
                g.mul_(factor)
        else:
            torch._foreach_mul_(group_grads, factor)
    return total.to(dtype)
