"""The heatmap wire format: windowing, binning, a comparison's aligned rows and encoding of one matrix; numpy only.

What ``GET heatmap`` and ``GET compare`` answer is built here from a
``store.Heatmap``, so the format has one definition on the server side
(docs/http_api.md describes it; frontend/wire.js decodes it). The check
status travels as codes into ``metadata.CHECK_STATUSES``, whose order is
sent with every response that carries a status (``status_names``): the
client takes the order from the response instead of assuming it.
"""

import base64
import dataclasses

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.reader import binning

ENCODINGS = ("json", "f32")
# The keys of an f32 body that hold base64 text (encode_matrix, heatmap_body).
PACKED = ("values_f32", "missing_bits", "status_f32")
ALIGNMENTS = ("name", "structure")


@dataclasses.dataclass
class Window:
    """The part of a matrix a request asks for.

    Attributes:
      first_step: Smallest step to keep (inclusive), or None for no bound.
      last_step: Largest step to keep (inclusive), or None.
      row_start: First row index to keep, default 0.
      row_end: One past the last row index, or None for every row. Indices
        past the end are clamped, as slicing does.
    """

    first_step: object = None
    last_step: object = None
    row_start: int = 0
    row_end: object = None


def heatmap_body(heat, width=None, reduce="max", encoding="json", window=None):
    """The JSON of ``GET heatmap`` for a ``store.Heatmap``.

    Args:
      heat: A ``store.Heatmap`` (or any object with its attributes).
      width: Most step columns to return, or None for all; consecutive steps
        are binned (``binning.bin_steps``), keeping extremes.
      reduce: How binned steps combine: ``"max"``, ``"min"`` or ``"mean"``.
      encoding: ``"json"`` (nested lists) or ``"f32"`` (base64 float32, see
        ``encode_matrix``).
      window: A ``Window`` cutting steps and rows first, or None.

    Returns:
      A JSON-able dict (docs/http_api.md, ``GET heatmap``).
    """
    window = window or Window()
    values, missing, status, status_missing = heat.values, heat.missing, heat.status, heat.status_missing
    rows = list(heat.rows)
    steps = np.asarray(heat.steps)
    start = min(max(0, window.row_start), len(rows))
    end = len(rows) if window.row_end is None else min(max(start, window.row_end), len(rows))
    keep = np.ones(len(steps), bool)
    if window.first_step is not None:
        keep &= steps >= window.first_step
    if window.last_step is not None:
        keep &= steps <= window.last_step
    if start != 0 or end != len(rows) or not keep.all():
        rows = rows[start:end]
        steps = steps[keep]
        values, missing = values[keep, start:end], missing[keep, start:end]
        if status is not None:
            status, status_missing = status[keep, start:end], status_missing[keep, start:end]
    step_ends, binned = None, None
    if width is not None and len(steps) > width:
        first, step_ends, values, missing = binning.bin_steps(steps, values, missing, width, reduce)
        if status is not None:
            # Status codes are ordered by severity: a bin shows its worst.
            _, _, status, status_missing = binning.bin_steps(steps, status, status_missing, width, "max")
        steps, binned = first, reduce
    body = {
        "run": heat.run,
        "metric": heat.metric,
        "granularity": heat.granularity,
        "aggregate": heat.aggregate,
        "layers": rows,
        # Names as shown where the name is an index (``0 (Linear)``); rows are matched by ``layers``.
        "labels": {n: heat.labels[n] for n in rows if n in heat.labels},
        "row_start": start,
        "num_rows": len(heat.rows),
        "steps": steps.tolist(),
        "step_ends": None if step_ends is None else step_ends.tolist(),
        **encode_matrix(values, missing, encoding),
        "status": None,
        "status_names": None,
        "num_steps": int(np.count_nonzero(keep)),
        "total_steps": heat.total_steps,
        "reduce": binned,
    }
    if status is not None:
        body["status_names"] = list(metadata.CHECK_STATUSES)
        if encoding == "f32":
            # Codes as float32, NaN where the row was not checked: the same
            # packing as the values, decoded by the same client function.
            codes = np.where(status_missing | ~_valid_codes(status), np.nan, status)
            body["status_f32"] = _b64(np.ascontiguousarray(codes, "<f4"))
        else:
            body["status"] = status_matrix(status, status_missing)
    return body


def compare_body(a, b, alignment, width=None, reduce="max", encoding="json", window=None):
    """The JSON of ``GET compare``: ``a`` over ``b``, rows aligned, at the steps both have.

    Args:
      a: The ``store.Heatmap`` of the run.
      b: The ``store.Heatmap`` of the other run (same metric, granularity
        and aggregate).
      alignment: The ``align.Alignment`` of ``a.rows`` with ``b.rows``.
      width, reduce, encoding, window: As ``heatmap_body``.

    Returns:
      The ``heatmap_body`` of the ratios plus the fields of
      ``alignment_body`` (``run_layers`` and ``other_layers`` cut to the
      rows the body holds).
    """
    pairs = alignment.pairs
    fields = alignment_body(alignment)
    steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    values = np.full((len(steps), len(pairs)), np.nan)
    missing = np.ones((len(steps), len(pairs)), bool)
    for k, (i, j) in enumerate(pairs):
        if i is None or j is None:
            continue
        va = a.values[ia, i].astype(np.float64)
        vb = b.values[ib, j].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            values[:, k] = va / vb
        missing[:, k] = a.missing[ia, i] | b.missing[ib, j]
    ratio = dataclasses.replace(
        a,
        labels={**b.labels, **a.labels},
        rows=fields.pop("layers"),
        steps=steps,
        values=values,
        missing=missing,
        status=None,
        status_missing=None,
        total_steps=None,
    )
    body = heatmap_body(ratio, width, reduce, encoding, window)
    shown = slice(body["row_start"], body["row_start"] + len(body["layers"]))
    fields["run_layers"], fields["other_layers"] = fields["run_layers"][shown], fields["other_layers"][shown]
    body.update(other=b.run, **fields)
    return body


def alignment_body(alignment):
    """The JSON of an ``align.Alignment`` (docs/http_api.md ``GET align``).

    Returns:
      A dict: ``alignment`` (``"name"`` or ``"structure"``), ``basis`` (what
      a structure match required: ``"shapes"``, ``"sizes"`` or ``"names"``),
      ``matched`` (rows in both runs), ``layers`` (per aligned row, the run's
      name, else the other's), ``run_layers`` and ``other_layers`` (per row,
      its name in each run, or None), ``only_in_run`` and ``only_in_other``.
    """
    pairs = alignment.pairs
    a_rows, b_rows = alignment.rows
    return {
        "alignment": alignment.mode,
        "basis": alignment.basis,
        "matched": alignment.matched,
        "layers": [a_rows[i] if i is not None else b_rows[j] for i, j in pairs],
        "run_layers": [None if i is None else a_rows[i] for i, _ in pairs],
        "other_layers": [None if j is None else b_rows[j] for _, j in pairs],
        "only_in_run": [a_rows[i] for i, j in pairs if j is None],
        "only_in_other": [b_rows[j] for i, j in pairs if i is None],
    }


def status_matrix(status, missing):
    """Nested lists of status names (``metadata.CHECK_STATUSES``), None where a row was not checked."""
    names = metadata.CHECK_STATUSES
    return [
        [None if m or not 0 <= v < len(names) else names[int(v)] for v, m in zip(row_v, row_m)]
        for row_v, row_m in zip(status.tolist(), missing.tolist())
    ]


def encode_matrix(values, missing, encoding):
    """The matrix part of a heatmap body.

    ``encoding="f32"`` sends the matrix as base64 little-endian float32
    (``values_f32``, row-major steps x rows, NaN and infinities as themselves)
    plus a bitmap of missing cells (``missing_bits``, numpy.packbits order),
    instead of nested lists: exact, a third of the bytes, and ~100x cheaper to
    encode than JSON numbers, which is what keeps a 10,000-step heatmap quick.
    """
    if encoding == "f32":
        return {
            "values": None,
            "encoding": "f32",
            "values_f32": _b64(np.ascontiguousarray(values, "<f4")),
            "missing_bits": base64.b64encode(np.packbits(missing, axis=None).tobytes()).decode("ascii"),
        }
    return {"values": json_matrix(values, missing), "encoding": "json"}


def json_matrix(values, missing):
    """Nested lists: None for missing, "NaN", "Infinity", "-Infinity" for non-finite values."""
    values = values.astype(np.float64)
    out = values.tolist()
    for i, j in zip(*np.nonzero(~missing & ~np.isfinite(values))):
        v = values[i, j]
        out[i][j] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    for i, j in zip(*np.nonzero(missing)):
        out[i][j] = None
    return out


def worst_first(cell):
    """Sort key of a check row: largest relative error first, a NaN (or missing) error before all."""
    error = cell["relative_error"]
    return -np.inf if error is None or np.isnan(error) else -error


def _valid_codes(status):
    with np.errstate(invalid="ignore"):
        return (status >= 0) & (status < len(metadata.CHECK_STATUSES)) & (status == np.floor(status))


def _b64(array):
    return base64.b64encode(array.tobytes()).decode("ascii")
