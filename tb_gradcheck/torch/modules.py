"""A PyTorch model's parameters as rows: modules by path in the order they run forward, and what a unit is.

Rows. Every parameter that requires a gradient is a variable row, named by
its path (``encoder.layers.0.linear1.weight``, the ``state_dict`` key);
its layer row is the module that owns it (``encoder.layers.0.linear1``).
A parameter of the model itself is a layer of its own, as TensorFlow's
plain variables are. A parametrized weight
(``torch.nn.utils.parametrizations.weight_norm``) belongs to the module it
parametrizes, not to the ``ParametrizationList`` that holds it. Wrappers
are looked through: ``DistributedDataParallel`` and FSDP1's ``.module``,
``torch.compile``'s ``_orig_mod``, so names carry no ``module.`` prefix.

Depth order. Layers are ordered by the first call of their module's
``forward`` (``Order``: forward pre-hooks, removed at the first write). A
module that never runs its own ``forward`` (``MultiheadAttention``'s
``out_proj``, whose weight the attention uses directly) comes right after
everything its nearest called ancestor ran. Under ``torch.compile`` the hooks
do nothing (removing them would make dynamo recompile the model, and
recording inside a traced graph makes it recompile too); a compiled model's
layers are then in the order the modules are registered
(``named_parameters``), which is the forward order of most models.

Tied parameters. A parameter that several modules hold (an LM head tied to
its embedding; T5's ``shared`` table, which its encoder and decoder call as
``embed_tokens``) is one row, under the holder that runs first: the layer
its gradient's first use belongs to, and the module whose output is that
row's activation. PyTorch's own name (``named_parameters``, the first holder
registered) may be a module that never runs (``shared``), which would put
the row last and leave its activation MISSING. Compiled, where no order is
recorded, the row is the first holder registered.

Units (``dead_unit_fraction``). A unit is one output of a layer: the
parameters that only it uses. PyTorch stores outputs first, so:

- a ``Linear``, ``ConvNd``, ``Bilinear`` or recurrent weight
  ``[out, ...]``, ``MultiheadAttention``'s packed ``in_proj_weight``
  ``[3 * embed, embed]`` (one unit per query, key and value channel), a
  weight norm's ``g`` ``[out, 1, ...]`` and ``v``, any other parameter of
  rank 2 or more: the first axis;
- a vector (a bias, the affine weight and bias of ``LayerNorm``,
  ``BatchNorm``, ``GroupNorm``): each element; a scalar: one unit;
- an ``Embedding`` or ``EmbeddingBag`` table ``[num, dim]``: the last axis,
  as in TensorFlow (a table row is one input, not one output);
  ``MultiheadAttention``'s ``bias_k`` and ``bias_v`` ``[1, 1, embed]``: the
  last axis too;
- a ``ConvTransposeNd`` weight ``[in, out / groups, ...]``: its output
  channels, axis 1 within each group;
- Hugging Face ``transformers``' stacked experts (a MoE layer's
  ``experts``: Mixtral, Qwen-MoE, DeepSeek) ``[experts, out, in]``: one
  unit per expert and output, as a ``Linear`` per expert would have.
  Counted by expert, a dead output of a routed expert would be missed; an
  expert no token was routed to has all its units without gradient. A
  transposed layout (``is_transposed``: gpt-oss) keeps the first axis;
- Hugging Face ``transformers``' ``Conv1D`` (GPT-2's attention and MLP
  projections), a transposed ``Linear`` whose weight is ``[in, out]`` and
  which says so with its ``nf`` (number of outputs): the last axis. Counted
  on the first axis, a dead output would be missed and the dead units of
  the layer before (zero inputs) would be blamed on this one.

A layer's units are those of its last parameter (``structure.Structure``):
a ``Linear``'s bias, or its weight without one.
"""

import dataclasses
import sys
import warnings

import torch

from tb_gradcheck.core import structure

_PARAMETRIZATIONS = ".parametrizations."


@dataclasses.dataclass(frozen=True)
class UnitSpec:
    """How a parameter's gradient splits into units: reshape to ``view``, reduce over ``dims``.

    The axes that are not reduced index the units, in the order the
    module's outputs have them. ``units`` is their count.
    """

    view: tuple
    dims: tuple
    units: int


def unwrap(model):
    """The module whose parameters are the model's: through DDP, FSDP1 and ``torch.compile`` wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(inner, torch.nn.Module):
            model = inner
            continue
        inner = getattr(model, "module", None)  # DistributedDataParallel, FSDP1, DataParallel
        if isinstance(inner, torch.nn.Module) and type(model).__name__ in _WRAPPERS:
            model = inner
            continue
        return model


_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def owner_path(name):
    """The path of the module that owns parameter ``name`` (the parameter's own name if the model owns it)."""
    if _PARAMETRIZATIONS in "." + name:
        head = ("." + name).split(_PARAMETRIZATIONS, 1)[0][1:]
        return head or name
    return name.rsplit(".", 1)[0] if "." in name else name


def unit_spec(module, short_name, shape):
    """The ``UnitSpec`` of parameter ``short_name`` (its name in ``module``) of ``shape`` (the module docstring)."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return UnitSpec((1, 1), (1,), 1)
    numel = 1
    for d in shape:
        numel *= d
    trailing = (
        (isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and short_name == "weight")
        or (isinstance(module, torch.nn.MultiheadAttention) and short_name in ("bias_k", "bias_v"))
        or (short_name == "weight" and len(shape) == 2 and _outputs_last(module, shape))
    )
    if trailing:
        units = shape[-1]
        return UnitSpec((numel // max(units, 1), units), (0,), units)
    if isinstance(module, torch.nn.modules.conv._ConvTransposeNd) and short_name == "weight" and len(shape) >= 2:
        groups = int(module.groups)
        per_group = shape[0] // groups
        rest = numel // max(shape[0] * shape[1], 1)
        return UnitSpec((groups, per_group, shape[1], rest), (1, 3), groups * shape[1])
    if len(shape) == 3 and _stacked_experts(module, shape):
        units = shape[0] * shape[1]
        return UnitSpec((units, shape[2]), (1,), units)
    units = shape[0]
    return UnitSpec((units, numel // max(units, 1)), (1,), units)


def _stacked_experts(module, shape):
    """Whether a 3-D weight is Hugging Face's stacked experts ``[experts, out, in]`` (its MoE ``*Experts`` modules).

    They say so: ``num_experts`` and ``is_transposed`` (False: outputs before
    inputs), set by ``transformers``' ``use_experts_implementation``.
    """
    experts = getattr(module, "num_experts", None)
    layout = getattr(module, "is_transposed", None)
    return layout is False and isinstance(experts, int) and not isinstance(experts, bool) and shape[0] == experts


def _outputs_last(module, shape):
    """Whether a 2-D weight is ``[in, out]``: a module that names its outputs ``nf`` (``transformers``' ``Conv1D``)."""
    outputs = getattr(module, "nf", None)
    if isinstance(outputs, bool) or not isinstance(outputs, int) or isinstance(module, torch.nn.Linear):
        return False
    return shape[-1] == outputs


class Order:
    """Records the order in which a model's modules first run ``forward``, until ``freeze``.

    Forward pre-hooks on every module; each records its module once. Under
    ``torch.compile`` they return at once (see the module docstring), and
    ``freeze`` then leaves them in place: a compiled graph guards on the
    hooks a module has, and removing one would recompile it.
    """

    def __init__(self, model):
        self.paths = {}  # module path -> index of its first forward call
        self._handles = []
        self._frozen = False
        for path, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._hook(path)))

    def _hook(self, path):
        def record(module, args):
            if torch.compiler.is_compiling() or self._frozen:
                return
            if path not in self.paths:
                self.paths[path] = len(self.paths)

        return record

    def freeze(self):
        """Stops recording; removes the hooks unless the model ran compiled (nothing was recorded)."""
        self._frozen = True
        if self.paths:
            for handle in self._handles:
                handle.remove()
            self._handles = []
        return dict(self.paths)


def sort_key(order, path, registered):
    """Where a layer at module ``path`` goes in depth order, given the first-call ``order`` ``{path: index}``.

    Called modules by their first call; one that never ran, right after
    what its nearest called ancestor ran; ties in registration order
    (``registered``, the position of the layer's first parameter).
    """
    if path in order:
        return (order[path], 0, registered)
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        ancestor = ".".join(parts[:cut])
        if ancestor in order:
            prefix = ancestor + "." if ancestor else ""
            last = max(i for p, i in order.items() if p == ancestor or p.startswith(prefix))
            return (last, 1, registered)
    return (-1, 1, registered)


@dataclasses.dataclass
class Parameters:
    """A model's rows: the parameters in depth order, their ``Structure`` and unit specs.

    Attributes:
      names: Variable row names (parameter paths), depth order.
      params: The parameters, in the same order.
      specs: Their ``UnitSpec``s.
      structure: The ``structure.Structure`` of the rows.
      masks: ``[(row index, module, mask buffer name)]``: the rows ``torch.nn.utils.prune`` masks (``pruned``).
    """

    names: list
    params: list
    specs: list
    structure: structure.Structure
    masks: list = dataclasses.field(default_factory=list)


def parameters(model, order=None):
    """The rows of ``model``'s parameters that require a gradient, in depth order.

    Args:
      model: A ``torch.nn.Module`` (or a wrapper ``unwrap`` looks through).
      order: ``{module path: first call index}`` from ``Order.freeze``, or
        None (or empty) for registration order.

    Returns:
      A ``Parameters``.
    """
    model = unwrap(model)
    order = order or {}
    found = [(n, p) for n, p in _first_run_names(model, order) if p.requires_grad]
    owners = [owner_path(n) for n, _ in found]
    first = {}
    for i, owner in enumerate(owners):
        first.setdefault(owner, i)
    # Stable: a layer's parameters keep their registration order.
    ranked = sorted(range(len(found)), key=lambda i: (sort_key(order, owners[i], first[owners[i]]), i))
    names = [found[i][0] for i in ranked]
    params = [found[i][1] for i in ranked]
    specs, masks = [], []
    for i in ranked:
        name, p = found[i]
        owner = owners[i]
        module = model.get_submodule(owner) if owner != name else model
        specs.append(unit_spec(module, name.rsplit(".", 1)[-1], global_shape(p)))
        mask = _prune_mask(module, name.rsplit(".", 1)[-1], p)
        if mask is not None:
            masks.append((len(specs) - 1, module, mask))
    # A module named by its index in a container (nn.Sequential's 0, 2, 4) says nothing by its name: its
    # class goes into the layout, so the tab and the report can say "2 (Linear)".
    classes = {}
    for owner in set(owners):
        if owner.rsplit(".", 1)[-1].isdigit():
            try:
                classes[owner] = type(model.get_submodule(owner)).__name__
            except AttributeError:  # not a module (a ParameterList's own parameter): no class to show
                pass
    return Parameters(
        names,
        params,
        specs,
        structure.Structure(
            names,
            [owners[i] for i in ranked],
            [global_shape(p) for p in params],
            [s.units for s in specs],
            module_classes=classes,
        ),
        masks,
    )


def _prune_mask(module, short_name, param):
    """The name of the buffer that masks ``param`` (``torch.nn.utils.prune``: ``weight_orig`` and ``weight_mask``), or None.

    Pruning keeps the parameter as ``<name>_orig`` and the mask as the
    buffer ``<name>_mask``, and a forward pre-hook (a ``BasePruningMethod``)
    sets ``<name> = <name>_orig * <name>_mask``: a masked element's gradient
    is 0 by construction. Pruning again (iteratively) replaces the buffer:
    it is read by name at each written step.
    """
    if not short_name.endswith("_orig"):
        return None
    prune = sys.modules.get("torch.nn.utils.prune")  # not imported: nothing is pruned
    mask = short_name[: -len("_orig")] + "_mask"
    held = module._buffers.get(mask) if prune is not None else None
    if held is None or tuple(held.shape) != tuple(param.shape):
        return None
    return mask if any(isinstance(h, prune.BasePruningMethod) for h in module._forward_pre_hooks.values()) else None


def holders(model):
    """``{id(parameter): [its names]}``: every module path that holds it, in registration order."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _first_run_names(model, order):
    """``named_parameters``, each tied parameter named by its holder that ran first (``order``), if any ran."""
    tied = holders(model)
    out = []
    for name, p in model.named_parameters():
        ran = [n for n in tied[id(p)] if owner_path(n) in order]
        out.append((min(ran, key=lambda n: order[owner_path(n)]) if ran else name, p))
    return out


def global_shape(param):
    """The parameter's whole shape (a DTensor's, not its local shard's)."""
    return tuple(int(d) for d in param.shape)


def warn_unrecorded(model, params, stacklevel):
    """Warns of parameters of ``model`` that need a gradient but are not among the rows' ``params``.

    The rows are fixed at the first write: a layer unfrozen later (gradual
    unfreezing) or a parameter added after it would be left out without a
    word. Returns whether it warned.
    """
    rows = {id(p) for p in params}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in rows]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        warnings.warn(
            f"tb_gradcheck: {shown} need a gradient but are not recorded: the rows are the parameters that "
            "required one at the first write. Create a new GradientWriter after unfreezing or adding parameters.",
            stacklevel=stacklevel,
        )
    return bool(missing)
