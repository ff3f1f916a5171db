// What to fetch for a view and how its answers become the plots' data
// (pure; tested under node): the matrix query (width, zoomed steps), the
// requests of a selection (heatmap, compare, align, checks), reading their
// settled answers, decoding and aligning the grids, and the shared step axis.

import {alignUrl, checksUrl, compareUrl, heatmapUrl} from './api.js';
import {stepAxis} from './axes.js';
import {alignRows} from './compare.js';
import {decodeHeatmap, pickRows} from './wire.js';

/**
 * The matrix width to ask for: the plot's width in device pixels, so the
 * server bins the steps to one column per pixel.
 * @param {{width: number}|null} layout The last paint's layout, or null before the first.
 * @param {number} clientWidth The canvas box's width now (CSS pixels; 0 while hidden).
 * @param {number} dpr window.devicePixelRatio.
 */
export function requestWidth(layout, clientWidth, dpr) {
  return Math.max(50, Math.round((layout ? layout.width : clientWidth || 900) * (dpr || 1)));
}

/**
 * The query of a selection's matrix: the selection, the width, and the
 * zoomed steps (null: every step).
 */
export function viewQuery(sel, zoom, width) {
  const steps = zoom && zoom.steps;
  return {...sel, width, first_step: steps ? steps[0] : null, last_step: steps ? steps[1] : null};
}

/**
 * The requests a view needs, each on its own channel of api.Api.
 * @param {{run, metric, granularity, aggregate}} sel
 * @param {string|null} mode state.compareMode.
 * @param {{other: string|null, align: string|null}} compare The state's compare.
 * @param {object} q viewQuery(...).
 * @returns {{get: {channel: string, url: string}[], cancel: string[]}} get in
 *   the order readAnswers reads them: the matrix (a compare answer for the
 *   ratio), side by side the compared run and the alignment, and the checks
 *   for check_error; cancel: channels whose answer the view no longer wants.
 */
export function viewRequests(sel, mode, compare, q) {
  const o = compare.other;
  const align = compare.align || 'auto'; // unless the user chose, the server picks (docs/http_api.md)
  const get = [{channel: 'main', url: mode === 'ratio' ? compareUrl({...q, other: o, align}) : heatmapUrl(q)}];
  const cancel = [];
  for (const [channel, url] of [['other', heatmapUrl({...q, run: o})], ['align', alignUrl({...sel, other: o, align})]]) {
    if (mode === 'side') get.push({channel, url});
    else cancel.push(channel);
  }
  if (sel.metric === 'check_error') get.push({channel: 'checks', url: checksUrl(sel.run, sel.granularity)});
  return {get, cancel};
}

/**
 * Reads the settled answers of viewRequests (Promise.allSettled of
 * api.Api.get, each {stale, value}).
 * @param {{status: string, value?: {stale: boolean, value?: object}, reason?: Error}[]} results
 * @param {{run, metric}} sel
 * @param {string|null} mode
 * @param {string|null} other The compared run.
 * @returns {{stale: true}|{error: string}|{a, b, aligned, checks, otherError}}
 *   stale: a newer request replaced one of these (the view is not drawn);
 *   error: the matrix failed; else a the matrix, b the compared run's (null
 *   unless side by side and it answered), aligned the answer that pairs
 *   their rows, checks the `checks` answer (null unless check_error),
 *   otherError why the compared run is missing.
 */
export function readAnswers(results, sel, mode, other) {
  if (results.some((r) => r.status === 'fulfilled' && r.value.stale)) return {stale: true};
  if (results[0].status === 'rejected') {
    const what = mode === 'ratio' ? `the ratio ${sel.run} \u00f7 ${other}` : 'the heatmap';
    return {error: `Could not load ${what}: ${results[0].reason.message}`};
  }
  const a = results[0].value.value;
  const sideFailed = mode === 'side' ? results.slice(1, 3).find((r) => r.status === 'rejected') : null;
  const b = mode === 'side' && !sideFailed ? results[1].value.value : null;
  const checks = sel.metric === 'check_error' ? results[results.length - 1] : null;
  return {
    a, b, aligned: b ? results[2].value.value : mode === 'ratio' ? a : null,
    checks: checks && checks.status === 'fulfilled' ? checks.value.value : null,
    otherError: sideFailed ? `Could not load ${other}: ${sideFailed.reason.message}` : null,
  };
}

/**
 * The step axes of the plots. Side by side, both runs share one step axis:
 * the same step is in the same column.
 * @param {object} a The matrix answer.
 * @param {object|null} b The compared run's, or null.
 * @returns {{main: object, other: object|null}}
 */
export function paneAxes(a, b) {
  const axisOf = (resp, range) => ({...stepAxis(resp.steps, resp.step_ends, range), steps: resp.steps, stepEnds: resp.step_ends});
  if (!b) return {main: axisOf(a, null), other: null};
  const ownA = axisOf(a, null);
  const ownB = axisOf(b, null);
  const range = {first: Math.min(ownA.first, ownB.first), end: Math.max(ownA.end, ownB.end)};
  return {main: axisOf(a, range), other: axisOf(b, range)};
}

/**
 * Decodes the answers into the plots' data (state.takeView takes it). Side
 * by side, both grids are laid out on the aligned rows.
 * @param {{a: object, b: object|null, aligned: object|null}} answers From readAnswers.
 * @param {string|null} mode
 * @param {string} run The selected run.
 * @param {string|null} other The compared run.
 * @returns {{main, other, names: string[], otherNames: (string|null)[]|null,
 *   onlyIn: [string[], string[]], display: object}} main and other as state.createPane;
 *   display the rows' labels where a name is an index (both answers' `labels`).
 * @throws {Error} When an answer is malformed (wire.decodeHeatmap).
 */
export function decodeView({a, b, aligned}, mode, run, other) {
  let mainGrid = decodeHeatmap(a);
  let otherGrid = b ? decodeHeatmap(b) : null;
  let names = a.layers;
  let otherNames = null;
  let onlyIn = [[], []];
  if (b) {
    const al = alignRows(aligned, a.layers, b.layers);
    mainGrid = pickRows(mainGrid, al.pickA, al.names);
    otherGrid = pickRows(otherGrid, al.pickB, al.names);
    otherNames = Array.from(al.pickB, (j) => (j < 0 ? null : b.layers[j]));
    onlyIn = [al.onlyA, al.onlyB];
    names = al.names;
  } else if (mode === 'ratio') {
    otherNames = a.other_layers;
    onlyIn = [a.only_in_run || [], a.only_in_other || []];
  }
  const axes = paneAxes(a, b);
  return {
    main: {run, resp: a, grid: mainGrid, axis: axes.main},
    other: {run: b ? other : null, resp: b, grid: otherGrid, axis: axes.other},
    names, otherNames, onlyIn,
    display: {...((b && b.labels) || {}), ...(a.labels || {})},
  };
}

/**
 * The loss-scale track's query: the heatmap's own (width, binning, zoom) at
 * layer granularity, so its columns are the heatmap's.
 * @param {object} q viewQuery(...).
 * @param {string|null} reduce The matrix answer's `reduce` (null: unbinned).
 */
export function trackQuery(q, reduce) {
  return {run: q.run, granularity: 'layer', width: q.width, reduce, first_step: q.first_step, last_step: q.last_step};
}
