"""Plugin name, stored-format version and the metadata content of every tag; no TensorFlow.

Every summary tb_gradcheck writes carries plugin name ``gradients`` and
``DATA_CLASS_TENSOR``. The metadata content is UTF-8 JSON describing the
tensor's layout: which rows (layers or variables, in depth order), which
columns (statistics or check fields) and which slabs (window aggregates).
TensorBoard keeps only the first metadata it sees for a (run, tag), so the
layout is fixed for the life of a tag; the tag therefore ends in a
fingerprint of the layout, and a run whose model changes gets a new tag
instead of mislabelled rows (see ``tag_for``).

This module is imported by the TensorBoard plugin, so it must stay free of
TensorFlow.
"""

import hashlib
import json

PLUGIN_NAME = "gradients"

# Bump when the meaning of stored bytes changes. Readers refuse content with a
# newer version than they know, rather than guessing at its layout.
CONTENT_VERSION = 1

KIND_STATS = "stats"
KIND_CHECK = "check"
KIND_PROGRESS = "progress"
KINDS = (KIND_STATS, KIND_CHECK, KIND_PROGRESS)

GRANULARITIES = ("layer", "variable")

# Statistic columns of a stats tensor, in stored order.
STAT_COLUMNS = (
    "grad_norm",
    "grad_max_abs",
    "grad_zero_fraction",
    "grad_nonfinite",
    "weight_norm",
    "grad_to_weight",
)

# Slabs of a stats tensor. A writer that writes every step stores only "last";
# a windowed writer (every_n_steps > 1) stores all of them, each reduced over
# the training steps since its previous write.
AGGREGATES = ("last", "mean", "max", "min", "sum")
SINGLE_STEP_AGGREGATES = ("last",)

# Which aggregates a user may ask for, per metric. A sum of norms over a
# window is a number, but not one anybody should read; a sum of non-finite
# counts is exactly what "how many NaNs in this window" means.
_DEFAULT_AGGREGATES = ("last", "mean", "max", "min")
METRIC_AGGREGATES = {c: _DEFAULT_AGGREGATES for c in STAT_COLUMNS}
METRIC_AGGREGATES["grad_nonfinite"] = ("last", "mean", "max", "sum")

# Columns of a check tensor (written by GradientWriter.write_check): the
# deciding probe's analytic and numeric directional derivatives, their
# relative error, the error bound of the numeric one (same units as the
# derivatives: the smallest discrepancy the check could resolve) and the status.
CHECK_COLUMNS = ("analytic", "numeric", "relative_error", "noise_floor", "status")
# Stored as the index into this tuple, which is also the order of severity:
# binning several steps keeps the worst status with a plain max.
CHECK_STATUSES = ("ok", "inconclusive", "mismatch")
# The check metric served in the heatmap, and the column it reads.
CHECK_METRIC = "check_error"


class ContentError(ValueError):
    """Metadata content that this version of tb_gradcheck cannot read."""


def layout(kind, granularity=None, rows=(), columns=(), aggregates=(), window=1, sizes=None):
    """Returns the JSON-able layout dict that becomes a tag's metadata content.

    Args:
      kind: One of ``KINDS``.
      granularity: ``"layer"`` or ``"variable"``; None for the progress tag.
      rows: Row names in depth order (input side first).
      columns: Column names, in stored order.
      aggregates: Slab names, in stored order (stats only).
      window: Training steps a write summarises (1 means every step is written).
      sizes: Element count of each row (stats only), or None.

    Returns:
      A dict; ``encode`` turns it into content bytes.
    """
    content = {"version": CONTENT_VERSION, "kind": kind}
    if granularity is not None:
        content["granularity"] = granularity
    if rows:
        content["rows"] = list(rows)
    if columns:
        content["columns"] = list(columns)
    if aggregates:
        content["aggregates"] = list(aggregates)
    if kind == KIND_STATS:
        content["window"] = int(window)
    if sizes is not None:
        content["sizes"] = [int(s) for s in sizes]
    return content


def encode(content):
    """Serialises a layout dict canonically (sorted keys), so equal layouts give equal bytes."""
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode("utf-8")


def tag_for(content):
    """Returns the tag under which tensors of this layout are written.

    ``gradients/<kind>/<granularity>/<fingerprint>``: the fingerprint is the
    first 12 hex digits of the SHA-256 of the encoded layout, so a restarted
    run with the same model continues the same series, and a run written by
    a different model starts a new one that the plugin merges by row name.
    """
    fingerprint = hashlib.sha256(encode(content)).hexdigest()[:12]
    parts = [PLUGIN_NAME, content["kind"]]
    if "granularity" in content:
        parts.append(content["granularity"])
    parts.append(fingerprint)
    return "/".join(parts)


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
    if not isinstance(content, dict):
        raise ContentError(f"metadata content is not a JSON object: {type(content).__name__}")
    version = content.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ContentError(f"metadata content has no integer version: {version!r}")
    if version > CONTENT_VERSION:
        raise ContentError(
            f"written by a newer tb_gradcheck (content version {version}, "
            f"this one reads up to {CONTENT_VERSION}); upgrade tb_gradcheck"
        )
    kind = content.get("kind")
    if kind not in KINDS:
        raise ContentError(f"unknown kind {kind!r}; expected one of {list(KINDS)}")
    if kind == KIND_PROGRESS:
        return content
    if content.get("granularity") not in GRANULARITIES:
        raise ContentError(
            f"unknown granularity {content.get('granularity')!r}; expected one of {list(GRANULARITIES)}"
        )
    _require_names(content, "rows")
    _require_names(content, "columns")
    if kind == KIND_STATS:
        _require_names(content, "aggregates")
        unknown = [a for a in content["aggregates"] if a not in AGGREGATES]
        if unknown:
            raise ContentError(f"unknown aggregates {unknown!r}")
        window = content.get("window")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ContentError(f"window must be a positive integer, got {window!r}")
    sizes = content.get("sizes")
    if sizes is not None and (
        not isinstance(sizes, list) or len(sizes) != len(content["rows"])
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes)
    ):
        raise ContentError("sizes must be one integer per row")
    return content


def shape_of(content):
    """Returns the tensor shape a layout promises, as a tuple."""
    kind = content["kind"]
    if kind == KIND_STATS:
        return (len(content["aggregates"]), len(content["rows"]), len(content["columns"]))
    if kind == KIND_CHECK:
        return (len(content["rows"]), len(content["columns"]))
    return ()


def _require_names(content, key):
    names = content.get(key)
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ContentError(f"{key} must be a non-empty list of strings, got {names!r}")
    if len(set(names)) != len(names):
        raise ContentError(f"{key} must be unique, got duplicates in {names!r}")
