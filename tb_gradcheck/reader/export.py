"""A heatmap matrix as CSV or JSON, for the tab's download button and ``tb-gradcheck export``; numpy only."""

import csv
import io
import math

import numpy as np

FORMATS = ("csv", "json")


def to_csv(heatmap):
    """CSV text: a header ``step,<row>,...`` then one line per step.

    Missing values are empty cells; NaN and infinities are written as
    ``nan``, ``inf`` and ``-inf``, which numpy, pandas and spreadsheets read.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step"] + list(heatmap.rows))
    for step, values, missing in zip(heatmap.steps.tolist(), heatmap.values.tolist(), heatmap.missing.tolist()):
        writer.writerow([step] + ["" if m else _csv_number(v) for v, m in zip(values, missing)])
    return out.getvalue()


def to_json(heatmap):
    """A JSON-able dict in the shape of ``GET heatmap`` (unbinned), non-finite values as strings."""
    return {
        "run": heatmap.run,
        "metric": heatmap.metric,
        "granularity": heatmap.granularity,
        "aggregate": heatmap.aggregate,
        "layers": list(heatmap.rows),
        "steps": heatmap.steps.tolist(),
        "values": [
            [None if m else _json_number(v) for v, m in zip(values, missing)]
            for values, missing in zip(heatmap.values.tolist(), heatmap.missing.tolist())
        ],
    }


def filename(heatmap, fmt):
    """A safe download name such as ``sigmoid-grad_norm-layer-last.csv``.

    Letters and digits of any script are kept (a run may be called
    ``日本``); everything else, path separators and control characters
    included, becomes ``_``.
    """
    stem = "-".join([heatmap.run, heatmap.metric, heatmap.granularity, heatmap.aggregate])
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem).strip("._")[:200] or "gradients"
    return f"{safe}.{fmt}"


def content_disposition(name):
    """The ``Content-Disposition`` header value for a download called ``name`` (RFC 6266).

    HTTP headers are Latin-1 on the wire, and a non-Latin-1 header makes
    the server fail the response: ``filename`` gets an ASCII fallback, and
    ``filename*`` the real name, UTF-8 and percent-encoded.
    """
    from urllib.parse import quote

    ascii_name = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


def _csv_number(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return _shortest(v)


def _json_number(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return float(_shortest(v))


def _shortest(v):
    # Values are stored as float32: print the shortest text that reads back
    # as the same float32 ("0.1", not float64's "0.10000000149011612").
    return str(np.float32(v))
