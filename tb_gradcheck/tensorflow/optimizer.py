"""What the optimizer did with the gradient: the update it applied, and the gradient before clipping.

Three optional columns of a stats tensor (``metadata.OPTIMIZER_STAT_COLUMNS``),
all taken at the write step only (the ``last`` slab; MISSING in the others):

- ``update_norm``: ||w_after - w_before||, the change the step actually made
  to the weights, whatever made it (optimizer rule, learning-rate schedule,
  weight decay, constraints). A step the loss-scale optimizer refused
  changed nothing, so its update is 0.
- ``update_to_weight``: update_norm / ||w_before||; MISSING where the weights
  were all zero (a fresh bias: the ratio is undefined, not Inf).
- ``grad_norm_before_clip``: the norm of the gradient the optimizer was
  given, beside ``grad_norm`` (the gradient it applied), when it clips.

A layout stores only the columns it has: a writer that is never given
gradients before clipping has no ``grad_norm_before_clip`` column at all,
rather than a copy of ``grad_norm``.

Cost. Nothing at a step that is not written: the snapshot of the weights is
taken inside a ``tf.cond`` on the write step, whose other branch is empty,
and outside XLA the weights after the update are read and measured inside
the writer's own write branch (``columns``), so that a step that is not
written runs one cond of the bracket's, not two: a second cond after the
update, however empty its branch, put itself between the last update and
the writer's cond, at the end of every step (``model.fit`` with the
callback between writes: 1.09x the bare step with it, 1.06x without).
At a write step: reading the weights before the update (the optimizer's
in-place update then copies each buffer it writes, since the snapshot still
holds it: one pass), their norm (which replaces the writer's own weight
pass: ``weight_norm`` then comes from the snapshot, so it is the weights the
gradient was taken at) and the norm of the difference (one pass over both).

The bracket is plain Python around the update, so it works eagerly and
inside ``tf.function`` alike; under ``tf.distribute`` each replica reads its
own copy of the (mirrored) weights, which the update leaves equal.
"""

import sys

import tensorflow as tf

from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.tensorflow import branches
from tb_gradcheck.tensorflow import full_sums
from tb_gradcheck.tensorflow import statistics

UPDATE_COLUMNS = ("update_norm", "update_to_weight")
BEFORE_CLIP_COLUMN = "grad_norm_before_clip"
LOSS_SCALE_COLUMNS = ("loss_scale", "refused_steps")


class UpdateBracket:
    """Measures the update one optimizer step applies to ``variables``; use as a context manager.

    Made by ``GradientWriter.applying``; the result goes to
    ``GradientWriter.write(..., update=...)``.

    Args:
      variables: The variables the step updates (checked by the caller).
      due: Python bool or bool tensor: whether this step is written. The
        weights are read only when it is true.
      compiled: Whether the step is XLA-compiled, where both branches of a
        cond must have the same shapes: a step that is not written then
        fills zeros of the weights' shapes instead of reading them.
    """

    def __init__(self, variables, due, compiled=False):
        self.variables = list(variables)
        self.due = due
        self.compiled = compiled
        self._before = None
        self._update = None  # per-variable squared norm of the update, float64
        self._weight = None  # per-variable squared norm of the weights before it
        self._applied = False  # the update ran inside the bracket
        self.refused = None  # see refused_step

    def __enter__(self):
        def read():
            # tf.identity of the read value: the optimizer's in-place update
            # then copies the buffer instead of writing into this snapshot.
            return [tf.identity(_value(v)) for v in self.variables]

        def skip():
            if self.compiled:
                return [tf.zeros_like(_value(v)) for v in self.variables]
            return [tf.zeros([0], _value(v).dtype) for v in self.variables]

        self._before = branches.cond(self.due, read, skip)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            return False
        self._applied = True
        known = branches.static(self.due)
        if self.compiled or (known is not None and bool(known)):
            # Measured here, beside the rest of the step: under XLA in a cond of its own on the write step (the
            # write's statistics are stashed with no cond on the gradients, Recording.stash); where the step is
            # known to be written (every step is), with no cond at all, where it overlaps the writer's passes
            # (inside the write branch it would run after them: 1.38x -> 1.42x the bare MLP step written every step).
            def skip():
                n = len(self.variables)
                return tf.fill([n], tf.constant(-1.0, tf.float64)), tf.fill([n], tf.constant(-1.0, tf.float64))

            self._update, self._weight = branches.cond(self.due, self._measure, skip)
        return False

    def _measure(self):
        """float64 squared norms of each variable's update and of its weights before it (reads the weights now)."""
        after = [_value(v) for v in self.variables]
        update = [
            _sumsq(tf.cast(a, tf.float32) - tf.cast(b, tf.float32), self.compiled) for a, b in zip(after, self._before)
        ]
        weight = [_sumsq(tf.cast(b, tf.float32), self.compiled) for b in self._before]
        return tf.stack(update), tf.stack(weight)

    def columns(self, rows):
        """``{column: (layer [L], variable [V])}`` float32: update_norm, update_to_weight, weight_norm.

        Call at the write step (inside the writer's write branch), after the
        update: outside XLA the weights after it are read here. A bracket
        that was never entered raises ValueError; one that was given another
        step than the write, and so did not measure this one, gives MISSING
        update columns and the writer's own weight norms.
        """
        if not self._applied:
            raise ValueError(
                "Expected the update bracket to have been used around the optimizer step "
                "(`with writer.applying(variables, step) as update: optimizer.apply_gradients(...)`). "
                "Received: a bracket that was never entered"
            )
        names = ("update_norm", "update_to_weight", "weight_norm")
        if self._update is not None:
            # Measured by __exit__: under XLA (the callback's bracket and write share one step), or at a step known
            # to be written.
            return dict(zip(names, self._measured(rows, self._update, self._weight)))

        def unmeasured():
            # The write's step is due and the bracket's was not: they were
            # given different steps (a variable read before and after the
            # update it counts). Say so, and store no update rather than 0.
            tf.print(
                "WARNING: tb_gradcheck: GradientWriter.write(update=...) at a write step whose update bracket "
                "was not: pass applying() and write() the same step value (read optimizer.iterations once, "
                "before the update). update_norm is not recorded at this step.",
                output_stream=sys.stderr,
            )
            layer_w, variable_w = statistics.weight_norms(rows)
            missing = (
                tf.fill(tf.shape(layer_w), statistics.MISSING),
                tf.fill(tf.shape(variable_w), statistics.MISSING),
            )
            return missing, missing, (layer_w, variable_w)

        # The snapshot was taken where the bracket's step was due.
        return dict(zip(names, branches.cond(self.due, lambda: self._measured(rows, *self._measure()), unmeasured)))

    def _measured(self, rows, update, weight):
        """``(update_norm, update_to_weight, weight_norm)``, each ``(layer [L], variable [V])`` float32.

        From the float64 squared norms ``update`` and ``weight`` (``_measure``).
        """
        seg = tf.constant(rows.layer_of, tf.int32)
        n = len(rows.layer_names)
        update_v = tf.sqrt(update)
        weight_v = tf.sqrt(weight)
        # A layer's norms from its variables' squared norms (no square root
        # then square again: these sums are exact enough in float64).
        update_l = tf.sqrt(tf.math.unsorted_segment_sum(update, seg, n))
        weight_l = tf.sqrt(tf.math.unsorted_segment_sum(weight, seg, n))
        out = []
        for lv, vv in (
            (update_l, update_v),
            (_ratio(update_l, weight_l), _ratio(update_v, weight_v)),
            (weight_l, weight_v),
        ):
            out.append((tf.cast(lv, tf.float32), tf.cast(vv, tf.float32)))
        return tuple(out)


class RefusedUpdate:
    """The update of a step the loss-scale optimizer refused: 0 (the weights did not move).

    Like a bracket it gives weight_norm too (the writer leaves that to the
    bracket): the weights as they stay, read at this rare step only.
    """

    def columns(self, rows):
        zeros_l = tf.zeros([len(rows.layer_names)], tf.float32)
        zeros_v = tf.zeros([len(rows.variable_names)], tf.float32)
        return {
            "update_norm": (zeros_l, zeros_v),
            "update_to_weight": (zeros_l, zeros_v),
            "weight_norm": statistics.weight_norms(rows),
        }


def before_clip_columns(gradients, rows, compiled=False):
    """``{grad_norm_before_clip: (layer [L], variable [V])}``: the norms of the gradients before clipping.

    Args:
      gradients: One per variable of ``rows`` (None where missing), already
        summed over replicas.
      rows: The ``variables.Rows`` of the write.
      compiled: Whether the step is XLA-compiled (``statistics.norms``).
    """
    return {BEFORE_CLIP_COLUMN: statistics.norms(gradients, rows, compiled)}


def _ratio(num, den):
    ok = (num >= 0) & (den > 0)
    return tf.where(ok, num / tf.where(ok, den, 1.0), statistics.MISSING)


def _sumsq(x, compiled=False):
    if x.shape.num_elements() == 0:
        return tf.constant(0.0, tf.float64)
    if compiled:  # as stats' compiled norms: no cond, and no underflow of a tiny update
        return full_sums.sumsq64(x, compiled=True)
    return tf.cast(tf.nn.l2_loss(x), tf.float64) * 2.0


def _value(variable):
    """The current value of a Keras or TF variable (a tensor), read as the writer reads weights."""
    return tf.convert_to_tensor(variable)


class LossScale:
    """The loss-scale columns of a write: the scale of this step, and the steps refused since the last write.

    Args:
      scale: Scalar tensor, the dynamic loss scale this step's gradients were
        made with (read before the optimizer adjusts it).
      skipped: Host int64 variable, the steps refused so far.
      written: Host int64 variable, ``skipped`` at the previous write; moved
        up to ``skipped`` by each write (so refused steps of a window are
        counted once, including those between writes).
    """

    def __init__(self, scale, skipped, written):
        self.scale, self.skipped, self.written = scale, skipped, written

    def columns(self, rows):
        skipped = self.skipped.read_value()
        refused = tf.cast(skipped - self.written.read_value(), tf.float32)
        with tf.control_dependencies([refused]):
            self.written.assign(skipped)
        out = {}
        for name, value in (("loss_scale", tf.cast(self.scale, tf.float32)), ("refused_steps", refused)):
            out[name] = (tf.fill([len(rows.layer_names)], value), tf.fill([len(rows.variable_names)], value))
        return out


class Activations:
    """The activation columns of a write (``metadata.ACTIVATION_STAT_COLUMNS``): one step's layer outputs.

    Args:
      taps: The fit's ``tb_gradcheck.keras.activations.Taps``.
      outputs: What its ``take`` gave: the outputs of this step's forward pass.
    """

    def __init__(self, taps, outputs):
        self.taps, self.outputs = taps, outputs

    def columns(self, rows):
        """Inside the write's branch: the sums reduced on the device, made columns by the core's definitions.

        ``rowstats.activation_columns`` in ``tf.experimental.numpy``: traced with the step,
        so they run on the device, under XLA too, with no call to the host.
        """
        n_l, n_v = len(rows.layer_names), len(rows.variable_names)
        sums = tf.cast(self.taps.sums(self.outputs, rows.layer_of, n_l), tf.float64)
        layer = rowstats.activation_columns(sums, tf.experimental.numpy)
        missing = tf.fill([n_v], tf.constant(statistics.MISSING, tf.float32))
        return {c: (tf.cast(layer[c], tf.float32), missing) for c in metadata.ACTIVATION_STAT_COLUMNS}


class Extra:
    """The optional columns of one write: an update bracket, gradients before clipping, the layers' outputs.

    Args:
      update: An ``UpdateBracket`` (or ``RefusedUpdate``), or None.
      before_clip: The gradients before clipping (one per variable, summed
        over replicas), or None.
      loss_scale: A ``LossScale``, or None.
      compiled: Whether the step is XLA-compiled (``statistics.norms``).
      activations: An ``Activations``, or None.
    """

    def __init__(self, update=None, before_clip=None, loss_scale=None, compiled=False, activations=None):
        self.update = update
        self.before_clip = before_clip
        self.loss_scale = loss_scale
        self.compiled = compiled
        self.activations = activations

    @property
    def names(self):
        """The optimizer columns this write stores (part of the layout, so static)."""
        names = set()
        if self.update is not None:
            names.update(UPDATE_COLUMNS)
        if self.before_clip is not None:
            names.add(BEFORE_CLIP_COLUMN)
        if self.loss_scale is not None:
            names.update(LOSS_SCALE_COLUMNS)
        if self.activations is not None:
            names.update(metadata.ACTIVATION_STAT_COLUMNS)
        return tuple(c for c in metadata.OPTIONAL_STAT_COLUMNS if c in names)

    def columns(self, rows):
        out = {}
        if self.update is not None:
            out.update(self.update.columns(rows))
        if self.before_clip is not None:
            out.update(before_clip_columns(self.before_clip, rows, self.compiled))
        if self.loss_scale is not None:
            out.update(self.loss_scale.columns(rows))
        if self.activations is not None:
            out.update(self.activations.columns(rows))
        return out


def fill(layer, variable, names, values):
    """Appends the optimizer columns ``names`` to ``[A, R, C]`` stats; sets weight_norm where given.

    Args:
      layer, variable: float32 ``[A, R, C]`` stats, ``C`` the base columns,
        slab 0 the ``last`` aggregate.
      names: The layout's optimizer columns, in stored order.
      values: ``{column: (layer [L], variable [V])}`` of this write step, or
        None (a partial window written at close: the columns are MISSING).

    Returns:
      ``(layer, variable)`` with ``len(names)`` more columns: the value in
      the ``last`` slab, MISSING in the others (taken at the write step).
    """
    values = values or {}
    weight = metadata.STORED_STAT_COLUMNS.index("weight_norm")
    out = []
    for k, part in enumerate((layer, variable)):
        slabs = tf.shape(part)[0]
        if "weight_norm" in values:
            w = tf.broadcast_to(values["weight_norm"][k][None, :, None], tf.concat([tf.shape(part)[:2], [1]], 0))
            part = tf.concat([part[..., :weight], w, part[..., weight + 1 :]], axis=-1)
        extra = []
        for name in names:
            if name in values:
                v = values[name][k]
                rest = tf.fill(tf.stack([slabs - 1, tf.shape(v)[0]]), tf.constant(statistics.MISSING, tf.float32))
                extra.append(tf.concat([v[None], rest], axis=0))
            else:
                extra.append(tf.fill(tf.shape(part)[:2], tf.constant(statistics.MISSING, tf.float32)))
        if extra:
            part = tf.concat([part, tf.stack(extra, axis=-1)], axis=-1)
        out.append(part)
    return tuple(out)
