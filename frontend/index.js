// Entry point of the Gradients tab: render() builds the UI into
// document.body and wires state, requests and events.
//
// TensorBoard loads this module from data/plugin_entry.html?name=gradients
// (document base plugin/gradients/) and calls render() once per page load.

import {
  HeatmapCanvas, TraceChart, formatValue, makeRatioScale, makeScale, parseHeatmap, plotHeight, ratioDecades, sharedPrefix, stepTicks,
  valueDomain,
} from './heatmap.js';
import {
  Api, KIND_LABELS, aggregatesOf, fetchJson, alignRows, evidenceItems, exportUrl, findingCells, findingKey, granularitiesWithMetric,
  layerHeadline, metricLabel, reconcileSelection, rowMarks, runsChanged, sortFindings, statusParts, stepRangeText,
  unionRows,
} from './model.js';
import {
  buildLayout, hideTooltip, labelColumnWidth, makeMeasure, markAbsentRows, renderFindings, renderLegend, renderRowLabels,
  renderRowMarks, renderStatus, renderTraceAxis, renderXAxis, setActiveRow, setOptions, setSegmented, showError, showProblems, showTooltip,
} from './views.js';
import {isTrackMetric} from './losstrack.js';
import {showLossScaleTrack} from './trackview.js';

const STORAGE_KEY = 'tb_gradcheck.selection';
const RESIZE_DEBOUNCE_MS = 150;
// Vertical room kept below the heatmap (x axis and a margin).
const BOTTOM_ROOM = 56;
// Room the second plot of a side-by-side view needs besides its cells
// (its title, x axis and the gap between the plots).
const SECOND_PLOT_ROOM = 78;
// How often `runs` is polled for new data while the tab is visible.
// TensorBoard's own reload button does not reach the iframe.
const POLL_MS = 15000;
// Height of the trace under the heatmap: at least MIN (the heatmap leaves
// that much room), at most MAX, else what the window has left.
const TRACE_MIN = 110;
const TRACE_MAX = 260;
const TRACE_GAP = 6;
// Trace colours of a finding's rows, by severity.
const SEVERITY_COLORS = {error: 'rgba(211, 47, 47, 0.85)', warning: 'rgba(239, 143, 0, 0.85)'};

function loadSaved() {
  try {
    return JSON.parse(window.localStorage.getItem(STORAGE_KEY) || '{}') || {};
  } catch (e) {
    return {};
  }
}

function save(sel, scale) {
  try {
    window.localStorage.setItem(STORAGE_KEY, JSON.stringify({...sel, scale}));
  } catch (e) {
    // Storage may be disabled (privacy mode); the selection just isn't kept.
  }
}

/** Builds the tab into document.body. Called once per page load. */
export function render() {
  const doc = document;
  const link = doc.createElement('link');
  link.rel = 'stylesheet';
  link.href = 'static/style.css';
  doc.head.append(link);
  doc.body.dataset.ready = '0';

  const ui = buildLayout(doc.body);
  const api = new Api();
  const measure = makeMeasure(doc);
  const saved = loadSaved();

  // A pane is one plot: its DOM, its canvas and the matrix it shows.
  const makePane = (plot, heat) => ({plot, heat, resp: null, grid: null, run: null});
  const main = makePane(ui.plot, new HeatmapCanvas(ui.plot.canvasWrap));
  const other = makePane(ui.otherPlot, new HeatmapCanvas(ui.otherPlot.canvasWrap, 'heatmap-other'));
  const panes = [main, other];
  main.trace = new TraceChart(ui.plot.traceWrap);

  const state = {
    runs: [],
    sel: null, // {run, metric, granularity, aggregate}
    scale: saved.scale === 'linear' ? 'linear' : 'log',
    compare: {other: null, mode: 'side'}, // other: run name or null
    scaleObj: null,
    layout: null, // {labelWidth, width, height, rowHeight, prefix, names}
    requestedWidth: 0,
    drawn: false,
    findings: {run: null, list: null, error: null, loading: false},
    activeKey: null, // findingKey of the finding whose cells are highlighted
    scrollToHighlight: false,
    loads: 0, // matrix requests made (tests check that a quiet poll makes none)
    polls: 0,
    ratioInfo: null, // {only_in_run, only_in_other} of the last compare answer
  };

  const setReady = (ready) => {
    doc.body.dataset.ready = ready ? '1' : '0';
    ui.app.classList.toggle('loading', !ready);
  };

  const runInfo = (name = state.sel && state.sel.run) => state.runs.find((r) => r.run === name) || null;

  // null (one run), 'side' or 'ratio'. A gradient check has no ratio (the
  // server answers 400), so check_error is always shown side by side.
  function compareMode() {
    const o = state.compare.other;
    if (!o || !state.sel || o === state.sel.run || !runInfo(o)) return null;
    if (state.compare.mode === 'ratio' && state.sel.metric !== 'check_error') return 'ratio';
    return 'side';
  }

  // --- layout ---------------------------------------------------------------

  // Lays out labels and sizes for a list of row names, before or after the
  // heatmap arrives (the runs route already lists the rows, so the request
  // can ask for exactly the pixel width the canvas will have).
  function computeLayout(names, mode) {
    const prefix = sharedPrefix(names);
    const shorts = names.map((n) => (prefix ? n.slice(prefix.length) : n));
    const total = ui.plot.root.clientWidth || doc.documentElement.clientWidth - 32;
    const labelWidth = labelColumnWidth(shorts, measure, Math.min(280, Math.max(90, total * 0.3)));
    const width = Math.max(50, total - labelWidth - 8);
    const rect = ui.plot.canvasWrap.getBoundingClientRect();
    const top = rect.top ? rect.top + window.scrollY : 140;
    let available = Math.max(120, window.innerHeight - top - BOTTOM_ROOM);
    if (mode === 'side') {
      available = Math.max(80, (available - SECOND_PLOT_ROOM) / 2);
      const {rowHeight, height} = plotHeight(names.length, available);
      return {prefix, labelWidth, width, height, rowHeight, names, traceHeight: 0};
    }
    // One heatmap: the trace gets what the rows leave of the window, except
    // when the findings sit under the plots (narrow windows): they come first.
    const {rowHeight, height} = plotHeight(names.length, Math.max(80, available - TRACE_MIN - TRACE_GAP));
    const stacked = window.getComputedStyle(ui.findings.root.parentElement).flexDirection === 'column';
    const room = stacked ? TRACE_MIN : available - height - TRACE_GAP;
    const traceHeight = Math.round(Math.min(TRACE_MAX, Math.max(TRACE_MIN, room)));
    return {prefix, labelWidth, width, height, rowHeight, names, traceHeight};
  }

  function applyLayout(layout) {
    state.layout = layout;
    for (const pane of panes) {
      const plot = pane.plot;
      plot.root.style.setProperty('--label-width', `${layout.labelWidth}px`);
      plot.canvasWrap.style.height = `${layout.height}px`;
      plot.prefix.textContent = layout.prefix;
      plot.prefix.title = layout.prefix ? `every row starts with ${layout.prefix}` : '';
      renderRowLabels(plot.labels, layout.names, layout.prefix, layout.rowHeight, layout.labelWidth, measure);
    }
    applyMarks();
  }

  // Rows the findings name get a mark beside their label, on the main pane.
  function applyMarks() {
    const layout = state.layout;
    if (!layout) return;
    const f = state.findings;
    const list = f.run === (main.run || (state.sel && state.sel.run)) ? f.list : null;
    renderRowMarks(main.plot.marks, rowMarks(list || [], layout.names), layout.rowHeight, layout.names.length);
    renderRowMarks(other.plot.marks, [], layout.rowHeight, layout.names.length);
  }

  function pixelWidth() {
    const w = state.layout ? state.layout.width : ui.plot.canvasWrap.clientWidth;
    return Math.max(1, Math.round(w * (window.devicePixelRatio || 1)));
  }

  // --- drawing --------------------------------------------------------------

  function draw() {
    const resp = main.resp;
    if (!resp || !main.grid) return;
    const mode = compareMode();
    const side = mode === 'side' && !!other.resp;
    const names = resp.layers;
    applyLayout(computeLayout(names, mode));
    const {width, height} = state.layout;
    const dpr = window.devicePixelRatio || 1;
    const shown = side ? [main, other] : [main];
    let scaleObj;
    let domainEmpty;
    if (mode === 'ratio') {
      scaleObj = makeRatioScale(ratioDecades(main.grid.values, main.grid.missing));
      domainEmpty = valueDomain(main.grid.values, main.grid.missing, 'log') === null;
    } else {
      // One colour scale for both runs, so equal colours mean equal values.
      let domain = null;
      for (const p of shown) {
        const d = valueDomain(p.grid.values, p.grid.missing, state.scale);
        if (d) domain = domain ? {min: Math.min(domain.min, d.min), max: Math.max(domain.max, d.max)} : d;
      }
      scaleObj = makeScale(state.scale, domain);
      domainEmpty = domain === null;
    }
    state.scaleObj = scaleObj;
    let anyDrawn = false;
    for (const p of shown) {
      const empty = p.grid.cols === 0 || p.grid.rows === 0;
      p.plot.noData.hidden = !empty;
      p.heat.canvas.hidden = empty;
      p.heat.overlay.hidden = empty;
      if (empty) {
        p.plot.canvasWrap.style.height = '80px';
        p.heat.setData(null, [], null);
        renderXAxis(p.plot.xAxis, [], width);
      } else {
        p.heat.draw(scaleObj, width, height, dpr);
        const ticks = stepTicks(p.resp.steps, p.resp.step_ends, Math.max(2, Math.floor(width / 90)));
        renderXAxis(p.plot.xAxis, ticks, width);
        anyDrawn = true;
      }
      markAbsentRows(p.plot.labels, p.resp.absent, p.run);
    }
    drawTrace(main.plot.noData.hidden && !main.heat.canvas.hidden, domainEmpty);
    // The loss-scale track (mixed precision), asked with the heatmap's own query so its columns are the heatmap's.
    const trackRun = resp.run;
    showLossScaleTrack(main.plot.canvasWrap, fetchJson, {run: resp.run, granularity: 'layer', width: pixelWidth(),
      reduce: resp.reduce}, runInfo().metrics || [], width, () => main.resp && main.resp.run === trackRun)
      .catch(() => {});
    if (!side) markAbsentRows(other.plot.labels, null, '');
    renderTitles(mode, side);
    const metric = metricLabel(resp.metric);
    if (mode === 'ratio') {
      renderLegend(ui.legend, scaleObj, {
        title: `ratio ${state.sel.run} \u00f7 ${state.compare.other}, ${resp.metric}`,
        showZero: true,
        noScale: !anyDrawn || domainEmpty,
        specials: scaleObj.specials,
        specialLabels: {nonfinite: 'NaN / \u00f7 0', missing: 'no value', zero: '0'},
        lowLabel: `${state.compare.other} larger`,
        highLabel: `${state.sel.run} larger`,
      });
    } else {
      renderLegend(ui.legend, scaleObj, {
        title: `${metric}${state.scale === 'log' ? ', log' : ''}${side ? ', both runs' : ''}`,
        showZero: state.scale === 'log',
        showMismatch: !!main.grid.status,
        noScale: !anyDrawn || domainEmpty,
      });
    }
    const drawnGrid = main.heat.binned || {cols: resp.steps.length, rows: names.length};
    const parts = statusParts(runInfo(), resp, drawnGrid);
    if (mode === 'ratio') parts.unshift({text: `${state.sel.run} \u00f7 ${state.compare.other} at the steps both have`, kind: 'info'});
    renderStatus(ui.status, parts);
    renderCompareNote(mode);
    state.drawn = anyDrawn;
    highlightActive();
    setReady(true);
  }

  // --- trace ----------------------------------------------------------------

  function drawTrace(drawn, noScale) {
    const layout = state.layout;
    const show = drawn && layout.traceHeight > 0;
    for (const p of panes) {
      const on = show && p === main;
      p.plot.traceAxis.hidden = !on;
      p.plot.traceWrap.hidden = !on;
    }
    if (!show) return;
    const h = layout.traceHeight;
    ui.plot.traceWrap.style.height = `${h}px`;
    main.trace.draw(main.grid, state.scaleObj, layout.width, h, window.devicePixelRatio || 1);
    renderTraceAxis(ui.plot.traceAxis, state.scaleObj, h, noScale);
    updateTrace(null);
  }

  // Emphasises the active finding's rows and the hovered row in the trace.
  function updateTrace(bin) {
    if (ui.plot.traceWrap.hidden || !main.resp) return;
    const f = activeFinding();
    const emphasis = [];
    if (f && state.findings.run === state.sel.run) {
      const color = SEVERITY_COLORS[f.severity] || SEVERITY_COLORS.warning;
      for (const r of findingCells(f, main.resp.layers).rows) emphasis.push({row: r, color});
    }
    main.trace.setEmphasis(emphasis, bin ? {row: bin.row0, col0: bin.col0, col1: bin.col1} : null);
    const cap = ui.plot.traceCaption;
    const names = main.resp.layers;
    const noun = main.resp.granularity === 'variable' ? 'variable' : 'layer';
    const what = compareMode() === 'ratio' ? 'ratio' : main.resp.metric;
    const strong = doc.createElement('span');
    strong.className = 'trace-row';
    if (bin) {
      strong.textContent = names[bin.row0];
      cap.replaceChildren(strong, doc.createTextNode(` \u00b7 ${what}`));
    } else if (emphasis.length) {
      strong.textContent = KIND_LABELS[f.kind] || f.kind;
      cap.replaceChildren(strong, doc.createTextNode(` \u00b7 ${emphasis.length} ${noun}${emphasis.length === 1 ? '' : 's'} in colour`));
    } else {
      const many = names.length > 64;
      cap.replaceChildren(doc.createTextNode(
        `${what} of ${many ? `${names.length.toLocaleString('en-US')} ${noun}s (median and range)` : `every ${noun}`}` +
        ' \u00b7 hover the heatmap to follow one'));
    }
  }

  function renderTitles(mode, side) {
    ui.plotTitle.hidden = !mode;
    ui.otherBox.hidden = mode !== 'side';
    if (mode === 'ratio') {
      ui.plotTitle.replaceChildren(titleText(`${state.sel.run} \u00f7 ${state.compare.other}`, 'ratio'));
    } else if (mode === 'side') {
      ui.plotTitle.replaceChildren(titleText(state.sel.run, 'run'));
      ui.otherTitle.replaceChildren(titleText(state.compare.other, 'compared run'));
    }
    ui.otherPlot.root.hidden = !side;
  }

  function titleText(name, what) {
    const span = doc.createElement('span');
    span.className = 'plot-title-name';
    span.textContent = name;
    const tag = doc.createElement('span');
    tag.className = 'plot-title-tag';
    tag.textContent = what;
    const box = doc.createElement('span');
    box.append(tag, span);
    return box;
  }

  // Rows only one run has: listed under the plots (ratio), or counted (side).
  function renderCompareNote(mode) {
    const note = ui.compareNote;
    const lines = [];
    if (mode === 'ratio' && state.ratioInfo) {
      const {only_in_run: a = [], only_in_other: b = []} = state.ratioInfo;
      if (a.length) lines.push(`Only in ${state.sel.run} (no ratio): ${a.join(', ')}`);
      if (b.length) lines.push(`Only in ${state.compare.other} (no ratio): ${b.join(', ')}`);
    } else if (mode === 'side' && other.resp) {
      const rows = main.resp.layers;
      const a = rows.filter((r, i) => other.resp.absent && other.resp.absent[i]);
      const b = rows.filter((r, i) => main.resp.absent && main.resp.absent[i]);
      if (a.length) lines.push(`Only in ${state.sel.run}: ${a.join(', ')}`);
      if (b.length) lines.push(`Only in ${state.compare.other}: ${b.join(', ')}`);
    }
    note.replaceChildren(...lines.map((t) => {
      const d = doc.createElement('div');
      d.textContent = t;
      return d;
    }));
    note.hidden = lines.length === 0;
  }

  // --- findings -------------------------------------------------------------

  function activeFinding() {
    const list = state.findings.list || [];
    return list.find((f) => findingKey(f) === state.activeKey) || null;
  }

  function renderFindingsPanel() {
    const f = state.findings;
    renderFindings(ui.findings, {
      run: f.run,
      findings: f.list,
      error: f.error,
      loading: f.loading,
      activeKey: state.activeKey,
      keyOf: findingKey,
      headline: layerHeadline,
      evidence: evidenceItems,
      kindLabel: (k) => KIND_LABELS[k] || k.replace(/_/g, ' '),
      stepText: stepRangeText,
    });
  }

  // Spotlights the active finding's cells on the main pane (its run's rows).
  function highlightActive() {
    const f = activeFinding();
    if (!f && state.activeKey && state.findings.list) state.activeKey = null;
    other.heat.highlightCells(null);
    if (!f || !main.resp || state.findings.run !== state.sel.run) {
      main.heat.highlightCells(null);
      updateTrace(null);
      return;
    }
    const cells = findingCells(f, main.resp.layers);
    main.heat.highlightCells(cells.rows, cells.ranges);
    updateTrace(null);
    if (state.scrollToHighlight && cells.rows.length) {
      state.scrollToHighlight = false;
      scrollRowsIntoView(Math.min(...cells.rows), Math.max(...cells.rows));
    }
  }

  function scrollRowsIntoView(first, last) {
    const layout = state.layout;
    if (!layout) return;
    const rect = main.plot.canvasWrap.getBoundingClientRect();
    const top = rect.top + first * layout.rowHeight;
    const bottom = rect.top + (last + 1) * layout.rowHeight;
    const margin = 24;
    if (top < margin) window.scrollBy({top: top - margin});
    else if (bottom > window.innerHeight - margin) {
      window.scrollBy({top: Math.min(top - margin, bottom - window.innerHeight + margin)});
    }
  }

  function toggleFinding(key) {
    if (state.activeKey === key) {
      clearFinding();
      return;
    }
    const f = (state.findings.list || []).find((x) => findingKey(x) === key);
    if (!f) return;
    state.activeKey = key;
    state.scrollToHighlight = true;
    renderFindingsPanel();
    // Show the heatmap the finding is about, when the run has it.
    const info = runInfo();
    const change = {};
    if (f.metric && info && (info.metrics || []).includes(f.metric) && f.metric !== state.sel.metric) change.metric = f.metric;
    const metric = change.metric || state.sel.metric;
    if (f.aggregate && aggregatesOf(info, metric).includes(f.aggregate) && f.aggregate !== state.sel.aggregate) {
      change.aggregate = f.aggregate;
    }
    if (Object.keys(change).length) select(change);
    else highlightActive();
  }

  function clearFinding() {
    if (!state.activeKey) return;
    state.activeKey = null;
    renderFindingsPanel();
    highlightActive();
  }

  ui.findings.list.addEventListener('click', (e) => {
    const b = e.target.closest('button.finding-main');
    if (b) toggleFinding(b.dataset.key);
  });
  doc.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') clearFinding();
  });

  async function loadFindings(run, quiet = false) {
    if (!run) return;
    const f = state.findings;
    if (f.run !== run) {
      state.findings = {run, list: null, error: null, loading: true};
      state.activeKey = null;
    } else if (!quiet) {
      f.loading = true;
    }
    renderFindingsPanel();
    let result;
    try {
      result = await api.findings(run);
    } catch (err) {
      if (state.findings.run !== run) return;
      state.findings = {run, list: state.findings.list, error: `Could not load findings: ${err.message}`, loading: false};
      renderFindingsPanel();
      return;
    }
    if (result.stale || state.findings.run !== run) return;
    const list = sortFindings((result.value && result.value.findings) || []);
    state.findings = {run, list, error: null, loading: false};
    renderFindingsPanel();
    applyMarks();
    highlightActive();
  }

  // --- controls -------------------------------------------------------------

  function syncControls() {
    const info = runInfo();
    const sel = state.sel;
    setOptions(ui.runSelect, state.runs.map((r) => ({value: r.run, label: r.run})), sel.run);
    // Track metrics (the loss scale) are drawn under the heatmap, not offered as heatmaps.
    const heatmapMetrics = (info.metrics || []).filter((m) => !isTrackMetric(m));
    setOptions(ui.metricSelect, heatmapMetrics.map((m) => ({value: m, label: metricLabel(m)})), sel.metric);
    // Granularities without the chosen metric (a check at layer level only) are disabled.
    setSegmented(ui.granularity, sel.granularity, granularitiesWithMetric(info, sel.metric));
    const aggs = aggregatesOf(info, sel.metric);
    ui.aggregateControl.hidden = aggs.length <= 1;
    setOptions(ui.aggregateSelect, aggs.map((a) => ({value: a, label: a})), sel.aggregate);
    const others = state.runs.filter((r) => r.run !== sel.run);
    if (state.compare.other && !others.some((r) => r.run === state.compare.other)) state.compare.other = null;
    setOptions(ui.compareSelect, [{value: '', label: 'none'}, ...others.map((r) => ({value: r.run, label: r.run}))],
      state.compare.other || '');
    ui.compareSelect.disabled = others.length === 0;
    const mode = compareMode();
    ui.compareModeControl.hidden = !state.compare.other;
    setSegmented(ui.compareMode, mode === 'ratio' ? 'ratio' : 'side', sel.metric === 'check_error' ? ['side'] : undefined);
    const ratioButton = ui.compareMode.querySelector('button[data-value="ratio"]');
    ratioButton.title = sel.metric === 'check_error' ? 'A gradient check has no ratio' : 'Colour by run \u00f7 compared run';
    // A ratio is always on a log scale centred at 1.
    setSegmented(ui.scale, mode === 'ratio' ? 'log' : state.scale, mode === 'ratio' ? ['log'] : undefined);
    showProblems(ui.problems, info.problems);
    for (const [a, fmt] of [[ui.download, 'csv'], [ui.downloadJson, 'json']]) {
      a.href = exportUrl(sel, fmt);
      a.title = `Download ${sel.run}'s ${sel.metric} matrix, unbinned, as ${fmt.toUpperCase()}`;
      a.hidden = false;
    }
  }

  function select(change) {
    const prevRun = state.sel && state.sel.run;
    state.sel = reconcileSelection(state.runs, {...state.sel, ...change});
    save(state.sel, state.scale);
    syncControls();
    loadView();
    if (state.sel.run !== prevRun) loadFindings(state.sel.run);
  }

  ui.runSelect.addEventListener('change', () => select({run: ui.runSelect.value}));
  ui.metricSelect.addEventListener('change', () => select({metric: ui.metricSelect.value}));
  ui.aggregateSelect.addEventListener('change', () => select({aggregate: ui.aggregateSelect.value}));
  ui.granularity.addEventListener('click', (e) => {
    const b = e.target.closest('button');
    if (b && !b.disabled && state.sel && b.dataset.value !== state.sel.granularity) select({granularity: b.dataset.value});
  });
  ui.scale.addEventListener('click', (e) => {
    const b = e.target.closest('button');
    if (!b || b.disabled || b.dataset.value === state.scale) return;
    state.scale = b.dataset.value;
    setSegmented(ui.scale, state.scale);
    if (state.sel) save(state.sel, state.scale);
    // Same data, new colours: no request.
    if (main.resp) draw();
  });
  ui.compareSelect.addEventListener('change', () => {
    state.compare.other = ui.compareSelect.value || null;
    syncControls();
    loadView();
  });
  ui.compareMode.addEventListener('click', (e) => {
    const b = e.target.closest('button');
    if (!b || b.disabled || b.dataset.value === state.compare.mode) return;
    state.compare.mode = b.dataset.value;
    syncControls();
    loadView();
  });
  ui.refresh.addEventListener('click', () => loadRuns());

  // --- loading --------------------------------------------------------------

  async function loadRuns() {
    setReady(false);
    let result;
    try {
      result = await api.runs();
    } catch (err) {
      showError(ui.error, `Could not load runs: ${err.message}`);
      setReady(true);
      return;
    }
    if (result.stale) return;
    const runs = (result.value && result.value.runs) || [];
    state.runs = runs;
    if (runs.length === 0) {
      showEmpty();
      return;
    }
    ui.empty.hidden = true;
    ui.view.hidden = false;
    ui.selectors.hidden = false;
    state.sel = reconcileSelection(runs, state.sel || saved);
    syncControls();
    loadFindings(state.sel.run, state.findings.run === state.sel.run);
    await loadView();
  }

  function showEmpty() {
    showError(ui.error, null);
    state.sel = null;
    for (const p of panes) {
      p.resp = null;
      p.grid = null;
    }
    state.drawn = false;
    api.heatmapChannel.cancel();
    api.otherChannel.cancel();
    api.findingsChannel.cancel();
    state.findings = {run: null, list: null, error: null, loading: false};
    ui.empty.hidden = false;
    ui.view.hidden = true;
    ui.selectors.hidden = true;
    ui.download.hidden = true;
    ui.downloadJson.hidden = true;
    showProblems(ui.problems, null);
    setReady(true);
  }

  // After a failed request: nothing stale stays on screen.
  function clearHeatmap() {
    for (const p of panes) {
      p.resp = null;
      p.grid = null;
      p.heat.setData(null, [], null);
    }
    state.drawn = false;
    ui.view.hidden = true;
  }

  // Rows the view will show, from the runs listing (before any matrix).
  function expectedRows(mode) {
    const g = (runInfo().granularities || {})[state.sel.granularity];
    let rows = (g && g.rows) || [];
    if (mode === 'side') {
      const og = ((runInfo(state.compare.other) || {}).granularities || {})[state.sel.granularity];
      rows = unionRows(rows, (og && og.rows) || []);
    }
    return rows;
  }

  function parsed(value) {
    return {value, grid: parseHeatmap(value)};
  }

  async function loadView() {
    const sel = state.sel;
    const info = runInfo();
    if (!sel || !info) return;
    if (!sel.metric) {
      // Every tag of this run is unreadable: nothing to ask the server for.
      hideTooltip(ui.tooltip);
      clearHeatmap();
      showError(ui.error, `Nothing in run ${sel.run} can be read; see the problems above.`);
      setReady(true);
      return;
    }
    setReady(false);
    hideTooltip(ui.tooltip);
    const mode = compareMode();
    const otherRun = state.compare.other;
    // Size the plot for the rows the run lists, so `width` is the canvas'
    // real pixel width and the server bins exactly to it.
    const rows = expectedRows(mode);
    if (rows.length) applyLayout(computeLayout(rows, mode));
    const width = pixelWidth();
    state.loads++;
    const mainReq = api.mainMatrix(mode === 'ratio' ? {...sel, other: otherRun, width} : {...sel, width});
    const otherReq = mode === 'side' ? api.otherHeatmap({...sel, run: otherRun, width}) : null;
    if (!otherReq) api.otherChannel.cancel();
    const [mainRes, otherRes] = await Promise.allSettled([mainReq, otherReq || Promise.resolve(null)]);
    if (mainRes.status === 'fulfilled' && mainRes.value.stale) return;
    if (otherRes.status === 'fulfilled' && otherRes.value && otherRes.value.stale) return;
    if (mainRes.status === 'rejected') {
      const what = mode === 'ratio' ? `the ratio ${sel.run} \u00f7 ${otherRun}` : 'the heatmap';
      showError(ui.error, `Could not load ${what}: ${mainRes.reason.message}`);
      clearHeatmap();
      setReady(true);
      return;
    }
    let mainResp = mainRes.value.value;
    let otherResp = null;
    let otherError = null;
    if (otherReq) {
      if (otherRes.status === 'rejected') otherError = `Could not load ${otherRun}: ${otherRes.reason.message}`;
      else otherResp = otherRes.value.value;
    }
    let mainParsed;
    let otherParsed = null;
    try {
      if (otherResp) {
        const union = unionRows(mainResp.layers, otherResp.layers);
        mainResp = alignRows(mainResp, union);
        otherResp = alignRows(otherResp, union);
        otherParsed = parsed(otherResp);
      }
      mainParsed = parsed(mainResp);
    } catch (err) {
      showError(ui.error, `The heatmap answer is malformed: ${err.message}`);
      clearHeatmap();
      setReady(true);
      return;
    }
    showError(ui.error, null);
    showError(ui.otherError, otherError);
    ui.view.hidden = false;
    state.requestedWidth = width;
    state.ratioInfo = mode === 'ratio' ? {only_in_run: mainResp.only_in_run, only_in_other: mainResp.only_in_other} : null;
    main.resp = mainParsed.value;
    main.grid = mainParsed.grid;
    main.run = sel.run;
    main.heat.setData(main.grid, main.resp.steps, main.resp.step_ends);
    other.resp = otherParsed ? otherParsed.value : null;
    other.grid = otherParsed ? otherParsed.grid : null;
    other.run = otherParsed ? otherRun : null;
    other.heat.setData(other.grid, other.resp ? other.resp.steps : [], other.resp ? other.resp.step_ends : null);
    draw();
  }

  // --- live refresh -----------------------------------------------------------

  // Polls `runs`; refetches the matrix and the findings only when a shown
  // run's last_write changed. The selection, compare choice and highlighted
  // finding are kept (reconcileSelection keeps whatever is still valid).
  async function poll() {
    if (!state.sel) return loadRuns();
    state.polls++;
    let result;
    try {
      result = await api.runs();
    } catch (err) {
      return; // a failed poll says nothing new; the next one may work
    }
    if (result.stale) return;
    const runs = (result.value && result.value.runs) || [];
    if (runs.length === 0) {
      state.runs = runs;
      showEmpty();
      return;
    }
    const shown = [state.sel.run, compareMode() ? state.compare.other : null];
    const changed = runsChanged(state.runs, runs, shown);
    const listChanged = runs.map((r) => r.run).join('\n') !== state.runs.map((r) => r.run).join('\n');
    state.runs = runs;
    const prev = state.sel;
    state.sel = reconcileSelection(runs, prev);
    const selChanged = JSON.stringify(prev) !== JSON.stringify(state.sel);
    if (changed || listChanged || selChanged) syncControls();
    if (changed || selChanged) {
      loadFindings(state.sel.run, true);
      await loadView();
    }
  }

  let pollTimer = 0;
  function schedulePoll() {
    window.clearTimeout(pollTimer);
    pollTimer = window.setTimeout(async () => {
      if (doc.visibilityState === 'visible') {
        try {
          await poll();
        } catch (e) {
          // keep polling
        }
      }
      schedulePoll();
    }, POLL_MS);
  }
  let hiddenSince = 0;
  doc.addEventListener('visibilitychange', () => {
    if (doc.visibilityState === 'hidden') {
      hiddenSince = Date.now();
    } else if (hiddenSince && Date.now() - hiddenSince > POLL_MS) {
      // Back after a while: look for new data now, not in up to 15 s.
      hiddenSince = 0;
      poll().catch(() => {});
      schedulePoll();
    }
  });

  // --- hover ----------------------------------------------------------------

  // Everything the tooltip needs about the cell under a point, or null.
  function cellInfo(pane, clientX, clientY) {
    const heat = pane.heat;
    if (!pane.resp || !heat.binned || heat.canvas.hidden || heat.canvas.offsetParent === null) return null;
    const rect = heat.canvas.getBoundingClientRect();
    const bin = heat.binAt(clientX - rect.left, clientY - rect.top);
    if (!bin) return null;
    const resp = pane.resp;
    const ends = resp.step_ends;
    const step = resp.steps[bin.col0];
    const stepEnd = ends ? ends[bin.col1] : resp.steps[bin.col1];
    const ratio = pane === main && compareMode() === 'ratio';
    return {
      pane,
      run: ratio ? `${state.sel.run} \u00f7 ${state.compare.other}` : pane.run,
      ratio,
      absent: !!(resp.absent && resp.absent[bin.row0] && bin.row1 === bin.row0),
      row: bin.row0,
      rowEnd: bin.row1,
      rowName: resp.layers[bin.row0],
      rowEndName: resp.layers[bin.row1],
      step,
      stepEnd,
      value: bin.value,
      valueText: formatValue(bin.value),
      status: bin.status,
      bin,
    };
  }

  function tooltipRows(c) {
    const resp = c.pane.resp;
    const noun = resp.granularity === 'variable' ? 'variable' : 'layer';
    const rows = [[c.ratio ? 'runs' : 'run', c.run]];
    if (c.rowEnd > c.row) {
      rows.push([`${noun}s`, `${c.rowName} \u2026 ${c.rowEndName} (${c.rowEnd - c.row + 1}, max)`]);
    } else {
      rows.push([noun, c.rowName]);
    }
    rows.push(c.stepEnd !== c.step ? ['steps', `${c.step}\u2013${c.stepEnd}`] : ['step', String(c.step)]);
    const binned = c.stepEnd !== c.step || c.rowEnd > c.row;
    const reduce = resp.reduce || 'max';
    let cls = '';
    if (c.value === null) cls = 'tip-missing';
    else if (!Number.isFinite(c.value)) cls = 'tip-bad';
    const key = c.ratio ? `ratio (${resp.metric})` : resp.metric;
    let text = c.valueText;
    if (c.absent) text = `no such ${noun} in ${c.pane.run}`;
    else if (c.ratio && c.value === null) text = 'no value in one of the runs';
    else if (c.ratio && Number.isFinite(c.value)) text = `${c.valueText}\u00d7`;
    rows.push([binned ? `${key} (${reduce})` : key, text, cls]);
    if (resp.aggregate && resp.aggregate !== 'last') rows.push(['aggregate', resp.aggregate]);
    if (c.pane.grid.status) rows.push(['check', c.status || 'not checked', c.status === 'mismatch' ? 'tip-bad' : '']);
    return rows;
  }

  function setActiveRows(row) {
    for (const p of panes) setActiveRow(p.plot.labels, row);
  }

  // One tooltip update per frame at most, whatever the mouse event rate.
  let pending = null;
  let scheduled = false;
  let lastKey = '';
  function onMove(pane, e) {
    pending = {pane, x: e.clientX, y: e.clientY};
    if (scheduled) return;
    scheduled = true;
    window.requestAnimationFrame(() => {
      scheduled = false;
      const p = pending;
      pending = null;
      if (!p) return;
      const c = cellInfo(p.pane, p.x, p.y);
      if (!c) {
        leave(p.pane);
        return;
      }
      const key = `${panes.indexOf(p.pane)},${c.bin.binRow},${c.bin.binCol}`;
      if (key !== lastKey) {
        for (const q of panes) if (q !== p.pane) q.heat.setHover(null);
        p.pane.heat.setHover(c.bin);
        setActiveRows(c.row);
        updateTrace(p.pane === main ? c.bin : null);
        lastKey = key;
      }
      showTooltip(ui.tooltip, tooltipRows(c), p.x, p.y);
    });
  }
  function leave(pane) {
    pending = null;
    lastKey = '';
    hideTooltip(ui.tooltip);
    pane.heat.setHover(null);
    setActiveRows(null);
    updateTrace(null);
  }
  for (const pane of panes) {
    pane.heat.overlay.addEventListener('mousemove', (e) => onMove(pane, e));
    pane.heat.overlay.addEventListener('mouseleave', () => leave(pane));
  }

  // --- resize ---------------------------------------------------------------

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(() => {
      if (!main.resp) return;
      draw();
      // Server bins were made for a narrower canvas: ask again for more.
      const binned = Array.isArray(main.resp.step_ends) || (other.resp && Array.isArray(other.resp.step_ends));
      if (binned && pixelWidth() > state.requestedWidth * 1.1) loadView();
    }, RESIZE_DEBOUNCE_MS);
  });

  // --- debug hook for browser tests and benchmarks (read-only, plus poll) ----

  window.tbGradcheck = Object.freeze({
    state() {
      const sel = state.sel || {};
      const resp = main.resp;
      const f = activeFinding();
      const rows = resp ? resp.layers : [];
      return {
        run: sel.run ?? null,
        metric: sel.metric ?? null,
        granularity: sel.granularity ?? null,
        aggregate: sel.aggregate ?? null,
        scale: compareMode() === 'ratio' ? 'ratio' : state.scale,
        rows: rows.slice(),
        // Steps the heatmap covers (num_steps), and the columns it came in
        // (fewer when the server binned them to the canvas width).
        steps: resp ? (resp.num_steps ?? resp.steps.length) : 0,
        columns: resp ? resp.steps.length : 0,
        drawn: state.drawn,
        compare: {other: compareMode() ? state.compare.other : null, mode: compareMode()},
        otherRows: other.resp && compareMode() === 'side' ? other.resp.layers.slice() : [],
        findings: state.findings.list ? state.findings.list.map((x) => ({kind: x.kind, severity: x.severity, layers: x.layers.slice()})) : null,
        findingsRun: state.findings.run,
        activeFinding: f ? f.kind : null,
        // Highlighted cells: [row name, first step, last step] per run of cells.
        highlight: main.heat.highlightedCells().map(([r, c0, c1]) => [
          rows[r], resp.steps[c0], resp.step_ends ? resp.step_ends[c1] : resp.steps[c1],
        ]),
        loads: state.loads,
        polls: state.polls,
      };
    },
    lastDrawMs() {
      return main.heat.lastDrawMs;
    },
    cellAt(clientX, clientY) {
      for (const pane of panes) {
        const c = cellInfo(pane, clientX, clientY);
        if (!c) continue;
        return {
          run: c.run, row: c.row, rowName: c.rowName, step: c.step, value: c.value,
          rowEnd: c.rowEnd, stepEnd: c.stepEnd, valueText: c.valueText, status: c.status,
        };
      }
      return null;
    },
    /** Polls `runs` now, as the 15 s timer does; resolves when done. */
    poll() {
      return poll();
    },
  });

  loadRuns();
  schedulePoll();
}
