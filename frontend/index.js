// Entry point of the Gradients tab: render() builds the UI into
// document.body and wires state, requests and events.
//
// TensorBoard loads this module from data/plugin_entry.html?name=gradients
// (document base plugin/gradients/) and calls render() once per page load.

import {HeatmapCanvas, formatValue, makeScale, parseHeatmap, plotHeight, sharedPrefix, stepTicks, valueDomain} from './heatmap.js';
import {Api, aggregatesOf, exportUrl, metricLabel, reconcileSelection, statusParts} from './model.js';
import {
  buildLayout, hideTooltip, labelColumnWidth, makeMeasure, renderLegend, renderRowLabels, renderStatus,
  renderXAxis, setActiveRow, setOptions, setSegmented, showError, showProblems, showTooltip,
} from './views.js';

const STORAGE_KEY = 'tb_gradcheck.selection';
const RESIZE_DEBOUNCE_MS = 150;
// Vertical room kept below the heatmap (x axis and a margin).
const BOTTOM_ROOM = 56;

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
  const heat = new HeatmapCanvas(ui.plot.canvasWrap);
  const api = new Api();
  const measure = makeMeasure(doc);
  const saved = loadSaved();

  const state = {
    runs: [],
    sel: null, // {run, metric, granularity, aggregate}
    scale: saved.scale === 'linear' ? 'linear' : 'log',
    resp: null,
    grid: null,
    scaleObj: null,
    layout: null, // {labelWidth, width, height, rowHeight, prefix}
    requestedWidth: 0,
    drawn: false,
  };

  const setReady = (ready) => {
    doc.body.dataset.ready = ready ? '1' : '0';
    ui.app.classList.toggle('loading', !ready);
  };

  const runInfo = () => (state.sel ? state.runs.find((r) => r.run === state.sel.run) : null);

  // --- layout ---------------------------------------------------------------

  // Lays out labels and sizes for a list of row names, before or after the
  // heatmap arrives (the runs route already lists the rows, so the request
  // can ask for exactly the pixel width the canvas will have).
  function computeLayout(names) {
    const prefix = sharedPrefix(names);
    const shorts = names.map((n) => (prefix ? n.slice(prefix.length) : n));
    const total = ui.plot.root.clientWidth || doc.documentElement.clientWidth - 32;
    const labelWidth = labelColumnWidth(shorts, measure, Math.min(280, Math.max(90, total * 0.3)));
    const width = Math.max(50, total - labelWidth - 8);
    const rect = ui.plot.canvasWrap.getBoundingClientRect();
    const top = rect.top ? rect.top + window.scrollY : 140;
    const available = Math.max(120, window.innerHeight - top - BOTTOM_ROOM);
    const {rowHeight, height} = plotHeight(names.length, available);
    return {prefix, labelWidth, width, height, rowHeight, names};
  }

  function applyLayout(layout) {
    state.layout = layout;
    ui.plot.root.style.setProperty('--label-width', `${layout.labelWidth}px`);
    ui.plot.canvasWrap.style.height = `${layout.height}px`;
    ui.plot.prefix.textContent = layout.prefix;
    ui.plot.prefix.title = layout.prefix ? `every row starts with ${layout.prefix}` : '';
    renderRowLabels(ui.plot.labels, layout.names, layout.prefix, layout.rowHeight, layout.labelWidth, measure);
  }

  function pixelWidth() {
    const w = state.layout ? state.layout.width : ui.plot.canvasWrap.clientWidth;
    return Math.max(1, Math.round(w * (window.devicePixelRatio || 1)));
  }

  // --- drawing --------------------------------------------------------------

  function draw() {
    const resp = state.resp;
    if (!resp || !state.grid) return;
    const names = resp.layers;
    applyLayout(computeLayout(names));
    const {width, height} = state.layout;
    const empty = state.grid.cols === 0 || state.grid.rows === 0;
    ui.plot.noData.hidden = !empty;
    heat.canvas.hidden = empty;
    heat.overlay.hidden = empty;
    const domain = valueDomain(state.grid.values, state.grid.missing, state.scale);
    state.scaleObj = makeScale(state.scale, domain);
    if (empty) {
      ui.plot.canvasWrap.style.height = '80px';
      heat.setData(null, [], null);
      renderXAxis(ui.plot.xAxis, [], width);
    } else {
      heat.draw(state.scaleObj, width, height, window.devicePixelRatio || 1);
      renderXAxis(ui.plot.xAxis, stepTicks(resp.steps, resp.step_ends, Math.max(2, Math.floor(width / 90))), width);
    }
    renderLegend(ui.legend, state.scaleObj, {
      title: `${metricLabel(resp.metric)}${state.scale === 'log' ? ', log' : ''}`,
      showZero: state.scale === 'log',
      showMismatch: !!state.grid.status,
      noScale: empty || domain === null,
    });
    const drawnGrid = heat.binned || {cols: resp.steps.length, rows: names.length};
    renderStatus(ui.status, statusParts(runInfo(), resp, drawnGrid));
    state.drawn = !empty;
    setReady(true);
  }

  // --- controls -------------------------------------------------------------

  function syncControls() {
    const info = runInfo();
    const sel = state.sel;
    setOptions(ui.runSelect, state.runs.map((r) => ({value: r.run, label: r.run})), sel.run);
    setOptions(ui.metricSelect, (info.metrics || []).map((m) => ({value: m, label: metricLabel(m)})), sel.metric);
    setSegmented(ui.granularity, sel.granularity, Object.keys(info.granularities || {}));
    setSegmented(ui.scale, state.scale);
    const aggs = aggregatesOf(info, sel.metric);
    ui.aggregateControl.hidden = aggs.length <= 1;
    setOptions(ui.aggregateSelect, aggs.map((a) => ({value: a, label: a})), sel.aggregate);
    showProblems(ui.problems, info.problems);
    ui.download.href = exportUrl(sel, 'csv');
    ui.download.hidden = false;
  }

  function select(change) {
    state.sel = reconcileSelection(state.runs, {...state.sel, ...change});
    save(state.sel, state.scale);
    syncControls();
    loadHeatmap();
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
    if (!b || b.dataset.value === state.scale) return;
    state.scale = b.dataset.value;
    setSegmented(ui.scale, state.scale);
    if (state.sel) save(state.sel, state.scale);
    // Same data, new colours: no request.
    if (state.resp) draw();
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
      showError(ui.error, null);
      state.sel = null;
      state.resp = null;
      state.grid = null;
      state.drawn = false;
      api.heatmapChannel.cancel();
      ui.empty.hidden = false;
      ui.view.hidden = true;
      ui.selectors.hidden = true;
      ui.download.hidden = true;
      showProblems(ui.problems, null);
      setReady(true);
      return;
    }
    ui.empty.hidden = true;
    ui.view.hidden = false;
    ui.selectors.hidden = false;
    state.sel = reconcileSelection(runs, state.sel || saved);
    syncControls();
    await loadHeatmap();
  }

  // After a failed request: nothing stale stays on screen.
  function clearHeatmap() {
    state.resp = null;
    state.grid = null;
    state.drawn = false;
    heat.setData(null, [], null);
    ui.view.hidden = true;
  }

  async function loadHeatmap() {
    const sel = state.sel;
    const info = runInfo();
    if (!sel || !info) return;
    setReady(false);
    hideTooltip(ui.tooltip);
    // Size the plot for the rows the run lists, so `width` is the canvas'
    // real pixel width and the server bins exactly to it.
    const g = (info.granularities || {})[sel.granularity];
    if (g && g.rows) applyLayout(computeLayout(g.rows));
    const width = pixelWidth();
    let result;
    try {
      result = await api.heatmap({...sel, width});
    } catch (err) {
      showError(ui.error, `Could not load the heatmap: ${err.message}`);
      clearHeatmap();
      setReady(true);
      return;
    }
    if (result.stale) return;
    let grid;
    try {
      grid = parseHeatmap(result.value);
    } catch (err) {
      showError(ui.error, `The heatmap answer is malformed: ${err.message}`);
      clearHeatmap();
      setReady(true);
      return;
    }
    showError(ui.error, null);
    ui.view.hidden = false;
    state.requestedWidth = width;
    state.resp = result.value;
    state.grid = grid;
    heat.setData(grid, result.value.steps, result.value.step_ends);
    draw();
  }

  // --- hover ----------------------------------------------------------------

  // Everything the tooltip needs about the cell under a point, or null.
  function cellInfo(clientX, clientY) {
    if (!state.resp || !heat.binned || heat.canvas.hidden) return null;
    const rect = heat.canvas.getBoundingClientRect();
    const bin = heat.binAt(clientX - rect.left, clientY - rect.top);
    if (!bin) return null;
    const resp = state.resp;
    const ends = resp.step_ends;
    const step = resp.steps[bin.col0];
    const stepEnd = ends ? ends[bin.col1] : resp.steps[bin.col1];
    return {
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
    const resp = state.resp;
    const noun = resp.granularity === 'variable' ? 'variable' : 'layer';
    const rows = [['run', resp.run]];
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
    rows.push([binned ? `${resp.metric} (${reduce})` : resp.metric, c.valueText, cls]);
    if (resp.aggregate && resp.aggregate !== 'last') rows.push(['aggregate', resp.aggregate]);
    if (state.grid.status) rows.push(['check', c.status || 'not checked', c.status === 'mismatch' ? 'tip-bad' : '']);
    return rows;
  }

  // One tooltip update per frame at most, whatever the mouse event rate.
  let pending = null;
  let scheduled = false;
  let lastKey = '';
  heat.overlay.addEventListener('mousemove', (e) => {
    pending = {x: e.clientX, y: e.clientY};
    if (scheduled) return;
    scheduled = true;
    window.requestAnimationFrame(() => {
      scheduled = false;
      const p = pending;
      pending = null;
      if (!p) return;
      const c = cellInfo(p.x, p.y);
      if (!c) {
        hideTooltip(ui.tooltip);
        heat.setHover(null);
        setActiveRow(ui.plot.labels, null);
        lastKey = '';
        return;
      }
      const key = `${c.bin.binRow},${c.bin.binCol}`;
      if (key !== lastKey) {
        heat.setHover(c.bin);
        setActiveRow(ui.plot.labels, c.row);
        lastKey = key;
      }
      showTooltip(ui.tooltip, tooltipRows(c), p.x, p.y);
    });
  });
  heat.overlay.addEventListener('mouseleave', () => {
    pending = null;
    lastKey = '';
    hideTooltip(ui.tooltip);
    heat.setHover(null);
    setActiveRow(ui.plot.labels, null);
  });

  // --- resize ---------------------------------------------------------------

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(() => {
      if (!state.resp) return;
      draw();
      // Server bins were made for a narrower canvas: ask again for more.
      const binned = Array.isArray(state.resp.step_ends);
      if (binned && pixelWidth() > state.requestedWidth * 1.1) loadHeatmap();
    }, RESIZE_DEBOUNCE_MS);
  });

  // --- debug hook for browser tests and benchmarks (read-only) --------------

  window.tbGradcheck = Object.freeze({
    state() {
      const sel = state.sel || {};
      return {
        run: sel.run ?? null,
        metric: sel.metric ?? null,
        granularity: sel.granularity ?? null,
        aggregate: sel.aggregate ?? null,
        scale: state.scale,
        rows: state.resp ? state.resp.layers.slice() : [],
        // Steps the heatmap covers (num_steps), and the columns it came in
        // (fewer when the server binned them to the canvas width).
        steps: state.resp ? (state.resp.num_steps ?? state.resp.steps.length) : 0,
        columns: state.resp ? state.resp.steps.length : 0,
        drawn: state.drawn,
      };
    },
    lastDrawMs() {
      return heat.lastDrawMs;
    },
    cellAt(clientX, clientY) {
      const c = cellInfo(clientX, clientY);
      if (!c) return null;
      return {
        row: c.row, rowName: c.rowName, step: c.step, value: c.value,
        rowEnd: c.rowEnd, stepEnd: c.stepEnd, valueText: c.valueText, status: c.status,
      };
    },
  });

  loadRuns();
}
