// The tab's state (pure; tested under node): every field, declared once
// here, and the named functions that change it. The controller (index.js)
// owns the one state object; the other modules read what they are given and
// change the state only through these functions (or changes.js, which
// decides what a user's action changes and what must follow).

import {alignmentOf} from './compare.js';
import {findingKey} from './findings.js';
import {isFractionMetric} from './format.js';
import {buildPlan, groupRows} from './rows.js';
import {reconcileSelection} from './selection.js';

/** What one plot shows: an answer of the server, decoded. */
export function createPane() {
  return {
    run: null, // the run drawn in this plot (null before the first answer)
    resp: null, // the `heatmap` (or `compare`) answer, as JSON
    grid: null, // wire.decodeHeatmap of resp, rows laid out on the shown rows (state.names)
    axis: null, // axes.stepAxis of resp's steps, plus {steps, stepEnds}
  };
}

/**
 * A new tab's state.
 * @param {{scale?: string, fractionScale?: string}} [saved] What
 *   localStorage kept (the scales; the selection is reconciled against the
 *   runs once they are known).
 */
export function createState(saved = {}) {
  return {
    runs: [], // the `runs` answer's list, as last received
    sel: null, // {run, metric, granularity, aggregate} (selection.reconcileSelection); null without runs
    // Colour scale of a heatmap that is not a ratio, per family of metric
    // (scaleFamily): magnitudes span decades (log), fractions are shares
    // of [0, 1] (linear). The Scale control sets the shown metric's family.
    scales: {
      magnitude: saved.scale === 'linear' ? 'linear' : 'log',
      fraction: saved.fractionScale === 'log' ? 'log' : 'linear',
    },
    compare: {
      other: null, // the run compared with the selected one, or null
      mode: 'side', // what the user asked for: 'side' (two plots) or 'ratio' (run \u00f7 other)
      align: null, // 'structure' or 'name' when the user chose; null: the server picks (auto)
    },
    alignment: null, // compare.alignmentOf of the comparison shown; null when none is
    onlyIn: [[], []], // rows only the selected run has, rows only the compared run has
    otherNames: null, // the compared run's own name of each shown row (null where it lacks it)
    main: createPane(), // the upper plot: the selected run, or the ratio
    other: createPane(), // the lower plot, side by side: the compared run
    names: [], // names of the shown rows (the aligned rows of both runs side by side)
    display: {}, // name -> label for rows named by an index ("0 (Linear)"): the answers' `labels`
    groups: [], // rows.groupRows(names): the repeated blocks
    rows: {
      collapsed: new Set(), // keys of the groups shown as one row
      filter: '', // the row filter's text
      zoom: null, // {rows: [first, last] source rows, steps: [first, last] or null}, or null
    },
    plan: null, // rows.buildPlan of names, groups and rows: the display rows
    checks: null, // the `checks` answer of the run while its metric is check_error
    findings: {
      run: null, // the run whose findings the panel shows
      list: null, // its findings, most severe first; null while they load
      error: null, // why they could not be loaded, or null
    },
    findingsByRun: new Map(), // run -> its sorted findings, for every run asked so far
    activeKey: null, // findings.findingKey of the finding spotlighted, or null
    painted: {
      layout: null, // sizes of the last paint: label column, plot width and height, row and chart heights
      scale: null, // the colour scale both heatmaps and the chart were drawn with
      allZero: false, // every value is 0: a sentence was shown instead of the heatmap
      drawn: false, // a heatmap was drawn
      otherLabels: null, // the lower plot's display-row labels (the compared run's own names)
      ms: 0, // how long the whole repaint took (canvases, labels, chart, legend)
    },
    timing: null, // {requested, parsed, drawn}: performance.now() times of the last load (benchmarks)
    loads: 0, // heatmap loads since the page opened (tests)
    polls: 0, // polls of `runs` since the page opened (tests)
  };
}

/** Which of `st.scales` a metric is drawn with: 'fraction' (format.isFractionMetric) or 'magnitude'. */
export function scaleFamily(metric) {
  return isFractionMetric(metric) ? 'fraction' : 'magnitude';
}

/** The colour scale ('log' or 'linear') of the metric shown, before a ratio overrides it. */
export function currentScale(st) {
  return st.scales[scaleFamily(st.sel && st.sel.metric)];
}

/** The `runs` entry of a run (default the selected one), or null. */
export function runInfo(st, name = st.sel && st.sel.run) {
  return st.runs.find((r) => r.run === name) || null;
}

/** What the plots show: null (one run), 'side' or 'ratio'; a gradient check has no ratio. */
export function compareMode(st) {
  const o = st.compare.other;
  if (!o || !st.sel || o === st.sel.run || !runInfo(st, o)) return null;
  return st.compare.mode === 'ratio' && st.sel.metric !== 'check_error' ? 'ratio' : 'side';
}

/** The finding spotlighted, or null. */
export function activeFinding(st) {
  return (st.findings.list || []).find((f) => findingKey(f) === st.activeKey) || null;
}

/** Rebuilds the display rows from the names, groups, collapsed blocks, filter and zoom. */
export function replan(st) {
  const z = st.rows.zoom;
  st.plan = buildPlan(st.names, st.groups, {
    collapsed: st.rows.collapsed, filter: st.rows.filter, range: z ? z.rows : null, display: st.display,
  });
}

/**
 * Takes a new runs list and reconciles the selection with it.
 * @param {object} st
 * @param {object[]} runs The `runs` answer's list.
 * @param {object} [prev] The selection to keep what is valid of (default the current one).
 * @param {string|null} [prefer] The run to open on when prev names none that exists.
 * @returns {boolean} Whether the selection changed.
 */
export function takeRuns(st, runs, prev = st.sel, prefer = null) {
  const before = st.sel;
  st.runs = runs;
  st.sel = runs.length ? reconcileSelection(runs, prev || {}, prefer) : null;
  return JSON.stringify(before) !== JSON.stringify(st.sel);
}

/** Keeps what a load's answers say beside the matrices: the alignment of a comparison, the checks. */
export function takeAnswers(st, answers) {
  st.alignment = answers.aligned ? alignmentOf(answers.aligned) : null;
  st.checks = answers.checks;
}

/**
 * Puts a decoded view in the plots (load.decodeView's answer). Rows regroup
 * only when their names changed: collapsed blocks and the zoom survive a
 * reload that brings new steps, not rows that are gone.
 */
export function takeView(st, view) {
  st.main = view.main;
  st.other = view.other;
  st.otherNames = view.otherNames;
  st.onlyIn = view.onlyIn;
  st.display = view.display || {};
  const names = view.names;
  if (names.join('\n') !== st.names.join('\n')) {
    st.names = names;
    st.groups = groupRows(names);
    const keys = new Set(st.groups.map((g) => g.key));
    st.rows.collapsed = new Set([...st.rows.collapsed].filter((k) => keys.has(k)));
    if (st.rows.zoom && st.rows.zoom.rows[1] >= names.length) st.rows.zoom = null;
  }
  replan(st);
}

/**
 * Nothing to draw (no runs, or a failed load): the plots forget their grids.
 * @param {object} st
 * @param {boolean} [failed] A failed load also forgets the main answer.
 */
export function dropGrids(st, failed = false) {
  st.main.grid = st.other.grid = null;
  if (failed) st.main.resp = null;
  st.painted.drawn = false;
}

/** Keeps what a paint drew (paint.paint's answer). */
export function takePaint(st, painted) {
  st.painted = painted;
}

// --- findings: what findingsload.js changes ---------------------------------------

/** The panel shows `run`: its findings if known, else "loading"; a finding of another run is no longer spotlighted. */
export function showFindingsOf(st, run) {
  if (st.findings.run === run) return;
  st.findings = {run, list: st.findingsByRun.get(run) || null, error: null};
  st.activeKey = null;
}

/** Remembers the sorted findings of `run`. */
export function keepFindings(st, run, list) {
  st.findingsByRun.set(run, list);
}

/** The findings of `run` arrived; false when the panel shows another run by now. */
export function takeFindings(st, run, list) {
  if (st.findings.run !== run) return false;
  st.findings = {run, list, error: null};
  return true;
}

/** The findings of `run` could not be loaded; false when the panel shows another run by now. */
export function takeFindingsError(st, run, message) {
  if (st.findings.run !== run) return false;
  st.findings = {...st.findings, error: message};
  return true;
}
