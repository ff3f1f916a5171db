"""Plugin name, stored-format version and the metadata content of every tag; no TensorFlow.

Every summary tb_gradcheck writes carries plugin name ``gradients`` and
``DATA_CLASS_TENSOR``. The metadata content is UTF-8 JSON describing the
tensor's layout: which rows (layers or variables, in depth order), which
columns (statistics or check fields) and which slabs (window aggregates).
TensorBoard keeps only the first metadata it sees for a (run, tag), so the
layout is fixed for the life of a tag; the tag therefore ends in a
fingerprint of the layout, and a run whose model changes gets a new tag
instead of mislabelled rows (see ``tags.tag_for``). A stats layout's tag also
ends in the span of steps it holds (``tags.span_steps``), so that a tag stops
growing and a reader's poll re-reads only the newest span.

This module is imported by the TensorBoard plugin, so it must stay free of
TensorFlow.
"""

import json
import math

PLUGIN_NAME = "gradients"

# Bump when the meaning of stored bytes changes. Readers refuse content with a
# newer version than they know, rather than guessing at its layout.
CONTENT_VERSION = 1

KIND_STATS = "stats"
KIND_CHECK = "check"
KINDS = (KIND_STATS, KIND_CHECK)

GRANULARITIES = ("layer", "variable")

# Statistic columns of a stats tensor (STORED_STAT_COLUMNS below gives their
# stored order). Readers read columns by name and skip names they do not know,
# so a column added here leaves older logs readable and older readers working,
# and logs written before a reordering read the same.
GRADIENT_STAT_COLUMNS = (
    "grad_norm",
    "grad_max_abs",
    "grad_zero_fraction",
    "grad_nonfinite",
    # Fraction of the row's output units whose gradient is exactly zero in
    # every parameter of the unit (what a unit is: tb_gradcheck.tensorflow.statistics).
    "dead_unit_fraction",
)
# The onset of a divergence inside a window, stored only by windowed layouts
# (every_n_steps > 1): with every step written they only restate grad_norm
# and grad_nonfinite (the finite norm is grad_norm where finite, the offset
# is 0 where grad_nonfinite > 0), so those layouts leave them out (a quarter
# of their bytes) and a reader of a missing column falls back to exactly that.
ONSET_STAT_COLUMNS = (
    # grad_norm over the steps whose gradient was finite: its "max" slab is
    # the largest finite norm of a window, which a NaN later in the window
    # does not hide (the grad_norm "max" slab is then NaN). -1 when no step
    # of the window had a finite gradient.
    "grad_norm_finite",
    # The first step of the window with a non-finite gradient element, stored
    # as its offset before the write step: write step - first step (0: the
    # write step itself). An offset is a small integer, exact in float32 up to
    # 2**24 steps, where the step itself (up to 2**63) would not be. The same
    # value in every slab (it is a fact about the window, not an aggregate);
    # -1 when the window had none.
    "first_nonfinite_offset",
)
# Every stored statistic, in stored order: the gradient columns, the weight column (taken at the write step), then
# the onset columns, so a layout without them has the others at the same positions.
STORED_STAT_COLUMNS = GRADIENT_STAT_COLUMNS + ("weight_norm",) + ONSET_STAT_COLUMNS
# What the optimizer did (tb_gradcheck.tensorflow.optimizer), taken at the write step:
# stored after the columns above, and only by layouts that have them (a
# writer that never saw gradients before clipping has no such column).
# loss_scale and refused_steps are facts about the step, not a row: the same
# value in every row (a few floats per write), so they ride along the step
# axis of the heatmap itself and bin with it.
OPTIMIZER_STAT_COLUMNS = ("grad_norm_before_clip", "update_norm", "update_to_weight", "loss_scale", "refused_steps")
# Each layer's forward output at the write step (activations=True; docs/stored_format.md, rowstats.ACTIVATION_SUMS):
# "last" slab only; MISSING in variable rows, where the module did not run, or no ReLU / Tanh / Sigmoid follows it.
ACTIVATION_STAT_COLUMNS = ("act_rms", "act_max_abs", "act_nonfinite", "act_dead_fraction", "act_saturated_fraction")
# Columns a layout stores only when its writer measured them, after the statistics above, in this order.
OPTIONAL_STAT_COLUMNS = OPTIMIZER_STAT_COLUMNS + ACTIVATION_STAT_COLUMNS
# Per-step series the tab draws as a track along the heatmap's step axis, not as a heatmap (every row holds one value).
TRACK_METRICS = ("loss_scale", "refused_steps")
# Derived on read: grad_to_weight is grad_norm / weight_norm in every aggregate (weights are taken at the write
# step); clip_ratio is grad_norm_before_clip / grad_norm at the write step, 1 where clipping did not bind, k where
# it cut the gradient k-fold (only where a layout stores grad_norm_before_clip).
DERIVED_STAT_COLUMNS = ("grad_to_weight", "clip_ratio")
# The columns of a stats matrix as a reader holds it: stored, then derived.
# Not every column is a metric (see METRICS).
STAT_COLUMNS = STORED_STAT_COLUMNS + OPTIONAL_STAT_COLUMNS + DERIVED_STAT_COLUMNS

# Slabs of a stats tensor. A writer that writes every step stores only "last";
# a windowed writer (every_n_steps > 1) stores all of them, each reduced over
# the training steps since its previous write.
AGGREGATES = ("last", "mean", "max", "min", "sum")
SINGLE_STEP_AGGREGATES = ("last",)

# The served metrics (the tab's metric list, export, the heatmap route) and which aggregates a user may ask for
# of each, in display order. A sum of norms over a window is a number, but not one anybody should read; a sum of
# non-finite counts is exactly what "how many NaNs in this window" means. Only grad_norm and grad_nonfinite are
# reduced at every step of a window (one fused pass per gradient); grad_to_weight follows grad_norm. max |g|, the
# zero fraction, dead units and the weights are taken at the write step. grad_norm_finite and
# first_nonfinite_offset are stored for the findings (the onset of a divergence inside a window), not offered as
# metrics: as a heatmap they would only repeat grad_norm.
METRIC_AGGREGATES = {
    "grad_norm": ("last", "mean", "max", "min"),
    "grad_max_abs": ("last",),
    "grad_zero_fraction": ("last",),
    "grad_nonfinite": ("last", "mean", "max", "sum"),
    "dead_unit_fraction": ("last",),
    "weight_norm": ("last",),
    "grad_to_weight": ("last", "mean", "max", "min"),
    # Taken at the write step only (tb_gradcheck.tensorflow.optimizer).
    "grad_norm_before_clip": ("last",),
    "clip_ratio": ("last",),
    "update_norm": ("last",),
    "update_to_weight": ("last",),
    # Under a dynamic loss scale: the scale this step's gradient was made
    # with, and the steps since the previous write that the optimizer refused
    # (non-finite gradient: no update, scale halved).
    "loss_scale": ("last",),
    "refused_steps": ("last",),
    **{c: ("last",) for c in ACTIVATION_STAT_COLUMNS},  # forward outputs, taken at the write step
}
METRICS = tuple(METRIC_AGGREGATES)

# Columns of a check tensor (written by GradientWriter.write_check): the deciding probe's analytic and numeric
# directional derivatives, their relative error, the error bound of the numeric one (same units as the
# derivatives: the smallest discrepancy the check could resolve), the row's power (min_detectable_error: the
# smallest relative error along the row's gradient the check would have convicted; +inf when it had no gradient
# probe), the status and whose verdict it is (float64_recheck, an index into CHECK_RECHECKS). Readers take
# columns by name, so layouts written before min_detectable_error or float64_recheck read with them missing.
CHECK_COLUMNS = ("analytic", "numeric", "relative_error", "noise_floor", "min_detectable_error", "status")
CHECK_COLUMNS += ("float64_recheck",)
# Stored as the index into this tuple, which is also the order of severity:
# binning several steps keeps the worst status with a plain max.
CHECK_STATUSES = ("ok", "inconclusive", "mismatch")
# Whose verdict a check row holds (tb_gradcheck.check.settle): its own
# dtype's, the float64 twin's, or its own because the twin could not run.
CHECK_RECHECKS = ("none", "float64", "unavailable")
# The check metric served in the heatmap, and the column it reads.
CHECK_METRIC = "check_error"


class ContentError(ValueError):
    """Metadata content that this version of tb_gradcheck cannot read."""


def stats_layout(layers, variables, aggregates, window, optimizer_columns=(), not_cleared=False):
    """The layout of a stats tensor, which holds both granularities.

    The tensor is float32 ``[A, L + V + 1, C]``: ``A`` aggregates, then the
    ``L`` layer rows, the ``V`` variable rows and one header row whose
    column 0 counts the writes this writer has made (the M of "N of M steps"
    when TensorBoard samples), ``C = len(stored_columns(window))`` plus the
    ``optimizer_columns`` it stores. One event per
    written step keeps the per-step cost to the numbers themselves.

    Args:
      layers: ``{"rows": names, "sizes": element counts, "sparse_rows": names,
        "shapes": shapes}`` for the layer rows, in depth order.
        ``sparse_rows`` are rows whose gradients are ``tf.IndexedSlices``
        (embeddings): their zero fraction is high by nature, not because they
        are dead. ``shapes`` (optional) gives every row its variables'
        shapes, in the row's variable order, each a list of ints: a variable
        row has one, a Dense layer row ``[[in, out], [out]]``. Comparing two
        runs by structure aligns rows by them (``tb_gradcheck.reader.align``).
        ``outside_optimizer`` (optional, stored only when not empty) are
        rows with a gradient that no parameter group of the optimizer holds
        (a layer row when any of its parameters is), as the PyTorch writer
        sees the groups: they never move, which their numbers (an update of
        exactly 0) cannot tell from a group at learning rate 0.
        ``module_classes`` (optional, stored only when not empty):
        ``{row name: class name}`` for rows whose name alone says nothing
        of what they are (a module's index in a ``torch.nn.Sequential``:
        ``0``, ``features.3``); readers show them as ``0 (Linear)``
        (``label``), and the name stays what rows are matched by.
      variables: The same for the variable rows.
      aggregates: Slab names, in stored order.
      window: Training steps one write summarises (1: every step is written).
      optimizer_columns: Names from ``OPTIONAL_STAT_COLUMNS`` (the
        optimizer's and the activations') this layout stores after the
        others, in that order; default none.
      not_cleared: The writer saw a ``backward()`` add into the gradients
        the optimizer had applied (no ``zero_grad()``): ``gradients_not_cleared``,
        stored only when true, so other layouts keep their bytes and fingerprint.

    Returns:
      A JSON-able dict; ``encode`` turns it into content bytes.
    """
    content = {
        "version": CONTENT_VERSION,
        "kind": KIND_STATS,
        "columns": list(stored_columns(window)) + [c for c in OPTIONAL_STAT_COLUMNS if c in optimizer_columns],
        "aggregates": list(aggregates),
        "window": int(window),
        "layer": _granularity_block(**layers),
        "variable": _granularity_block(**variables),
    }
    if not_cleared:
        content["gradients_not_cleared"] = True
    return content


def stored_columns(window):
    """The statistic columns a layout of ``window`` training steps per write stores (before any optimizer column)."""
    return STORED_STAT_COLUMNS if window > 1 else STORED_STAT_COLUMNS[: -len(ONSET_STAT_COLUMNS)]


def check_layout(granularity, rows):
    """The layout of a check tensor: float32 ``[R, len(CHECK_COLUMNS)]``, one row per checked layer or variable."""
    return {
        "version": CONTENT_VERSION,
        "kind": KIND_CHECK,
        "granularity": granularity,
        "rows": list(rows),
        "columns": list(CHECK_COLUMNS),
    }


def _granularity_block(rows, sizes, sparse_rows=(), shapes=None, outside_optimizer=(), module_classes=None):
    block = {"rows": list(rows), "sizes": [int(s) for s in sizes], "sparse_rows": list(sparse_rows)}
    if module_classes:
        # Only for rows named by an index: other layouts keep their bytes and fingerprint.
        block["module_classes"] = {str(k): str(v) for k, v in module_classes.items()}
    if outside_optimizer:
        # Only when some row is: the layouts of writers that do not see the
        # optimizer's groups (and of runs whose groups hold every row) keep
        # their bytes and their tag's fingerprint.
        block["outside_optimizer"] = list(outside_optimizer)
    if shapes is not None:
        # Optional, so layouts written before it existed (and writers that
        # do not know shapes) keep their bytes and their tag's fingerprint.
        block["shapes"] = [[[int(d) for d in shape] for shape in row] for row in shapes]
    return block


def label(name, module_class=None):
    """A row's name as the tab and the report show it: ``0 (Linear)`` for a row named by an index, else the name."""
    return f"{name} ({module_class})" if module_class else name


def labels(block):
    """``{row name: label}`` for the rows of a layout block that have a module class (``module_classes``)."""
    return {name: label(name, cls) for name, cls in block.get("module_classes", {}).items()}


def encode(content):
    """Serialises a layout dict canonically (sorted keys), so equal layouts give equal bytes."""
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode("utf-8")


def point_bytes(content):
    """Bytes of one point (one step's float32 tensor) of a tag with this layout."""
    return 4 * math.prod(shape_of(content))


def parse(content_bytes):
    """Parses and validates metadata content.

    Args:
      content_bytes: The ``plugin_data.content`` bytes of a tag.

    Returns:
      The layout dict, with every field that its kind requires.

    Raises:
      ContentError: The bytes are not a layout this version can read, with
        the reason in the message.
    """
    try:
        content = json.loads(bytes(content_bytes).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ContentError(f"metadata content is not UTF-8 JSON ({e})") from None
    except RecursionError:  # "[[[[..." nested deeper than the parser's stack
        raise ContentError("metadata content is JSON nested too deeply to be a layout") from None
    if not isinstance(content, dict):
        raise ContentError(f"metadata content is not a JSON object: {type(content).__name__}")
    version = content.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ContentError(f"metadata content has no integer version (1 or more): {_short(version)}")
    if version > CONTENT_VERSION:
        raise ContentError(
            f"written by a newer tb_gradcheck (content version {version}, "
            f"this one reads up to {CONTENT_VERSION}); upgrade tb_gradcheck"
        )
    kind = content.get("kind")
    if kind not in KINDS:
        raise ContentError(f"unknown kind {_short(kind)}; expected one of {list(KINDS)}")
    _require_names(content, "columns")
    if kind == KIND_STATS:
        _require_names(content, "aggregates")
        unknown = [a for a in content["aggregates"] if a not in AGGREGATES]
        if unknown:
            raise ContentError(f"unknown aggregates {_short(unknown)}")
        window = content.get("window")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ContentError(f"window must be a positive integer, got {_short(window)}")
        if content.get("gradients_not_cleared", True) is not True:
            raise ContentError(
                f"gradients_not_cleared is true where stored, got {_short(content['gradients_not_cleared'])}"
            )
        for granularity in GRANULARITIES:
            block = content.get(granularity)
            if not isinstance(block, dict):
                raise ContentError(f"stats content has no {granularity!r} block")
            _require_names(block, "rows", granularity)
            sizes = block.get("sizes")
            if (
                not isinstance(sizes, list)
                or len(sizes) != len(block["rows"])
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes)
            ):
                raise ContentError(f"{granularity} sizes must be one integer per row")
            for field in ("sparse_rows", "outside_optimizer"):
                names = block.get(field, [])
                if (
                    not isinstance(names, list)
                    or not all(isinstance(n, str) for n in names)
                    or not set(names) <= set(block["rows"])
                ):
                    raise ContentError(f"{granularity} {field} must be a list of row names, got {_short(names)}")
            classes = block.get("module_classes", {})
            if (
                not isinstance(classes, dict)
                or not all(isinstance(v, str) for v in classes.values())
                or not set(classes) <= set(block["rows"])
            ):
                raise ContentError(
                    f"{granularity} module_classes must map row names to class names, got {_short(classes)}"
                )
            if "shapes" in block and not _valid_shapes(block["shapes"], len(block["rows"])):
                raise ContentError(
                    f"{granularity} shapes must be one list of shapes (lists of non-negative integers) per row, "
                    f"got {_short(block['shapes'])}"
                )
    else:
        if content.get("granularity") not in GRANULARITIES:
            raise ContentError(
                f"unknown granularity {_short(content.get('granularity'))}; expected one of {list(GRANULARITIES)}"
            )
        _require_names(content, "rows")
        if "status" not in content["columns"]:
            raise ContentError(f"a check layout needs a 'status' column, got columns {_short(content['columns'])}")
    # Columns this version does not know are skipped when reading, so a
    # newer writer's extra statistic does not hide the rest; a layout with
    # nothing readable is no layout at all.
    known = STORED_STAT_COLUMNS + OPTIONAL_STAT_COLUMNS if kind == KIND_STATS else CHECK_COLUMNS
    if not set(content["columns"]) & set(known):
        raise ContentError(f"columns {_short(content['columns'])} include none of {list(known)}")
    return content


def rows_of(content, granularity):
    """``(names, row slice)`` of one granularity's rows in a tensor of this layout."""
    if content["kind"] == KIND_CHECK:
        return content["rows"], slice(0, len(content["rows"]))
    n_layers = len(content["layer"]["rows"])
    if granularity == "layer":
        return content["layer"]["rows"], slice(0, n_layers)
    return content["variable"]["rows"], slice(n_layers, n_layers + len(content["variable"]["rows"]))


def header_row(content):
    """Index of the header row of a stats tensor (column 0: writes so far)."""
    return len(content["layer"]["rows"]) + len(content["variable"]["rows"])


def shape_of(content):
    """Returns the tensor shape a layout promises, as a tuple."""
    if content["kind"] == KIND_STATS:
        return (len(content["aggregates"]), header_row(content) + 1, len(content["columns"]))
    return (len(content["rows"]), len(content["columns"]))


def _valid_shapes(shapes, n_rows):
    def dim(d):
        return isinstance(d, int) and not isinstance(d, bool) and d >= 0

    return (
        isinstance(shapes, list)
        and len(shapes) == n_rows
        and all(
            isinstance(row, list) and all(isinstance(shape, list) and all(dim(d) for d in shape) for shape in row)
            for row in shapes
        )
    )


def _require_names(content, key, where=""):
    label = f"{where} {key}".strip()
    names = content.get(key)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ContentError(f"{label} must be a non-empty list of strings, got {_short(names)}")
    if len(set(names)) != len(names):
        raise ContentError(f"{label} must be unique, got duplicates in {_short(names)}")


def _short(value, limit=200):
    """``repr(value)``, cut to ``limit`` characters: reasons are shown in the tab, content may be huge."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
