"""The questions the tab and the command line ask of a logdir: runs, heatmap, compare, findings, checks, export.

Both the plugin's routes and ``tb-gradcheck report | export`` call these
functions, so the tab and the command line always see the same numbers.
Each takes a ``store.Store`` and the request's context and experiment id,
reads only the runs it is asked about, and returns plain data (dicts,
``Heatmap``, ``finding.Finding``); turning that into bytes is the caller's
job. Errors are ``NotFound`` (HTTP 404, exit code 2) and ``BadRequest``
(HTTP 400, exit code 2). numpy only.
"""

import dataclasses

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags
from tb_gradcheck.findings import diagnose
from tb_gradcheck.reader import align
from tb_gradcheck.reader import merge
from tb_gradcheck.reader import spans
from tb_gradcheck.reader import store
from tb_gradcheck.reader.export import filename
from tb_gradcheck.reader.export import to_csv
from tb_gradcheck.reader.export import to_json

NotFound = store.NotFound
BadRequest = store.BadRequest


@dataclasses.dataclass
class Heatmap:
    """One metric of one run as a steps x rows matrix (see docs/http_api.md ``GET heatmap``).

    Attributes:
      rows: Row names in depth order.
      steps: int64 ``[S]``.
      values: float ``[S, R]``.
      missing: bool ``[S, R]``.
      status: float ``[S, R]`` check status codes (index into
        ``metadata.CHECK_STATUSES``) for ``check_error``, else None.
      status_missing: bool ``[S, R]`` or None.
      total_steps: Writes the writer made (progress counter), or None.
      labels: ``{row name: label}`` for rows shown with their module's
        class (``0 (Linear)``, ``runs.RunIndex.labels``).
    """

    run: str
    metric: str
    granularity: str
    aggregate: str
    rows: list
    steps: np.ndarray
    values: np.ndarray
    missing: np.ndarray
    status: object = None
    status_missing: object = None
    total_steps: object = None
    labels: dict = dataclasses.field(default_factory=dict)


def metric_aggregates(index):
    """``{metric: [aggregates]}`` a run can serve, metrics in display order."""
    out = {}
    if metadata.KIND_STATS in index.kinds():
        stored = index.aggregates()
        # Optimizer and activation columns are optional in a layout: offered where one stores them.
        present = {c for s in index.layouts(metadata.KIND_STATS, "layer") for c in s.content["columns"]}
        for m in metadata.METRICS:  # served metrics only; onset columns are stored, not offered
            needs = merge.DERIVED.get(m, (m,))
            if any(c in metadata.OPTIONAL_STAT_COLUMNS and c not in present for c in needs):
                continue
            out[m] = [a for a in metadata.METRIC_AGGREGATES[m] if a in stored]
    if metadata.KIND_CHECK in index.kinds():
        out[metadata.CHECK_METRIC] = ["last"]
    return out


def runs(st, ctx, experiment_id):
    """The ``runs`` list of ``GET runs`` (see docs/http_api.md), one entry per run with data or problems.

    Reads each tag's small ``store.Summary`` (its steps, skipped points and
    write counter), never a merged matrix: listing many large runs costs
    their summaries, which the store keeps while it drops their values.
    """
    out = []
    for run, index in sorted(st.runs(ctx, experiment_id).items()):
        aggregates = metric_aggregates(index)
        entry = {
            "run": run,
            "metrics": list(aggregates),
            "aggregates": aggregates,
            "window": index.window(),
            "granularities": {},
            "check_granularities": [g for g in metadata.GRANULARITIES if index.layouts(metadata.KIND_CHECK, g)],
            "total_steps": None,
            "sampled": False,
            "capped": False,
            "problems": [p.to_dict() for p in index.problems],
            "last_write": index.last_write(),
        }
        kept = 0
        for kind in (metadata.KIND_STATS, metadata.KIND_CHECK):
            kind_metrics = [m for m in aggregates if (m == metadata.CHECK_METRIC) == (kind == metadata.KIND_CHECK)]
            for granularity in metadata.GRANULARITIES:
                layouts = index.layouts(kind, granularity)
                if not layouts:
                    continue
                summaries = [st.summary(ctx, experiment_id, run, s) for s in layouts]
                for summary in summaries:
                    entry["problems"].extend(p.to_dict() for p in summary.problems)
                    entry["capped"] = entry["capped"] or summary.capped
                stands = spans.standing(layouts, summaries)
                steps = merge.union_steps([s.steps if k is None else s.steps[k] for s, k in zip(summaries, stands)])
                described = entry["granularities"].setdefault(
                    granularity,
                    {
                        "rows": index.rows(kind, granularity),
                        "num_steps": int(len(steps)),
                        "first_step": int(steps[0]) if len(steps) else None,
                        "last_step": int(steps[-1]) if len(steps) else None,
                    },
                )
                # An output is a module's: activation metrics have layer rows only.
                described.setdefault("metrics", []).extend(
                    m for m in kind_metrics if granularity == "layer" or m not in metadata.ACTIVATION_STAT_COLUMNS
                )
                if kind == metadata.KIND_STATS:
                    kept = max(kept, len(steps))
        total, problems = st.progress(ctx, experiment_id, index)
        entry["problems"].extend(p.to_dict() for p in problems)
        if metadata.KIND_STATS in index.kinds():
            entry["total_steps"] = total
            entry["sampled"] = entry["capped"] or (total is not None and kept < total)
        # A stats tag serves both granularities: report each problem once.
        entry["problems"] = list({(p["tag"], p["reason"]): p for p in entry["problems"]}.values())
        if entry["metrics"] or entry["problems"]:
            out.append(entry)
    return out


def heatmap(st, ctx, experiment_id, run, metric, granularity="layer", aggregate="last"):
    """One metric of one run, merged over its layouts, as a ``Heatmap``.

    Raises:
      NotFound: Unknown run, or a metric or granularity the run lacks.
      BadRequest: An aggregate the run does not have for the metric.
    """
    index = st.run(ctx, experiment_id, run)
    allowed = metric_aggregates(index).get(metric)
    if allowed is None:
        raise NotFound(f"run {run!r} has no metric {metric!r}")
    if aggregate not in allowed:
        raise BadRequest(f"aggregate must be one of {allowed} for metric {metric!r} of run {run!r}, got {aggregate!r}")
    check = metric == metadata.CHECK_METRIC
    kind = metadata.KIND_CHECK if check else metadata.KIND_STATS
    if not index.layouts(kind, granularity) or (granularity != "layer" and metric in metadata.ACTIVATION_STAT_COLUMNS):
        raise NotFound(f"run {run!r} has no {granularity}-level {metric!r} data")
    # One metric is a small share of its tags (which hold every column of both
    # granularities): kept apart, a refresh, zoom or new width on unchanged
    # data costs no read, even when the tags themselves do not fit the cache.
    # One entry per view; when the run grows, the store reads only the tags
    # that changed and decodes their new points, and each laid-out column is
    # extended by the new steps (merge.grow).
    key = ("heatmap", experiment_id, run, metric, granularity, aggregate)
    version = index.version()
    hit = st.cache.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    with st.lock(key):  # one request at a time extends what the entry holds
        hit = st.cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        heat, laid = _heatmap(st, ctx, experiment_id, index, metric, granularity, aggregate, hit and hit[2])
        arrays = [a for a in (heat.steps, heat.values, heat.missing, heat.status, heat.status_missing) if a is not None]
        for a in arrays:
            a.setflags(write=False)  # shared by every request that hits the cache
        # The laid-out columns' arrays, and any derived from them (a ratio).
        size = sum(a.nbytes for a in laid.values()) + 64 * len(heat.rows)
        size += sum(a.nbytes for a in (heat.values, heat.missing) if a.base is None)
        return st.cache.put(key, (version, heat, laid), size, cost=index.read_bytes())[1]


def _heatmap(st, ctx, experiment_id, index, metric, granularity, aggregate, previous):
    """``(Heatmap, {column: merge.Laid})``, growing each column ``previous`` laid out."""
    run = index.run
    check = metric == metadata.CHECK_METRIC
    kind = metadata.KIND_CHECK if check else metadata.KIND_STATS
    rows = index.rows(kind, granularity)
    laid = {}

    def plain(column):
        blocks = st.blocks(ctx, experiment_id, index, kind, granularity, column, None if check else aggregate)
        laid[column] = merge.grow((previous or {}).get(column), blocks, rows)
        return laid[column].views()

    if check:
        steps, values, missing = plain("relative_error")
        _, status, status_missing = plain("status")
        heat = Heatmap(run, metric, granularity, aggregate, rows, steps, values, missing, status, status_missing)
    else:
        steps, values, missing = merge.derived(plain, metric)
        total = st.progress(ctx, experiment_id, index)[0]
        heat = Heatmap(run, metric, granularity, aggregate, rows, steps, values, missing, total_steps=total)
    heat.labels = index.labels(granularity)
    return heat, laid


def compare(st, ctx, experiment_id, run, other, metric, granularity="layer", aggregate="last", request=align.NAME):
    """The two heatmaps ``GET compare`` sets against each other, and their rows' ``align.Alignment``.

    ``wire.compare_body`` turns them into the ratio.

    Raises:
      BadRequest: ``metric`` is the check metric, which has no ratio.
      NotFound: As ``heatmap``, for either run.
    """
    if metric == metadata.CHECK_METRIC:
        raise BadRequest(f"compare takes a statistic, not {metric!r}")
    a = heatmap(st, ctx, experiment_id, run, metric, granularity, aggregate)
    b = heatmap(st, ctx, experiment_id, other, metric, granularity, aggregate)
    found = alignment(st, ctx, experiment_id, run, other, granularity, request, rows=(a.rows, b.rows))
    return a, b, found


def alignment(
    st, ctx, experiment_id, run, other, granularity="layer", request=align.AUTO, kind=metadata.KIND_STATS, rows=None
):
    """Which rows of ``run`` are which rows of ``other`` (``align.choose``): an ``align.Alignment``.

    Args:
      st, ctx, experiment_id: As every query.
      run, other: The two runs.
      granularity: ``"layer"`` or ``"variable"``.
      request: ``"name"``, ``"structure"`` or ``"auto"`` (``align.REQUESTS``).
      kind: Whose rows: ``metadata.KIND_STATS`` or ``KIND_CHECK`` (as
        ``heatmap`` serves them for the metric). What a structure alignment
        compares (shapes, else sizes) comes from the stats layouts either way.
      rows: ``(run's rows, other's rows)`` to align, default the rows
        ``heatmap`` serves; ``compare`` passes its heatmaps' own.

    Raises:
      NotFound: Unknown run, or either run has no ``granularity`` rows of ``kind``.
    """
    indexes = [st.run(ctx, experiment_id, r) for r in (run, other)]
    for r, index in zip((run, other), indexes):
        if not index.layouts(kind, granularity):
            raise NotFound(f"run {r!r} has no {granularity}-level {kind} data")
    rows = rows or [index.rows(kind, granularity) for index in indexes]
    # The rows and their shapes change only with a new layout (a new tag),
    # not with every step a live run writes: keyed by tags and rows, a
    # refresh of a growing run costs no new alignment.
    # Keyed by layout, not by tag: a span tag (tags.span_of) changes no row.
    layout_tags = [
        tuple(dict.fromkeys(tags.span_of(s.tag)[0] for s in index.layouts(metadata.KIND_STATS, granularity)))
        for index in indexes
    ]
    key = ("alignment", experiment_id, run, other, *layout_tags, tuple(rows[0]), tuple(rows[1]), granularity, request)
    hit = st.cache.get(key)
    if hit is not None:
        return hit
    contents = [[s.content for s in index.layouts(metadata.KIND_STATS, granularity)] for index in indexes]
    found = align.choose(
        align.side(contents[0], granularity, rows[0]), align.side(contents[1], granularity, rows[1]), request
    )
    # A miss costs a table of rows x rows cells to fill again: weighed as that many bytes.
    return st.cache.put(key, found, 64 * (1 + len(found.pairs)), cost=len(rows[0]) * len(rows[1]))


def matrix(st, ctx, experiment_id, index, kind, granularity):
    """Every column and aggregate of one run's ``kind``/``granularity`` layouts, as a ``merge.Matrix``."""
    parts, problems = st.parts(ctx, experiment_id, index, kind, granularity)
    return merge.matrix(parts, kind, granularity, problems)


def findings(st, ctx, experiment_id, run, thresholds=None):
    """``diagnose.find`` over one run's layer-level stats and checks: a list of ``finding.Finding``."""
    index = st.run(ctx, experiment_id, run)
    # The same data gives the same findings, and they cost a pass over the
    # whole matrix (seconds at 2,000 rows x 10,000 steps): the tab asks again
    # at every refresh, so they are kept until any tag of the run changes.
    key = ("findings", experiment_id, run, index.version(), repr(thresholds))
    hit = st.cache.get(key)
    if hit is not None:
        return hit
    # One computation per run at a time: requests that arrive meanwhile (a
    # second tab, a poll) wait for it and take its answer if the run did not change.
    with st.lock(("findings", experiment_id, run)):
        hit = st.cache.get(key)
        if hit is not None:
            return hit
        found = _find(st, ctx, experiment_id, index, run, thresholds)
        return st.cache.put(key, found, 2048 * (1 + len(found)), cost=index.read_bytes())


def _find(st, ctx, experiment_id, index, run, thresholds):
    layer = "layer"
    stats = checks = None
    if index.layouts(metadata.KIND_STATS, layer):
        stats = matrix(st, ctx, experiment_id, index, metadata.KIND_STATS, layer)
    if index.layouts(metadata.KIND_CHECK, layer):
        checks = matrix(st, ctx, experiment_id, index, metadata.KIND_CHECK, layer)
    return diagnose.find(
        run,
        stats,
        checks,
        thresholds,
        sparse_rows=index.sparse_rows(layer),
        outside_optimizer=index.outside_optimizer(layer),
        not_cleared_after=index.not_cleared_after(),
        labels=index.labels(layer),
        shapes=index.shapes(layer),
    )


def checks(st, ctx, experiment_id, run, granularity="layer"):
    """The body of ``GET checks``: the latest check of every row, its failures, and each row's record.

    ``failures`` are the mismatched rows of the latest check, in row order.
    """
    index = st.run(ctx, experiment_id, run)
    if not index.layouts(metadata.KIND_CHECK, granularity):
        raise NotFound(f"run {run!r} has no {granularity}-level gradient checks")
    m = matrix(st, ctx, experiment_id, index, metadata.KIND_CHECK, granularity)
    status, status_missing = m.slab("status")
    names = metadata.CHECK_STATUSES
    codes = np.where(status_missing, -1, np.nan_to_num(status, nan=-1)).astype(np.int64)
    latest = []
    if len(m.steps):
        for j, name in enumerate(m.rows):
            cell = {"name": name}
            for column in metadata.CHECK_COLUMNS:
                values, missing = m.slab(column)
                if column == "status":
                    cell[column] = None if codes[-1, j] < 0 else names[codes[-1, j]]
                elif column == "float64_recheck":
                    # Logs written before this column read as their own dtype's verdicts.
                    code = 0 if missing[-1, j] or not np.isfinite(values[-1, j]) else int(values[-1, j])
                    cell[column] = metadata.CHECK_RECHECKS[code] if cell["status"] is not None else None
                else:
                    cell[column] = None if missing[-1, j] else float(values[-1, j])
            latest.append(cell)
    mismatch = names.index("mismatch")
    history = []
    for j, name in enumerate(m.rows):
        column = codes[:, j]
        failed = np.nonzero(column == mismatch)[0]
        entry = {"name": name, "checks": int(np.sum(column >= 0))}
        entry.update({s: int(np.sum(column == i)) for i, s in enumerate(names)})
        entry["last_mismatch_step"] = int(m.steps[failed[-1]]) if len(failed) else None
        history.append(entry)
    return {
        "run": run,
        "granularity": granularity,
        "step": int(m.steps[-1]) if len(m.steps) else None,
        "rows": latest,
        "failures": [c for c in latest if c["status"] == "mismatch"],
        "history": history,
        "num_steps": int(len(m.steps)),
        "problems": [p.to_dict() for p in m.problems],
    }


def export(st, ctx, experiment_id, run, metric, granularity, aggregate, fmt):
    """``(body, filename)``: the unbinned matrix as CSV text or a JSON-able dict (``export.FORMATS``)."""
    heat = heatmap(st, ctx, experiment_id, run, metric, granularity, aggregate)
    body = to_csv(heat) if fmt == "csv" else to_json(heat)
    return body, filename(heat, fmt)
