// Findings logic (pure; tested under node): order, the cells a finding
// names on the heatmap, row marks, evidence as text, and which run needs
// attention first.

import {formatNumber, percent} from './format.js';

/** Headings for the kinds of finding the server reports. */
export const KIND_LABELS = {
  non_finite: 'Non-finite gradients',
  check_failure: 'Gradient check failed',
  exploding: 'Exploding gradients',
  vanishing: 'Vanishing gradients',
  dead: 'Dead units',
  clipping: 'Clipping binds',
  not_learning: 'Not learning',
  not_cleared: 'Gradients never cleared',
  saturated: 'Saturated tanh/sigmoid',
  activation_growth: 'Activations growing',
  massive_activations: 'Massive activations',
};

/**
 * The heading of one finding: its kind's, except where the severity changes
 * what it says (dead units that are information are idle or recovered, not dead).
 */
export function kindLabel(f) {
  if (f.kind === 'dead' && f.severity === 'info') return 'Units without gradient (information)';
  return KIND_LABELS[f.kind] || f.kind.replace(/_/g, ' ');
}

// "info" is shown and never a problem (idle units of a healthy network, a
// dead phase that recovered): below a warning, and it needs no attention.
const SEVERITY_RANK = {error: 3, warning: 2, info: 1};

/** The class suffix a severity is drawn with: "error", "warning" or "info" (an unknown one as a warning). */
export function severityClass(severity) {
  return severity === 'error' || severity === 'info' ? severity : 'warning';
}

/** Orders findings most severe first (errors, warnings, then information), stable otherwise. */
export function sortFindings(findings) {
  return findings
    .map((f, i) => [f, i])
    .sort((a, b) => (SEVERITY_RANK[b[0].severity] || 0) - (SEVERITY_RANK[a[0].severity] || 0) || a[1] - b[1])
    .map(([f]) => f);
}

/** A key that names a finding across reloads: its kind and layers. */
export function findingKey(f) {
  return `${f.kind}:${(f.layers || []).join('\u0000')}`;
}

// Row lookup per row list, built once: a finding over 1,000 layers of a
// 2,000-row run must not scan every row for every layer.
const ROW_INDEX = new WeakMap();

/**
 * The rows a layer name covers: the row of that name (layer granularity),
 * or the rows under it (variable granularity, "layer/kernel").
 */
function rowsOfLayer(layer, rows) {
  let index = ROW_INDEX.get(rows);
  if (!index) {
    index = new Map();
    const add = (key, i) => {
      const list = index.get(key);
      if (list) list.push(i);
      else index.set(key, [i]);
    };
    rows.forEach((r, i) => {
      add(r, i);
      // Every ancestor path of a row, so a layer finds its variables.
      for (let k = r.indexOf('/'); k > 0; k = r.indexOf('/', k + 1)) add(r.slice(0, k), i);
    });
    ROW_INDEX.set(rows, index);
  }
  return [...new Set(index.get(layer) || [])].sort((a, b) => a - b);
}

/**
 * The cells of a finding on a heatmap's rows.
 * @param {object} f A finding.
 * @param {string[]} rows The heatmap's `layers`.
 * @returns {{rows: number[], ranges: [number, number][]}} Row indices and,
 *   per row, the inclusive step range: the layer's own
 *   evidence.first_step/last_step when given, else the finding's `steps`.
 */
export function findingCells(f, rows) {
  const out = {rows: [], ranges: []};
  const fallback = Array.isArray(f.steps) && f.steps.length === 2 ? f.steps : null;
  for (const layer of f.layers || []) {
    const e = f.evidence && f.evidence[layer];
    const range = e && Number.isFinite(e.first_step) && Number.isFinite(e.last_step) ? [e.first_step, e.last_step] : fallback;
    for (const r of rowsOfLayer(layer, rows)) {
      out.rows.push(r);
      out.ranges.push(range);
    }
  }
  return out;
}

/**
 * Marks for the row labels: which rows a finding names, by worst severity.
 * Information findings mark no row: the marks say where to look.
 * @returns {{row: number, severity: string, kinds: string[]}[]} In row order.
 */
export function rowMarks(findings, rows) {
  const marks = new Map();
  for (const f of findings || []) {
    if (f.severity === 'info') continue;
    for (const layer of f.layers || []) {
      for (const r of rowsOfLayer(layer, rows)) {
        const m = marks.get(r) || {row: r, severity: f.severity, kinds: []};
        if ((SEVERITY_RANK[f.severity] || 0) > (SEVERITY_RANK[m.severity] || 0)) m.severity = f.severity;
        if (!m.kinds.includes(f.kind)) m.kinds.push(f.kind);
        marks.set(r, m);
      }
    }
  }
  return [...marks.values()].sort((a, b) => a.row - b.row);
}

// How an evidence entry reads: label, and formatter (fractions as percent).
const EVIDENCE_FIELDS = {
  median_norm: ['median norm', formatNumber],
  max_norm: ['max norm', formatNumber],
  median_orders_below_later_layers: ['orders below later layers (median)', formatNumber],
  max_over_median_orders: ['orders above median (max)', formatNumber],
  growth_orders: ['growth over run (orders)', formatNumber],
  fraction_of_steps: ['steps affected', percent],
  median_zero_fraction: ['zero fraction (median)', percent],
  steps_over: ['steps over', formatNumber],
  writes_with_nonfinite: ['writes with NaN/Inf', formatNumber],
  nonfinite_elements: ['non-finite elements at the writes', formatNumber],
  steps_with_nonfinite: ['steps with NaN/Inf', formatNumber],
  max_relative_error: ['max relative error', percent],
  checks_failed: ['checks failed', formatNumber],
  checks_run: ['checks run', formatNumber],
  decided_by_float64_twin: ['of the failed, decided by the float64 twin', formatNumber],
  reason: ['reason', String],
  median_saturated_fraction: ['saturated outputs (median)', percent],
  max_saturated_fraction: ['saturated outputs (max)', percent],
  dead_by_output: ['dead by output (median)', percent],
  views_disagree: ['gradient and output views disagree', (v) => (v ? 'yes' : 'no')],
  max_growth_orders: ['activation growth (orders, max)', formatNumber],
  max_act_rms: ['activation RMS (max)', formatNumber],
  max_abs_activation: ['max |activation|', formatNumber],
  max_over_rms: ['max |activation| / RMS', formatNumber],
};

/**
 * The evidence of a finding as text, one entry per layer.
 * @returns {{layer: string, items: [string, string][]}[]} items are
 *   [label, formatted value]; first_step/last_step become one "steps" item.
 */
export function evidenceItems(f) {
  const out = [];
  for (const layer of f.layers || []) {
    const e = (f.evidence || {})[layer];
    if (!e) continue;
    const items = [];
    if (e.first_step != null) {
      items.push(['steps', e.last_step != null && e.last_step !== e.first_step ? `${e.first_step}\u2013${e.last_step}` : String(e.first_step)]);
    }
    for (const [k, v] of Object.entries(e)) {
      if (k === 'first_step' || k === 'last_step') continue;
      const [label, fmt] = EVIDENCE_FIELDS[k] || [k.replace(/_/g, ' '), formatNumber];
      items.push([label, v === null || v === undefined ? '\u2014' : fmt(v)]);
    }
    out.push({layer, items});
  }
  return out;
}

/**
 * The one number that says most about a layer in a finding, for the list
 * of affected layers (e.g. a failed check's relative error), or "".
 */
export function layerHeadline(f, layer) {
  const e = (f.evidence || {})[layer];
  if (!e) return '';
  switch (f.kind) {
    case 'check_failure':
      return e.max_relative_error != null ? `rel. error ${percent(e.max_relative_error)}` : '';
    case 'exploding':
      return e.max_norm != null ? `max norm ${formatNumber(e.max_norm)}` : '';
    case 'vanishing':
      if (e.median_orders_below_later_layers != null) return `${formatNumber(e.median_orders_below_later_layers)} orders below`;
      return e.median_norm != null ? `median norm ${formatNumber(e.median_norm)}` : '';
    case 'dead':
      return e.median_dead_unit_fraction != null ? `${percent(e.median_dead_unit_fraction)} ${e.state === 'idle' ? 'idle' : 'dead'}` : '';
    case 'saturated':
      return e.max_saturated_fraction != null ? `${percent(e.max_saturated_fraction)} saturated` : '';
    case 'activation_growth':
      return e.max_growth_orders != null ? `+${formatNumber(e.max_growth_orders)} orders` : '';
    case 'massive_activations':
      return e.max_abs_activation != null ? `|a| ${formatNumber(e.max_abs_activation)}` : '';
    case 'non_finite':
      return e.writes_with_nonfinite != null ? `${formatNumber(e.writes_with_nonfinite)} write${e.writes_with_nonfinite === 1 ? '' : 's'}` : '';
    default:
      return '';
  }
}


/** The worst severity in a findings list: "error", "warning", "info" or null. */
export function worstSeverity(findings) {
  let rank = 0;
  for (const f of findings || []) rank = Math.max(rank, SEVERITY_RANK[f.severity] || SEVERITY_RANK.warning);
  return ['', 'info', 'warning', 'error'][rank] || null;
}

/**
 * The run to open on: the one with the most severe findings (errors before
 * warnings, then more findings of that severity), the first run listed on a tie
 * or when every run is healthy (information findings need no attention).
 * @param {string[]} runs Run names in listing order.
 * @param {Map<string, object[]>} findingsByRun Findings of the runs known so far.
 * @returns {string|null}
 */
export function runNeedingAttention(runs, findingsByRun) {
  let best = null;
  let bestScore = 0;
  for (const run of runs) {
    const list = findingsByRun.get(run) || [];
    const worst = worstSeverity(list);
    if (!worst || worst === 'info') continue;
    const score = SEVERITY_RANK[worst] * 1e6 + list.filter((f) => worstSeverity([f]) === worst).length;
    if (score > bestScore) {
      best = run;
      bestScore = score;
    }
  }
  return best ?? (runs[0] ?? null);
}
