// What each action of the user (or a poll) changes in the tab's state, and
// what must follow: a new request, a redraw, or nothing (pure; tested under
// node). The controller (index.js) calls one of these per event and then
// does what the answer says; none of them touches the DOM or the network.

import {findingKey} from './findings.js';
import {aggregatesOf, reconcileSelection, runsChanged} from './selection.js';
import {compareMode, currentScale, replan, runInfo, scaleFamily, takeRuns} from './state.js';

/**
 * A change of the selection (run, metric, granularity, aggregate).
 * @param {object} st
 * @param {{run?, metric?, granularity?, aggregate?}} change
 * @returns {{runChanged: boolean}} runChanged: another run is selected (its
 *   findings are shown and asked for).
 */
export function changeSelection(st, change) {
  const prevRun = st.sel && st.sel.run;
  const next = {...st.sel, ...change};
  // Another run opens on its own default aggregate (max of a window), not on this one's.
  if (change.run && change.run !== prevRun) next.aggregate = null;
  st.sel = reconcileSelection(st.runs, next);
  // Other rows or other steps: the zoom box no longer means anything.
  if (change.run || change.granularity || change.metric) st.rows.zoom = null;
  return {runChanged: st.sel.run !== prevRun};
}

/**
 * Makes the comparison valid for the selection shown: a compared run that is
 * the selected one, or gone, is dropped, and the alignment with it.
 * @returns {string|null} The compare mode shown (state.compareMode).
 */
export function settleCompare(st) {
  const o = st.compare.other;
  if (o && (o === st.sel.run || !runInfo(st, o))) st.compare.other = null;
  const mode = compareMode(st);
  if (!mode) st.alignment = null; // else the server's answer, taken by the load
  return mode;
}

/** The run to compare with ('' or null for none); the alignment goes back to the server's choice. */
export function compareWith(st, other) {
  st.compare.other = other || null;
  st.compare.align = null;
}

/** Side by side or ratio; false when nothing changed. */
export function setCompareMode(st, mode) {
  if (!mode || mode === st.compare.mode) return false;
  st.compare.mode = mode;
  return true;
}

/** Rows aligned by 'structure' or 'name'; false when the comparison shown already is. */
export function setAlign(st, align) {
  if (!align || (st.alignment && align === st.alignment.mode)) return false;
  st.compare.align = align;
  return true;
}

/**
 * Log or linear colours for the shown metric's family (state.scaleFamily);
 * false when nothing changed (same data, new colours: no request).
 */
export function setScale(st, scale) {
  if (!scale || scale === currentScale(st)) return false;
  st.scales[scaleFamily(st.sel && st.sel.metric)] = scale;
  return true;
}

/**
 * The row bar and the group toggles: filter, collapse, expand. Each changes
 * the display rows only (a redraw, no request).
 * @param {object} st
 * @param {{filter?: string, collapseAll?: boolean, expandAll?: boolean, toggleGroup?: string}} change
 */
export function changeRows(st, change) {
  const r = st.rows;
  if (change.filter !== undefined) r.filter = change.filter;
  if (change.collapseAll) r.collapsed = new Set(st.groups.map((g) => g.key));
  if (change.expandAll) r.collapsed = new Set();
  if (change.toggleGroup !== undefined && !r.collapsed.delete(change.toggleGroup)) r.collapsed.add(change.toggleGroup);
  replan(st);
}

/**
 * Zooms into a box of rows and steps (or back out, with null).
 * @param {object} st
 * @param {{rows: [number, number], steps: [number, number]|null}|null} zoom
 * @returns {'load'|'draw'} 'load' when the steps changed (the server bins
 *   the new step range to the plot's width), 'draw' when only rows did.
 */
export function zoomTo(st, zoom) {
  const steps = (z) => JSON.stringify((z || {}).steps || null);
  const stepsChanged = steps(st.rows.zoom) !== steps(zoom);
  st.rows.zoom = zoom;
  replan(st);
  return stepsChanged ? 'load' : 'draw';
}

/**
 * A click on a finding: spotlights it, or clears it when it already is.
 * @param {object} st
 * @param {string} key findings.findingKey of the finding clicked.
 * @returns {{action: 'clear'|'none'|'spotlight', clearedFilter?: boolean,
 *   select?: object|null}} 'clear': call clearFinding; 'none': no such
 *   finding; 'spotlight': the finding is active, and clearedFilter says the
 *   filter and zoom were dropped (its rows must be on screen), select is the
 *   change of metric or aggregate that shows it (null: redraw only).
 */
export function toggleFinding(st, key) {
  if (st.activeKey === key) return {action: 'clear'};
  const f = (st.findings.list || []).find((x) => findingKey(x) === key);
  if (!f) return {action: 'none'};
  st.activeKey = key;
  const clearedFilter = !!(st.rows.filter || st.rows.zoom);
  if (clearedFilter) {
    st.rows.filter = '';
    st.rows.zoom = null;
    replan(st);
  }
  const change = {};
  const info = runInfo(st);
  if (f.metric && (info.metrics || []).includes(f.metric) && f.metric !== st.sel.metric) change.metric = f.metric;
  const metric = change.metric || st.sel.metric;
  if (f.aggregate && aggregatesOf(info, metric).includes(f.aggregate) && f.aggregate !== st.sel.aggregate) change.aggregate = f.aggregate;
  return {action: 'spotlight', clearedFilter, select: Object.keys(change).length ? change : null};
}

/** No finding spotlighted; false when none was. */
export function clearFinding(st) {
  if (!st.activeKey) return false;
  st.activeKey = null;
  return true;
}

/**
 * A poll's `runs` answer: what it changes on screen.
 * @param {object} st
 * @param {object[]} runs The new list.
 * @returns {{empty: boolean, controls: boolean, reload: boolean}} empty: no
 *   run is left; controls: the run list or the selection changed (the
 *   controls show it again); reload: a shown run has new data, or the
 *   selection changed (the heatmap and findings are asked again).
 */
export function pollRuns(st, runs) {
  if (runs.length === 0) {
    takeRuns(st, runs);
    return {empty: true, controls: false, reload: false};
  }
  const changed = runsChanged(st.runs, runs, [st.sel.run, compareMode(st) ? st.compare.other : null]);
  const listChanged = runs.map((r) => r.run).join('\n') !== st.runs.map((r) => r.run).join('\n');
  const selChanged = takeRuns(st, runs);
  return {empty: false, controls: changed || listChanged || selChanged, reload: changed || selChanged};
}
