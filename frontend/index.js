// Entry point and controller of the Gradients tab. TensorBoard loads this
// module from data/plugin_entry.html?name=gradients (document base
// plugin/gradients/) and calls render() once per page load.
//
// The controller owns the state (state.js declares every field) and calls
// the rest: changes.js says what an action changes and what must follow,
// load.js what to fetch and how the answers become the plots' data,
// paint.js draws the state. frontend/README.md draws the module map and
// the path from a response to a pixel.

import {Api, fetchJson} from './api.js';
import {changeRows, changeSelection, clearFinding, compareWith, pollRuns, setAlign, setCompareMode, setScale, settleCompare, toggleFinding, zoomTo} from './changes.js';
import {buildLayout, setSegmented, showControls, wireControls, wireRowbar} from './controls.js';
import {runNeedingAttention} from './findings.js';
import {makeFindingsLoader} from './findingsload.js';
import {debugHook} from './hook.js';
import {decodeView, readAnswers, requestWidth, trackQuery, viewQuery, viewRequests} from './load.js';
import {applyMarks, highlightActive, makeView, paint, renderAlignNote, updateChart} from './paint.js';
import {wirePointer} from './pointer.js';
import {compareMode, createState, dropGrids, runInfo, takeAnswers, takePaint, takeRuns, takeView} from './state.js';
import {followTheme} from './theme.js';
import {showLossScaleTrack} from './trackview.js';
import {hideTooltip, showError, showProblems} from './views.js';
// Modules only other modules import, named here too so the browser asks for
// every module as soon as it has parsed this one: otherwise each level of
// imports (index -> controls -> panel -> findings -> format -> rows) is one
// more round trip through TensorBoard's plugin route before the tab can run.
import './axes.js';
import './chart.js';
import './colour.js';
import './compare.js';
import './dom.js';
import './format.js';
import './heatmap.js';
import './losstrack.js';
import './panel.js';
import './rows.js';
import './scene.js';
import './selection.js';
import './tooltip.js';
import './wire.js';

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

/** The tab's controller: owns the state, asks for data, and has the modules change and paint it. */
class Controller {
  constructor(doc) {
    const ui = buildLayout(doc.body);
    this.doc = doc;
    this.ui = ui;
    this.api = new Api();
    this.saved = loadSaved();
    this.st = createState(this.saved);
    this.view = makeView(doc, ui);
    // Findings are asked for after the heatmap (see loadView), one request per run at a time.
    this.findingsView = makeFindingsLoader({
      st: this.st, api: this.api, ui,
      onShown: () => this.st.main.grid && highlightActive(this.view, this.st),
      onLoaded: () => {
        if (!this.st.main.grid) return;
        applyMarks(this.view, this.st);
        highlightActive(this.view, this.st);
      },
    });
    this.dark = followTheme(doc, (isDark) => {
      const {main, other} = this.view.panes;
      main.heat.dark = other.heat.dark = this.view.chart.dark = isDark;
      if (this.st.main.grid) this.draw();
    });
  }

  /** Wires the controls, the pointer, resizing and the test hook to this controller. */
  wire() {
    const {ui, view, st} = this;
    wireControls(ui, {
      select: (change) => this.select(change),
      granularity: (g) => g !== st.sel.granularity && this.select({granularity: g}),
      scale: (scale) => this.setScale(scale),
      compareWith: (run) => {
        compareWith(st, run);
        this.reloadComparison();
      },
      compareMode: (mode) => setCompareMode(st, mode) && this.reloadComparison(),
      align: (align) => setAlign(st, align) && this.reloadComparison(),
      refresh: () => this.loadRuns(),
      toggleFinding: (key) => this.toggleFinding(key),
      clearFinding: () => this.clearFinding(),
    });
    wireRowbar(ui, [ui.plot.labels, ui.otherPlot.labels], {
      filter: (text) => this.changeRows({filter: text}),
      collapseAll: () => this.changeRows({collapseAll: true}),
      expandAll: () => this.changeRows({expandAll: true}),
      resetZoom: () => this.zoomTo(null),
      toggleGroup: (key) => this.changeRows({toggleGroup: key}),
    });
    wirePointer(view, st, {hover: (bin) => updateChart(view, st, bin), zoomTo: (zoom) => this.zoomTo(zoom)});
    let resizeTimer = 0;
    window.addEventListener('resize', () => {
      window.clearTimeout(resizeTimer);
      resizeTimer = window.setTimeout(() => st.main.grid && this.draw(), 150);
    });
    // Read-only hook for browser tests and benchmarks (plus poll).
    window.tbGradcheck = debugHook(view, st, {dark: this.dark, poll: () => this.poll()});
  }

  setReady(ready) {
    this.doc.body.dataset.ready = ready ? '1' : '0';
    this.ui.app.classList.toggle('loading', !ready);
  }

  draw() {
    const painted = paint(this.view, this.st);
    if (!painted) return;
    takePaint(this.st, painted);
    this.setReady(true);
  }

  save() {
    try {
      const {magnitude, fraction} = this.st.scales;
      window.localStorage.setItem(STORAGE_KEY, JSON.stringify({...this.st.sel, scale: magnitude, fractionScale: fraction}));
    } catch (e) {
      // Storage may be disabled; the selection just isn't kept.
    }
  }

  syncControls() {
    const mode = settleCompare(this.st);
    showControls(this.ui, this.st, runInfo(this.st), mode);
  }

  // --- what the user does -----------------------------------------------------

  select(change) {
    const {runChanged} = changeSelection(this.st, change);
    this.save();
    this.syncControls();
    const run = this.st.sel.run;
    if (runChanged) this.findingsView.show(run);
    this.loadView(runChanged ? this.findingsView.after(run) : null);
  }

  setScale(scale) {
    if (!setScale(this.st, scale)) return;
    setSegmented(this.ui.scale, scale);
    this.save();
    if (this.st.main.grid) this.draw(); // same data, new colours: no request
  }

  /** After a change of the comparison: the controls, then the view, show it. */
  reloadComparison() {
    this.syncControls();
    this.loadView();
  }

  changeRows(change) {
    changeRows(this.st, change);
    this.draw();
  }

  zoomTo(zoom) {
    if (zoomTo(this.st, zoom) === 'load') this.loadView();
    else this.draw();
  }

  toggleFinding(key) {
    const t = toggleFinding(this.st, key);
    if (t.action === 'clear') return this.clearFinding();
    if (t.action === 'none') return;
    if (t.clearedFilter) this.ui.rowbar.filter.value = '';
    this.findingsView.renderPanel();
    if (t.select) this.select(t.select);
    else if (this.st.main.grid) this.draw();
  }

  clearFinding() {
    if (!clearFinding(this.st)) return;
    this.findingsView.renderPanel();
    highlightActive(this.view, this.st);
  }

  // --- loading ----------------------------------------------------------------

  async loadRuns(first = false) {
    const {ui, st} = this;
    this.setReady(false);
    let result;
    try {
      result = await this.api.runs();
    } catch (err) {
      showError(ui.error, `Could not load runs: ${err.message}`);
      return this.setReady(true);
    }
    if (result.stale) return;
    const runs = (result.value && result.value.runs) || [];
    if (runs.length === 0) {
      takeRuns(st, runs);
      return this.showEmpty();
    }
    ui.empty.hidden = true;
    ui.selectors.hidden = false;
    const prefer = first ? await this.runToOpenOn(runs) : null;
    takeRuns(st, runs, st.sel || this.saved, prefer);
    this.syncControls();
    const run = st.sel.run;
    this.findingsView.show(run);
    await this.loadView(this.findingsView.after(run, !first));
  }

  // Open on the run that needs attention: every run's findings first, but
  // for OPENING_WAIT_MS at most (a busy TensorBoard answers one request at a
  // time); then the most severe among those that answered. With one run, or
  // a saved selection, there is nothing to choose: its heatmap comes first.
  async runToOpenOn(runs) {
    if (runs.length <= 1 || runs.some((r) => r.run === this.saved.run)) return null;
    const all = Promise.allSettled(runs.map((r) => this.findingsView.fetchFindings(r.run)));
    await Promise.race([all, new Promise((resolve) => window.setTimeout(resolve, OPENING_WAIT_MS))]);
    return runNeedingAttention(runs.map((r) => r.run), this.st.findingsByRun);
  }

  showEmpty() {
    const ui = this.ui;
    showError(ui.error, null);
    dropGrids(this.st);
    ui.empty.hidden = false;
    ui.view.hidden = ui.selectors.hidden = ui.download.hidden = ui.downloadJson.hidden = true;
    showProblems(ui.problems, null);
    this.setReady(true);
  }

  fail(message) {
    showError(this.ui.error, message);
    dropGrids(this.st, true);
    this.ui.view.hidden = true;
    this.setReady(true);
  }

  // The findings cost the server a pass over every column of the run
  // (seconds at 2,000 rows), the heatmap one column: the heatmap is asked
  // first, and `then` (the findings) as soon as its answer is in, so the
  // server computes them while the tab draws, not while it bins the heatmap.
  async loadView(then = null) {
    const {ui, st} = this;
    const sel = st.sel;
    if (!sel || !runInfo(st)) {
      if (then) then();
      return;
    }
    hideTooltip(ui.tooltip);
    if (!sel.metric) {
      if (then) then();
      return this.fail(`Nothing in run ${sel.run} can be read; see the problems above.`);
    }
    this.setReady(false);
    const mode = compareMode(st);
    const other = st.compare.other;
    const q = viewQuery(sel, st.rows.zoom, requestWidth(st.painted.layout, ui.plot.canvasWrap.clientWidth, window.devicePixelRatio));
    st.loads++;
    const requested = performance.now();
    const {get, cancel} = viewRequests(sel, mode, st.compare, q);
    for (const channel of cancel) this.api.cancel(channel);
    const results = await Promise.allSettled(get.map((r) => this.api.get(r.channel, r.url)));
    const arrived = performance.now();
    if (then) then();
    const answers = readAnswers(results, sel, mode, other);
    if (answers.stale) return;
    if (answers.error) return this.fail(answers.error);
    showError(ui.otherError, answers.otherError);
    takeAnswers(st, answers);
    let decoded;
    try {
      decoded = decodeView(answers, mode, sel.run, other);
    } catch (err) {
      return this.fail(`The heatmap answer is malformed: ${err.message}`);
    }
    this.show(decoded, mode);
    this.showTrack(q, answers.a.reduce);
    // For benchmarks/frontend.py: when the request left, when the answer was
    // parsed, when the first complete draw ended (performance.now() times;
    // the benchmark takes the response's end from the Resource Timing API).
    st.timing = {requested, parsed: arrived, drawn: performance.now()};
  }

  show(decoded, mode) {
    const {ui, st, view} = this;
    takeView(st, decoded);
    view.panes.main.heat.setData(st.main.grid, st.main.axis);
    view.panes.other.heat.setData(st.other.grid, st.other.axis);
    showError(ui.error, null);
    ui.view.hidden = false;
    renderAlignNote(view, st, mode);
    this.draw();
  }

  // The loss-scale track (mixed precision), asked with the heatmap's own
  // query (width, binning, zoom) so its columns are the heatmap's.
  showTrack(q, reduce) {
    const st = this.st;
    showLossScaleTrack(this.ui.plot.canvasWrap, fetchJson, trackQuery(q, reduce), runInfo(st).metrics || [], q.width,
      () => st.sel !== null && st.sel.run === q.run).catch(() => {});
  }

  // --- live refresh: poll `runs`, refetch only what changed ---------------------

  async poll() {
    const st = this.st;
    if (!st.sel) return this.loadRuns();
    st.polls++;
    let result;
    try {
      result = await this.api.runs();
    } catch (err) {
      return; // a failed poll says nothing new
    }
    if (result.stale) return;
    const next = pollRuns(st, (result.value && result.value.runs) || []);
    if (next.empty) return this.showEmpty();
    if (next.controls) this.syncControls();
    if (next.reload) {
      const run = st.sel.run;
      this.findingsView.show(run);
      await this.loadView(this.findingsView.after(run, true));
    }
  }

  schedulePoll() {
    window.setTimeout(async () => {
      if (this.doc.visibilityState === 'visible') await this.poll().catch(() => {});
      this.schedulePoll();
    }, POLL_MS);
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
  const tab = new Controller(doc);
  tab.wire();
  tab.loadRuns(true);
  tab.schedulePoll();
}
