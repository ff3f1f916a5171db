// Entry point and controller of the Gradients tab. TensorBoard loads this
// module from data/plugin_entry.html?name=gradients (document base
// plugin/gradients/) and calls render() once per page load.
//
// The controller owns the state and calls the rest; frontend/README.md draws
// the module map and the path from a response to a pixel. Pure modules
// (wire, colour, axes, rows, format, findings, compare, selection, api) touch
// no DOM; the DOM modules (controls, views, panel, heatmap, chart, theme)
// import pure ones, never the reverse.

import {alignUrl, Api, checksUrl, compareUrl, fetchJson, heatmapUrl} from './api.js';
import {stepAxis} from './axes.js';
import {LineChart} from './chart.js';
import {alignmentOf, alignRows} from './compare.js';
import {buildLayout, setSegmented, showControls, wireRowbar} from './controls.js';
import {makeMeasure} from './dom.js';
import {findingKey, runNeedingAttention} from './findings.js';
import {makeFindingsLoader} from './findingsload.js';
import {HeatmapCanvas} from './heatmap.js';
import {makePainter} from './paint.js';
import {showLossScaleTrack} from './trackview.js';
import {wirePointer} from './pointer.js';
import {buildPlan, groupRows} from './rows.js';
import {aggregatesOf, reconcileSelection, runsChanged} from './selection.js';
import {followTheme} from './theme.js';
import {debugHook} from './hook.js';
import {hideTooltip, showError, showProblems} from './views.js';
import {decodeHeatmap, pickRows} from './wire.js';
// Modules only other modules import, named here too so the browser asks for
// every module as soon as it has parsed this one: otherwise each level of
// imports (index -> controls -> panel -> findings -> format -> rows) is one
// more round trip through TensorBoard's plugin route before the tab can run.
import './colour.js';
import './format.js';
import './losstrack.js';
import './panel.js';
import './tooltip.js';

const STORAGE_KEY = 'tb_gradcheck.selection';
const POLL_MS = 15000; // TensorBoard's reload button does not reach the iframe
const OPENING_WAIT_MS = 8000;

function loadSaved() {
  try {
    return JSON.parse(window.localStorage.getItem(STORAGE_KEY) || '{}') || {};
  } catch (e) {
    return {};
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
  const pane = (plot, id) => ({plot, heat: new HeatmapCanvas(plot.canvasWrap, id), resp: null, grid: null, axis: null, run: null, names: null, labels: null});
  const main = pane(ui.plot, 'heatmap');
  const other = pane(ui.otherPlot, 'heatmap-other');
  const chart = new LineChart(ui.plot.traceWrap);
  const st = {
    runs: [], sel: null, scale: saved.scale === 'linear' ? 'linear' : 'log',
    compare: {other: null, mode: 'side', align: null}, alignment: null,
    findings: {run: null, list: null, error: null}, findingsByRun: new Map(), activeKey: null,
    rows: {collapsed: new Set(), filter: '', zoom: null}, names: [], groups: [], plan: null, layout: null,
    checks: null, timing: null, lastPaintMs: 0, scaleObj: null, allZero: false, drawn: false, loads: 0, polls: 0,
  };
  const info = (name = st.sel && st.sel.run) => st.runs.find((r) => r.run === name) || null;
  const setReady = (ready) => {
    doc.body.dataset.ready = ready ? '1' : '0';
    ui.app.classList.toggle('loading', !ready);
  };
  const dark = followTheme(doc, (isDark) => {
    main.heat.dark = other.heat.dark = chart.dark = isDark;
    if (main.grid) draw();
  });

  // null (one run), 'side' or 'ratio'; a gradient check has no ratio.
  function compareMode() {
    const o = st.compare.other;
    if (!o || !st.sel || o === st.sel.run || !info(o)) return null;
    return st.compare.mode === 'ratio' && st.sel.metric !== 'check_error' ? 'ratio' : 'side';
  }

  const painter = makePainter({doc, ui, st, main, other, chart, measure, compareMode, info, activeFinding: () => activeFinding(), setReady});
  const {draw, updateChart, applyMarks, highlightActive, renderAlignNote} = painter;

  // --- rows: groups, filter, zoom ---------------------------------------------

  function replan() {
    const z = st.rows.zoom;
    st.plan = buildPlan(st.names, st.groups, {collapsed: st.rows.collapsed, filter: st.rows.filter, range: z ? z.rows : null});
  }

  const changeRows = (change) => {
    change(st.rows);
    replan();
    draw();
  };
  wireRowbar(ui, [main.plot.labels, other.plot.labels], {
    filter: (text) => changeRows((r) => { r.filter = text; }),
    collapseAll: () => changeRows((r) => { r.collapsed = new Set(st.groups.map((g) => g.key)); }),
    expandAll: () => changeRows((r) => { r.collapsed = new Set(); }),
    resetZoom: () => zoomTo(null),
    toggleGroup: (key) => changeRows((r) => { if (!r.collapsed.delete(key)) r.collapsed.add(key); }),
  });

  function zoomTo(zoom) {
    const stepsChanged = JSON.stringify((st.rows.zoom || {}).steps || null) !== JSON.stringify((zoom || {}).steps || null);
    st.rows.zoom = zoom;
    replan();
    if (stepsChanged) loadView();
    else draw();
  }

  // --- findings ---------------------------------------------------------------

  const activeFinding = () => (st.findings.list || []).find((f) => findingKey(f) === st.activeKey) || null;
  // Findings are asked for after the heatmap (see loadView), one request per run at a time.
  const findingsView = makeFindingsLoader({
    st, api, ui,
    onShown: () => main.grid && highlightActive(),
    onLoaded: () => {
      if (!main.grid) return;
      applyMarks();
      highlightActive();
    },
  });

  function toggleFinding(key) {
    if (st.activeKey === key) return clearFinding();
    const f = (st.findings.list || []).find((x) => findingKey(x) === key);
    if (!f) return;
    st.activeKey = key;
    // The finding's rows must be on screen: drop a filter or zoom that hides them.
    if (st.rows.filter || st.rows.zoom) {
      st.rows.filter = ui.rowbar.filter.value = '';
      st.rows.zoom = null;
      replan();
    }
    findingsView.renderPanel();
    const change = {};
    if (f.metric && (info().metrics || []).includes(f.metric) && f.metric !== st.sel.metric) change.metric = f.metric;
    const metric = change.metric || st.sel.metric;
    if (f.aggregate && aggregatesOf(info(), metric).includes(f.aggregate) && f.aggregate !== st.sel.aggregate) change.aggregate = f.aggregate;
    if (Object.keys(change).length) select(change);
    else if (main.grid) draw();
  }

  function clearFinding() {
    if (!st.activeKey) return;
    st.activeKey = null;
    findingsView.renderPanel();
    highlightActive();
  }

  ui.findings.list.addEventListener('click', (e) => {
    const b = e.target.closest('button.finding-main');
    if (b) toggleFinding(b.dataset.key);
  });
  doc.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') clearFinding();
  });

  // --- controls ---------------------------------------------------------------

  function syncControls() {
    if (st.compare.other && (st.compare.other === st.sel.run || !info(st.compare.other))) st.compare.other = null;
    const mode = compareMode();
    if (!mode) st.alignment = null; // else the server's answer, set by loadView
    showControls(ui, st, info(), mode);
  }

  function save() {
    try {
      window.localStorage.setItem(STORAGE_KEY, JSON.stringify({...st.sel, scale: st.scale}));
    } catch (e) {
      // Storage may be disabled; the selection just isn't kept.
    }
  }

  function select(change) {
    const prevRun = st.sel && st.sel.run;
    const next = {...st.sel, ...change};
    // Another run opens on its own default aggregate (max of a window), not on this one's.
    if (change.run && change.run !== prevRun) next.aggregate = null;
    st.sel = reconcileSelection(st.runs, next);
    if (change.run || change.granularity || change.metric) st.rows.zoom = null;
    save();
    syncControls();
    const run = st.sel.run;
    if (run !== prevRun) findingsView.show(run);
    loadView(run !== prevRun ? findingsView.after(run) : null);
  }

  const segmentedValue = (e) => {
    const b = e.target.closest('button');
    return b && !b.disabled ? b.dataset.value : null;
  };
  ui.runSelect.addEventListener('change', () => select({run: ui.runSelect.value}));
  ui.metricSelect.addEventListener('change', () => select({metric: ui.metricSelect.value}));
  ui.aggregateSelect.addEventListener('change', () => select({aggregate: ui.aggregateSelect.value}));
  ui.granularity.addEventListener('click', (e) => {
    const v = segmentedValue(e);
    if (v && v !== st.sel.granularity) select({granularity: v});
  });
  ui.scale.addEventListener('click', (e) => {
    const v = segmentedValue(e);
    if (!v || v === st.scale) return;
    st.scale = v;
    setSegmented(ui.scale, v);
    save();
    if (main.grid) draw(); // same data, new colours: no request
  });
  ui.compareSelect.addEventListener('change', () => {
    st.compare.other = ui.compareSelect.value || null;
    st.compare.align = null;
    syncControls();
    loadView();
  });
  ui.compareMode.addEventListener('click', (e) => {
    const v = segmentedValue(e);
    if (!v || v === st.compare.mode) return;
    st.compare.mode = v;
    syncControls();
    loadView();
  });
  ui.align.addEventListener('click', (e) => {
    const v = segmentedValue(e);
    if (!v || (st.alignment && v === st.alignment.mode)) return;
    st.compare.align = v;
    syncControls();
    loadView();
  });
  ui.refresh.addEventListener('click', () => loadRuns());

  // --- loading ----------------------------------------------------------------

  async function loadRuns(first = false) {
    setReady(false);
    let result;
    try {
      result = await api.runs();
    } catch (err) {
      showError(ui.error, `Could not load runs: ${err.message}`);
      return setReady(true);
    }
    if (result.stale) return;
    st.runs = (result.value && result.value.runs) || [];
    if (st.runs.length === 0) return showEmpty();
    ui.empty.hidden = true;
    ui.selectors.hidden = false;
    let prefer = null;
    if (first && st.runs.length > 1 && !st.runs.some((r) => r.run === saved.run)) {
      // Open on the run that needs attention: every run's findings first,
      // but for OPENING_WAIT_MS at most (a busy TensorBoard answers one
      // request at a time); then the most severe among those that answered.
      // With one run there is nothing to choose: its heatmap comes first.
      const all = Promise.allSettled(st.runs.map((r) => findingsView.fetchFindings(r.run)));
      await Promise.race([all, new Promise((resolve) => window.setTimeout(resolve, OPENING_WAIT_MS))]);
      prefer = runNeedingAttention(st.runs.map((r) => r.run), st.findingsByRun);
    }
    st.sel = reconcileSelection(st.runs, st.sel || saved, prefer);
    syncControls();
    const run = st.sel.run;
    findingsView.show(run);
    await loadView(findingsView.after(run, !first));
  }

  function showEmpty() {
    showError(ui.error, null);
    st.sel = null;
    main.grid = other.grid = null;
    st.drawn = false;
    ui.empty.hidden = false;
    ui.view.hidden = ui.selectors.hidden = ui.download.hidden = ui.downloadJson.hidden = true;
    showProblems(ui.problems, null);
    setReady(true);
  }

  function fail(message) {
    showError(ui.error, message);
    main.grid = other.grid = main.resp = null;
    st.drawn = false;
    ui.view.hidden = true;
    setReady(true);
  }

  // The findings cost the server a pass over every column of the run
  // (seconds at 2,000 rows), the heatmap one column: the heatmap is asked
  // first, and `then` (the findings) as soon as its answer is in, so the
  // server computes them while the tab draws, not while it bins the heatmap.
  async function loadView(then = null) {
    const sel = st.sel;
    if (!sel || !info()) {
      if (then) then();
      return;
    }
    hideTooltip(ui.tooltip);
    if (!sel.metric) {
      if (then) then();
      return fail(`Nothing in run ${sel.run} can be read; see the problems above.`);
    }
    setReady(false);
    const mode = compareMode();
    const o = st.compare.other;
    const width = Math.max(50, Math.round((st.layout ? st.layout.width : ui.plot.canvasWrap.clientWidth || 900) * (window.devicePixelRatio || 1)));
    const z = st.rows.zoom;
    const q = {...sel, width, first_step: z && z.steps ? z.steps[0] : null, last_step: z && z.steps ? z.steps[1] : null};
    st.loads++;
    const requested = performance.now();
    const align = st.compare.align || 'auto'; // unless the user chose, the server picks (docs/http_api.md)
    const requests = [api.get('main', mode === 'ratio' ? compareUrl({...q, other: o, align}) : heatmapUrl(q))];
    for (const [channel, url] of [['other', heatmapUrl({...q, run: o})], ['align', alignUrl({...sel, other: o, align})]]) {
      if (mode === 'side') requests.push(api.get(channel, url));
      else api.cancel(channel);
    }
    if (sel.metric === 'check_error') requests.push(api.get('checks', checksUrl(sel.run, sel.granularity)));
    const results = await Promise.allSettled(requests);
    const arrived = performance.now();
    if (then) then();
    if (results.some((r) => r.status === 'fulfilled' && r.value.stale)) return;
    if (results[0].status === 'rejected') {
      return fail(`Could not load ${mode === 'ratio' ? `the ratio ${sel.run} \u00f7 ${o}` : 'the heatmap'}: ${results[0].reason.message}`);
    }
    const a = results[0].value.value;
    const sideFailed = mode === 'side' ? results.slice(1, 3).find((r) => r.status === 'rejected') : null;
    const b = mode === 'side' && !sideFailed ? results[1].value.value : null;
    const aligned = b ? results[2].value.value : mode === 'ratio' ? a : null;
    showError(ui.otherError, sideFailed ? `Could not load ${o}: ${sideFailed.reason.message}` : null);
    st.alignment = aligned ? alignmentOf(aligned) : null;
    const checks = sel.metric === 'check_error' ? results[results.length - 1] : null;
    st.checks = checks && checks.status === 'fulfilled' ? checks.value.value : null;
    try {
      main.grid = decodeHeatmap(a);
      other.grid = b ? decodeHeatmap(b) : null;
    } catch (err) {
      return fail(`The heatmap answer is malformed: ${err.message}`);
    }
    main.resp = a;
    main.run = sel.run;
    other.resp = b;
    other.run = b ? o : null;
    let names = a.layers;
    if (b) {
      const al = alignRows(aligned, a.layers, b.layers);
      main.grid = pickRows(main.grid, al.pickA, al.names);
      other.grid = pickRows(other.grid, al.pickB, al.names);
      other.names = Array.from(al.pickB, (j) => (j < 0 ? null : b.layers[j]));
      st.onlyIn = [al.onlyA, al.onlyB];
      names = al.names;
    } else if (mode === 'ratio') {
      other.names = a.other_layers;
      st.onlyIn = [a.only_in_run || [], a.only_in_other || []];
    }
    if (names.join('\n') !== st.names.join('\n')) {
      st.names = names;
      st.groups = groupRows(names);
      const keys = new Set(st.groups.map((g) => g.key));
      st.rows.collapsed = new Set([...st.rows.collapsed].filter((k) => keys.has(k)));
      if (st.rows.zoom && st.rows.zoom.rows[1] >= names.length) st.rows.zoom = null;
    }
    const axisOf = (p, range) => ({...stepAxis(p.resp.steps, p.resp.step_ends, range), steps: p.resp.steps, stepEnds: p.resp.step_ends});
    main.axis = axisOf(main, null);
    if (b) {
      // Side by side, both runs share one step axis: the same step is in the same column.
      other.axis = axisOf(other, null);
      const range = {first: Math.min(main.axis.first, other.axis.first), end: Math.max(main.axis.end, other.axis.end)};
      main.axis = axisOf(main, range);
      other.axis = axisOf(other, range);
    }
    main.heat.setData(main.grid, main.axis);
    other.heat.setData(other.grid, other.axis);
    replan();
    showError(ui.error, null);
    ui.view.hidden = false;
    renderAlignNote(mode);
    draw();
    // The loss-scale track (mixed precision), asked with the heatmap's own
    // query (width, binning, zoom) so its columns are the heatmap's.
    const trackRun = sel.run;
    showLossScaleTrack(ui.plot.canvasWrap, fetchJson, {run: sel.run, granularity: 'layer', width, reduce: a.reduce,
      first_step: q.first_step, last_step: q.last_step}, info().metrics || [], width,
    () => st.sel !== null && st.sel.run === trackRun).catch(() => {});
    // For benchmarks/frontend.py: when the request left, when the answer was
    // parsed, when the first complete draw ended (performance.now() times;
    // the benchmark takes the response's end from the Resource Timing API).
    st.timing = {requested, parsed: arrived, drawn: performance.now()};
  }

  // --- live refresh: poll `runs`, refetch only what changed ---------------------

  async function poll() {
    if (!st.sel) return loadRuns();
    st.polls++;
    let result;
    try {
      result = await api.runs();
    } catch (err) {
      return; // a failed poll says nothing new
    }
    if (result.stale) return;
    const runs = (result.value && result.value.runs) || [];
    if (runs.length === 0) {
      st.runs = runs;
      return showEmpty();
    }
    const changed = runsChanged(st.runs, runs, [st.sel.run, compareMode() ? st.compare.other : null]);
    const listChanged = runs.map((r) => r.run).join('\n') !== st.runs.map((r) => r.run).join('\n');
    st.runs = runs;
    const prev = st.sel;
    st.sel = reconcileSelection(runs, prev);
    const selChanged = JSON.stringify(prev) !== JSON.stringify(st.sel);
    if (changed || listChanged || selChanged) syncControls();
    if (changed || selChanged) {
      const run = st.sel.run;
      findingsView.show(run);
      await loadView(findingsView.after(run, true));
    }
  }

  function schedulePoll() {
    window.setTimeout(async () => {
      if (doc.visibilityState === 'visible') await poll().catch(() => {});
      schedulePoll();
    }, POLL_MS);
  }

  const {cellAt} = wirePointer({ui, st, main, other, compareMode, updateChart, zoomTo});

  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(() => main.grid && draw(), 150);
  });

  // Read-only hook for browser tests and benchmarks (plus poll).
  window.tbGradcheck = debugHook({st, main, other, compareMode, activeFinding, dark, cellAt, poll});

  loadRuns(true);
  schedulePoll();
}
