"""Each layer row's forward output during one fit: Keras layers' ``call`` tapped, the outputs reduced to the core's sums.

What is recorded (``metadata.ACTIVATION_STAT_COLUMNS``, from the sums
``rowstats.ACTIVATION_SUMS``, which define them once). A layer row is the
Keras layer that owns the row's weights (a ``Dense``; in a
``MultiHeadAttention`` its ``query``, ``key``, ``value`` and
``attention_output`` projections; for a recurrent cell, the RNN layer that
runs it: an ``LSTM``'s row is its output, every timestep's with
``return_sequences=True``); its output is what its ``call`` returns
(a tuple's first tensor), with the layer's own ``activation`` applied:
``Dense(64, activation="relu")``'s output is post-ReLU. Every call of the
layer in training mode (``training=True``, given or inherited from the outer
call, as Keras resolves it) inside the fit's train function counts; a layer
called twice adds up. Validation, ``evaluate`` and ``predict`` run other
functions and call the layers with ``training=False``: not counted. The
values are those of the training forward: Dropout on, BatchNormalization on
the batch's statistics.

- Dead by output (``act_dead_fraction``), where the row's output goes
  through a ReLU: (a) the layer's own ``activation`` is ``relu`` or
  ``relu6`` (measured on its output), or (b) in a ``keras.Sequential`` the
  next layer is ``keras.layers.ReLU()`` (no ``negative_slope``, ``threshold``
  0) or ``keras.layers.Activation("relu" / "relu6")`` (measured on the row's
  own output, the ReLU's input). A unit (an output channel: the last axis;
  axis 1 for ``data_format="channels_first"``; a BatchNormalization's
  ``axis``) is dead when the ReLU's output is 0 for every element of the
  step's batch: no positive value anywhere, so its output and gradient are
  exactly 0 for that batch. The same meaning as PyTorch's
  (``tb_gradcheck.torch.activations``), NaN included: a channel with a NaN
  has a NaN maximum, which is not above 0.
- Saturation (``act_saturated_fraction``): the same two places with
  ``tanh`` or ``sigmoid``: the fraction of the activation's outputs within
  ``rowstats.SATURATION_BAND`` of its range from a bound (``|tanh| > 0.98``,
  ``sigmoid < 0.01`` or ``> 0.99``; on the input of a following layer, the
  same bound: ``|x| > atanh(0.98)``, ``|x| > log(99)``).
- Elsewhere (an activation in a Functional model's separate layer, a
  ``LeakyReLU``, a ``gelu``, a recurrent layer's own ``activation`` (``LSTM``, ``GRU``, ``ConvLSTM``; not ``SimpleRNN``'s),
  applied inside the cell): MISSING, as for a row no ReLU/Tanh/Sigmoid follows.
  A layer called inside a loop or branch body (``tf.while_loop``,
  ``tf.map_fn``) is not counted in a compiled step: the write cannot reach
  its output there. A ``StackedRNNCells``' cells but the last: MISSING.

Cost. ``call`` is replaced on the row layers' instances for the fit
(``hooks.Hooks``, put back however it ends). A replaced ``call`` runs when
the train step is traced, not at every step: it keeps the output tensor,
adding no operation. The reductions (``sums``, in ``keras.ops``) are built
where the backend's writer computes the written step's other statistics, so
they run at written steps only.

Imports Keras only (the reductions are ``keras.ops``, so the TensorFlow and
torch callbacks share them); each backend's writer turns the sums into its
columns with the core's definitions (TensorFlow: ``optimizer.Activations``,
``rowstats.activation_columns`` traced inside the write, XLA included;
torch: ``keras_rows``, ``rowstats.activation_values`` after the written
step's one transfer). The JAX callback refuses ``activations=True``.
"""

import contextlib
import functools

import keras
from keras import ops

from tb_gradcheck.core import rowstats

_RELUS = ("relu", "relu6")
_SQUASHES = ("tanh", "sigmoid")
# (kind, measured before the activation) of rows whose output is never below 0.
_NONNEGATIVE = (("relu", False), ("sigmoid", False))


def _kind(layer):
    """``"relu"``, ``"tanh"``, ``"sigmoid"`` for a layer whose output is that activation's, else None."""
    recurrent = isinstance(layer, keras.layers.RNN) or hasattr(layer, "state_size")  # an RNN layer or a cell
    if recurrent and not isinstance(layer, (keras.layers.SimpleRNN, keras.layers.SimpleRNNCell)):
        # Their `activation` is applied inside (LSTM, ConvLSTM: o * tanh(c); GRU: a gated mix with the previous
        # state): the output is not that activation's, so its saturation or dead units would not be measured.
        return None
    if isinstance(layer, keras.layers.ReLU):
        plain = not getattr(layer, "negative_slope", 0) and not getattr(layer, "threshold", 0)
        return "relu" if plain else None
    activation = getattr(layer, "activation", None)
    for name in _RELUS + _SQUASHES:
        if activation is getattr(keras.activations, name, None):
            return "relu" if name in _RELUS else name
    return None


def _unit_axis(layer):
    axis = getattr(layer, "axis", None)
    if isinstance(layer, keras.layers.BatchNormalization) and isinstance(axis, int):
        return axis
    return 1 if getattr(layer, "data_format", None) == "channels_first" else -1


def _first_tensor(output):
    for item in output if isinstance(output, (tuple, list)) else (output,):
        if ops.is_tensor(item) and "float" in str(item.dtype):
            return item
    return None


def _training(kwargs):
    training = kwargs.get("training")
    if training is None:
        # Inherited from the outer call (Layer.__call__'s call context), as Keras resolves it.
        from keras.src.backend.common import global_state

        context = global_state.get_global_attribute("current_call_ctx")
        training = None if context is None else context.get_value("training")
    return training is True


class Taps:
    """The row layers' ``call`` tapped for one fit; the outputs of the train step being traced.

    Args:
      model: The Keras model being fitted.
      variables: The recorded variables, in the writer's order.
      hooks: The fit's ``hooks.Hooks``: the replaced ``call`` methods are put back with the optimizer's.
    """

    def __init__(self, model, variables, hooks):
        owners = {}
        for layer in model._flatten_layers(include_self=True):
            for v in getattr(layer, "_trainable_variables", ()):
                owners[id(v)] = layer
        # A recurrent cell runs once per timestep inside its RNN layer's loop, where a compiled step's tensors
        # cannot be reached from the write (TensorFlow's backend also calls it once outside the loop, for the
        # output's shape: timestep 0 alone). Its row takes the RNN layer's output instead (the cell's output at
        # every timestep with return_sequences=True, the last one without), eager or compiled alike. Of a
        # StackedRNNCells only the last cell's output leaves the loop: the others' rows are not tapped (MISSING).
        for layer in model._flatten_layers(include_self=True):
            if isinstance(layer, keras.layers.RNN):
                cells = list(getattr(layer.cell, "cells", None) or [layer.cell])
                for cell in cells:
                    for v in getattr(cell, "_trainable_variables", ()):
                        if owners.get(id(v)) is cell:
                            owners[id(v)] = layer if cell is cells[-1] else None
        # Per variable, the layer that owns it (None: a variable no layer holds itself).
        self.owner_of = [owners.get(id(v)) for v in variables]
        followers = {}
        for seq in model._flatten_layers(include_self=True):
            if isinstance(seq, keras.Sequential):
                for layer, following in zip(seq.layers, seq.layers[1:]):
                    if _kind(following) is not None:
                        followers[id(layer)] = _kind(following)
        self._how = {}  # id(layer) -> (kind or None, before_activation, unit axis)
        for layer in {id(layer): layer for layer in self.owner_of if layer is not None}.values():
            own = _kind(layer)
            kind = own if own is not None else followers.get(id(layer))
            self._how[id(layer)] = (kind, own is None, _unit_axis(layer))
            hooks.replace(layer, "call", functools.partial(self._tap, layer))
        self.armed = False
        self.outputs = []  # (layer id, output) of the training calls since the last take

    def _tap(self, layer, original):
        @functools.wraps(original)  # Keras reads the signature (the `training` argument) through __wrapped__
        def call(*args, **kwargs):
            output = original(*args, **kwargs)
            if self.armed and _training(kwargs):
                first = _first_tensor(output)
                if first is not None:
                    self.outputs.append((id(layer), first))
            return output

        return call

    @contextlib.contextmanager
    def collecting(self):
        """Around one call of the fit's train function: the training calls traced (or run eagerly) inside are kept."""
        self.armed, self.outputs = True, []
        try:
            yield
        finally:
            self.armed, self.outputs = False, []

    def take(self):
        """The outputs kept since the last ``take`` (one step's forward, traced or eager), and forgets them."""
        taken, self.outputs = self.outputs, []
        return taken

    def sums(self, outputs, layer_of, n_layers):
        """float64 ``[n_layers, len(rowstats.ACTIVATION_SUMS)]``: ``outputs`` reduced to each layer row's sums.

        Args:
          outputs: What ``take`` returned.
          layer_of: Per variable, its layer row (``structure.Structure.layer_of``).
          n_layers: The layer rows.

        Per output, the passes over it that must run: its sum of squares, max
        and min (a ReLU's channel maximum, a tanh/sigmoid's count near a
        bound, where those apply); then every output's numbers stacked and
        combined per layer row at once. The non-finite count takes three more
        passes, so it is counted only when some sum of squares is not finite
        (one cond for all layers; each sum is finite when its elements are).
        A row whose layer did not run has elements 0, which
        ``rowstats.activation_values`` reads as MISSING.
        """
        row_of = {}
        for layer, row in zip(self.owner_of, layer_of):
            if layer is not None:
                row_of.setdefault(id(layer), row)
        calls = [(key, _wide(out)) for key, out in outputs if key in row_of and _reachable(out)]
        zeros = ops.zeros((n_layers,), "float64")
        sums = dict.fromkeys(rowstats.ACTIVATION_SUMS, zeros)
        if not calls:
            return ops.stack([sums[name] for name in rowstats.ACTIVATION_SUMS], axis=1)
        rows = ops.convert_to_tensor([row_of[key] for key, _ in calls], "int32")

        def per_row(values, reduce=ops.segment_sum):
            return reduce(ops.cast(ops.stack(values), "float64"), rows, num_segments=n_layers)

        squares = per_row([ops.sum(ops.square(x)) for _, x in calls])
        sums["squares"] = squares
        sums["elements"] = per_row([ops.size(x) for _, x in calls])
        # Each ReLU row's channel maxima first: its largest value is theirs, one pass less.
        channel = [self._channel_max(key, x) for key, x in calls]
        top = per_row([ops.max(x if c is None else c) for (_, x), c in zip(calls, channel)], ops.segment_max)
        # A ReLU's or a sigmoid's own output is never below 0: its max |a| is its max, another pass less.
        low = [ops.min(x) for key, x in calls if self._how[key][:2] not in _NONNEGATIVE]
        at = [row_of[key] for key, _ in calls if self._how[key][:2] not in _NONNEGATIVE]
        if low:
            low = ops.cast(ops.stack(low), "float64")
            top = ops.maximum(top, -ops.segment_min(low, ops.convert_to_tensor(at, "int32"), num_segments=n_layers))
        # A sum of squares is NaN exactly where an element is: then max |a| is NaN too, whatever max did with it.
        sums["max_abs"] = ops.where(ops.isnan(squares), float("nan"), top)
        sums["nonfinite"] = ops.cond(
            ops.all(ops.isfinite(squares)),
            lambda: zeros,
            # Not a - a (NaN exactly where a is not finite): Grappler's arithmetic optimizer makes that 0.
            lambda: per_row([_count(ops.logical_not(ops.isfinite(x))) for _, x in calls]),
        )
        squash = [(k, self._how[key], x) for k, (key, x) in enumerate(calls) if self._how[key][0] in _SQUASHES]
        if squash:
            near = []
            for _, (kind, before, _), x in squash:
                if kind == "tanh":
                    near.append(_count(ops.abs(x) > (rowstats.TANH_INPUT if before else rowstats.TANH_OUTPUT)))
                else:  # sigmoid's range [0, 1]: near a bound is |a - 0.5| > 0.5 - band, |x| > log(99) on its input
                    reach = rowstats.SIGMOID_INPUT if before else rowstats.SIGMOID_OUTPUT
                    near.append(_count(ops.abs(x - (0.0 if before else 0.5)) > reach))
            at = ops.convert_to_tensor([row_of[calls[k][0]] for k, _, _ in squash], "int32")
            sums["saturated"] = ops.segment_sum(ops.cast(ops.stack(near), "float64"), at, num_segments=n_layers)
            elements = ops.cast(ops.stack([ops.size(x) for _, _, x in squash]), "float64")
            sums["squashed"] = ops.segment_sum(elements, at, num_segments=n_layers)
        peaks = {}
        for (key, _), peak in zip(calls, channel):
            if peak is not None:
                peaks[key] = peak if key not in peaks else ops.maximum(peaks[key], peak)  # a layer called twice
        if peaks:
            # Every unit's peak in one vector, its row's alive count by one segment sum.
            flat = [ops.reshape(p, (-1,)) for p in peaks.values()]
            sizes = [p.shape[0] for p in flat]
            at = [row_of[key] for key in peaks]
            if None in sizes:  # a unit count known only when the step runs
                owner = ops.repeat(ops.convert_to_tensor(at, "int32"), ops.stack([ops.size(p) for p in flat]))
            else:
                owner = ops.convert_to_tensor([row for row, size in zip(at, sizes) for _ in range(size)], "int32")
            peak = ops.concatenate(flat)
            # A unit whose output holds a NaN is not dead (its output is not 0): it shows in the non-finite count.
            alive = ops.cast(ops.logical_or(peak > 0, ops.isnan(peak)), "float64")
            sums["units"] = ops.segment_sum(ops.ones_like(alive), owner, num_segments=n_layers)
            sums["dead_units"] = sums["units"] - ops.segment_sum(alive, owner, num_segments=n_layers)
        return ops.stack([sums[name] for name in rowstats.ACTIVATION_SUMS], axis=1)

    def _channel_max(self, key, x):
        """A ReLU row's largest value per unit (before the ReLU or after), or None for other rows."""
        kind, _, axis = self._how[key]
        if kind != "relu" or len(x.shape) == 0:
            return None
        unit = axis % len(x.shape)
        other = [d for d in range(len(x.shape)) if d != unit]
        return ops.max(x, axis=other) if other else x


def _reachable(tensor):
    """Whether the write, traced where this is called, can use ``tensor``: not made inside a loop or branch body.

    A layer a user calls inside ``tf.while_loop`` or ``tf.map_fn`` (a cell the user loops over) traces its
    output in the body's graph, which a later op cannot capture; such a call is not counted. Eager and
    torch tensors have no graph.
    """
    graph = getattr(tensor, "graph", None)
    if graph is None:
        return True
    import tensorflow as tf  # a graph tensor: TensorFlow is the backend

    current = tf.compat.v1.get_default_graph()
    while current is not None:
        if current is graph:
            return True
        current = getattr(current, "outer_graph", None)
    return False


def _count(true):
    """How many elements of a boolean tensor are true (keras.ops.count_nonzero warns on torch for a full count)."""
    return ops.sum(ops.cast(true, "int32"))


def _wide(x):
    """float16 / bfloat16 outputs in float32: their squares would overflow in their own dtype."""
    return x if str(x.dtype) in ("float32", "float64") else ops.cast(x, "float32")
