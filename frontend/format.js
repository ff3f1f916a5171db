// Text for people (pure; tested under node): numbers, cell values, counts,
// metric names, and long sets of layer names said compactly.

import {groupRows, sharedPrefix} from './rows.js';

/** Metric names a person reads, keyed by the metric id the server uses. */
export const METRIC_LABELS = {
  grad_norm: 'gradient norm',
  grad_max_abs: 'max |gradient|',
  grad_zero_fraction: 'zero fraction',
  grad_nonfinite: 'non-finite count',
  weight_norm: 'weight norm',
  grad_to_weight: 'gradient / weight norm',
  dead_unit_fraction: 'dead unit fraction',
  grad_norm_before_clip: 'gradient norm before clipping',
  clip_ratio: 'before-clip / applied norm',
  update_norm: 'update norm',
  update_to_weight: 'update / weight norm',
  act_rms: 'activation RMS',
  act_max_abs: 'max |activation|',
  act_nonfinite: 'non-finite activations',
  act_dead_fraction: 'dead by output (ReLU)',
  act_saturated_fraction: 'saturated (tanh/sigmoid)',
  check_error: 'gradient check error',
};

/**
 * Metrics whose values are shares of a whole, in [0, 1]: the stored columns
 * named `*_fraction` (docs/stored_format.md). They open on a linear colour
 * scale, where 0 is a colour like any other: on a log scale a healthy
 * layer at exactly 0 is the black "<= 0" swatch, and 64% and 80% sit a
 * tenth of a decade apart.
 */
export function isFractionMetric(metric) {
  return /_fraction$/.test(String(metric));
}

/**
 * Metrics that are ratios around 1 and read best on the diverging scale,
 * with what each end of it means; null for any other metric.
 * @returns {{low: string, high: string}|null}
 */
export function ratioMetricEnds(metric) {
  return {clip_ratio: {low: 'applied larger', high: 'clipped (before-clip larger)'}}[metric] || null;
}

/**
 * "gradient norm (grad_norm)" for a metric this tab knows; a metric the
 * server added since is shown by its id with underscores as spaces
 * ("new_metric" -> "new metric (new_metric)"): the metric list comes from
 * the server, never from this table.
 */
export function metricLabel(metric) {
  const label = METRIC_LABELS[metric] || String(metric).replace(/_/g, ' ');
  return label === metric ? metric : `${label} (${metric})`;
}

/**
 * What an all-zero matrix of a metric means, as a sentence.
 * @returns {string} e.g. "grad_nonfinite is 0 everywhere shown: no NaN or Inf."
 */
export function allZeroText(metric) {
  const why = {
    grad_nonfinite: 'no NaN or Inf in any gradient',
    grad_zero_fraction: 'no gradient element is exactly zero',
    dead_unit_fraction: 'no dead units',
    act_nonfinite: 'no NaN or Inf in any layer output',
    act_dead_fraction: 'every unit feeding a ReLU had a positive output',
    act_saturated_fraction: 'no tanh or sigmoid output near its bounds',
  }[metric];
  return `${metric} is 0 at every step and row shown${why ? `: ${why}` : ''}.`;
}

/** "3 steps", "1 layer", "1,030 layers". */
export function plural(n, word) {
  return `${n.toLocaleString('en-US')} ${word}${n === 1 ? '' : 's'}`;
}

/** "1,030 layers" or "1 variable", by granularity. */
export function rowNoun(granularity, n) {
  return plural(n, granularity === 'variable' ? 'variable' : 'layer');
}

/**
 * A number for people: 3 significant digits, exponent notation below 1e-3
 * and from 1e5 up, integers grouped. null/undefined -> "\u2014".
 */
export function formatNumber(v) {
  if (v === null || v === undefined) return '\u2014';
  if (typeof v === 'string') return v;
  if (Number.isNaN(v)) return 'NaN';
  if (!Number.isFinite(v)) return v > 0 ? 'Infinity' : '-Infinity';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e15) return v.toLocaleString('en-US');
  if (a < 1e-3 || a >= 1e5) return v.toExponential(2).replace(/\.?0+e/, 'e').replace('e+', 'e');
  return String(Number(v.toPrecision(3)));
}

export function percent(v) {
  if (!Number.isFinite(v)) return formatNumber(v);
  const p = v * 100;
  if (p !== 0 && Math.abs(p) < 0.01) return `${formatNumber(p)}%`;
  return `${Number(p.toPrecision(3))}%`;
}



/** Whether `metric` is a statistic of layer outputs (the server's metadata.ACTIVATION_STAT_COLUMNS). */
export function isActivationMetric(metric) {
  return String(metric || '').startsWith('act_');
}

/**
 * What a cell without a value means for `metric`: a gradient metric's row had
 * no gradient; an activation metric's layer had no output statistic (its
 * output feeds no ReLU or tanh/sigmoid for the fractions, or the writer ran
 * without activations).
 * @param {string} [metric]
 * @returns {string}
 */
export function missingText(metric) {
  return isActivationMetric(metric) ? 'missing (not recorded for this layer)' : 'missing (no gradient)';
}

/**
 * Formats a cell value for the tooltip: exact for a float32 (the shortest
 * decimal, up to 9 significant digits, that reads back as the same float32),
 * 7 significant digits for anything else, exponent notation below 1e-4 and
 * from 1e6 up.
 * @param {number|null} v
 * @param {string} [metric] Names what a missing value means (missingText).
 * @returns {string} e.g. "1.2e-7", "0.0031", "NaN", "missing (no gradient)".
 */
export function formatValue(v, metric) {
  if (v === null || v === undefined) return missingText(metric);
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return 'Infinity';
  if (v === -Infinity) return '-Infinity';
  if (v === 0) return '0';
  const f = Math.fround(v);
  let p = 7;
  if (f === v) {
    for (p = 1; p < 9; p++) {
      if (Math.fround(Number(v.toPrecision(p))) === f) break;
    }
  }
  const a = Math.abs(v);
  if (a < 1e-4 || a >= 1e6) return v.toExponential(p - 1).replace(/\.?0+e/, 'e').replace('e+', 'e');
  return String(Number(v.toPrecision(p)));
}


/** "steps 250\u2013300", "step 30", or "" for a [first, last] range. */
export function stepRangeText(steps) {
  if (!Array.isArray(steps) || steps.length !== 2) return '';
  const [a, b] = steps;
  return a === b ? `step ${a.toLocaleString('en-US')}` : `steps ${a.toLocaleString('en-US')}\u2013${b.toLocaleString('en-US')}`;
}

/** Above this many names, a set of layers is said by its ends and its count. */
export const LIST_ALL_UP_TO = 6;

/**
 * A set of layer names in a few words: every name when there are few, else
 * the first and last block and the count ("transformer/block_03 \u2026
 * block_47, 1,030 layers"), by the groups of repeated blocks when there are any.
 * @param {string[]} names In depth order.
 * @param {string} [noun] "layer" or "variable".
 * @returns {string}
 */
export function compactNames(names, noun = 'layer') {
  if (names.length <= LIST_ALL_UP_TO) return names.join(', ');
  const prefix = sharedPrefix(names);
  const groups = groupRows(names);
  const trim = (s) => s.replace(/\/$/, '');
  let a = names[0].slice(prefix.length);
  let b = names[names.length - 1].slice(prefix.length);
  if (groups.length >= 2 && groups[0].start === 0 && groups[groups.length - 1].end === names.length) {
    a = trim(groups[0].label);
    b = trim(groups[groups.length - 1].label);
  }
  return `${prefix}${a} \u2026 ${b}, ${plural(names.length, noun)}`;
}
