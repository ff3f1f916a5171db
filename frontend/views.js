// DOM of one plot and the messages around it: row labels (with group
// toggles), x axis, the chart's caption and axis, legend, status line,
// tooltip, errors and problems. Names go in through textContent only.

import {formatTicks, linearTicks, logTicks} from './axes.js';
import {LUT_SIZE, MISMATCH_COLOR, rgbCss, SPECIAL_COLORS, VIRIDIS_LUT} from './colour.js';
import {el} from './dom.js';
import {fitLabel, labelledRows, planRows} from './rows.js';

/**
 * The plot: label column | heatmap, then the chart's caption, the chart
 * (its y axis in the label column) and the x axis they share.
 * @param {Document} doc
 * @param {string} [suffix] Appended to ids, "" for the main plot.
 */
export function buildPlot(doc, suffix = '') {
  const prefix = el(doc, 'div', {className: 'row-prefix'});
  const labels = el(doc, 'div', {id: `row-labels${suffix}`, className: 'row-labels'});
  const marks = el(doc, 'div', {id: `row-marks${suffix}`, className: 'row-marks', attrs: {'aria-hidden': 'true'}});
  const canvasWrap = el(doc, 'div', {className: 'canvas-wrap'});
  const noData = el(doc, 'div', {className: 'no-steps', text: 'No steps recorded yet for this selection.'});
  noData.hidden = true;
  const allZero = el(doc, 'div', {id: `all-zero${suffix}`, className: 'all-zero'});
  allZero.hidden = true;
  canvasWrap.append(noData, allZero);
  const xAxis = el(doc, 'div', {className: 'x-axis'});
  const xTitle = el(doc, 'div', {className: 'x-title', text: 'step'});
  const traceCaption = el(doc, 'div', {id: `trace-caption${suffix}`, className: 'trace-caption'});
  const traceAxis = el(doc, 'div', {className: 'trace-axis'});
  const traceWrap = el(doc, 'div', {id: `trace${suffix}`, className: 'trace-wrap'});
  for (const n of [traceCaption, traceAxis, traceWrap]) n.hidden = true;
  const root = el(doc, 'div', {className: 'plot'},
    el(doc, 'div', {className: 'plot-corner'}, prefix),
    el(doc, 'div', {className: 'plot-spacer'}),
    el(doc, 'div', {className: 'label-col'}, labels, marks),
    canvasWrap,
    el(doc, 'div', {className: 'plot-spacer'}),
    traceCaption,
    traceAxis,
    traceWrap,
    el(doc, 'div', {className: 'plot-spacer'}),
    el(doc, 'div', {className: 'x-wrap'}, xAxis, xTitle));
  return {root, prefix, labels, marks, canvasWrap, noData, allZero, xAxis, traceCaption, traceAxis, traceWrap};
}

/** How wide the label column should be for these labels: CSS pixels in [64, maxWidth]. */
export function labelColumnWidth(labels, measure, maxWidth) {
  let widest = 0;
  for (const s of labels) widest = Math.max(widest, measure(s));
  return Math.round(Math.max(80, Math.min(maxWidth, widest + 34)));
}

/**
 * Draws the row labels of a plan: every row when rows are tall enough, else
 * the first rows of groups, at least 14 px apart. A group's label carries a
 * toggle (collapse/expand), a button with data-group=<key>.
 * @param {HTMLElement} container .row-labels
 * @param {object} plan From rows.buildPlan.
 * @param {{names: string[], groups: object[], prefix: string, rowHeight: number,
 *   width: number, measure: Function, collapsed: Set<string>, labels?: string[],
 *   groupKeys?: string[]}} o labels and groupKeys name the display rows and
 *   groups when they are not the plan's own (a compared run's names,
 *   compare.ownLabels); collapsing still goes by the plan's group keys.
 */
export function renderRowLabels(container, plan, o) {
  const doc = container.ownerDocument;
  const n = planRows(plan);
  const total = Math.round(o.rowHeight * n);
  container.style.height = `${total}px`;
  const nodes = [];
  const tall = o.rowHeight >= 12;
  const labels = o.labels || plan.labels;
  for (const d of labelledRows(plan, o.rowHeight)) {
    const g = plan.group[d];
    const group = g >= 0 ? o.groups[g] : null;
    const key = group ? (o.groupKeys ? o.groupKeys[g] : group.key) : null;
    const collapsed = group && o.collapsed.has(group.key);
    // A thinned label stands for its group: name the group, not its first row.
    const full = collapsed || (group && !tall) ? key : labels[d];
    let text = full.startsWith(o.prefix) ? full.slice(o.prefix.length) : full;
    if (collapsed || (group && !tall)) text = `${text.replace(/\/$/, '')} (${group.end - group.start})`;
    const node = el(doc, 'div', {className: 'row-label', title: full, dataset: {row: String(d)}});
    const toggle = !!(group && plan.first[d]);
    if (toggle) {
      node.append(el(doc, 'button', {
        className: 'group-toggle',
        text: collapsed ? '\u25b8' : '\u25be',
        title: `${collapsed ? 'Expand' : 'Collapse'} ${key}`,
        attrs: {type: 'button', 'aria-expanded': String(!collapsed)},
        dataset: {group: group.key},
      }));
    }
    node.append(el(doc, 'span', {className: 'row-text', text: fitLabel(text, o.width - (toggle ? 28 : 12), o.measure)}));
    const h = Math.max(o.rowHeight, 14);
    const top = Math.min(Math.max(0, (d + 0.5) * o.rowHeight - h / 2), Math.max(0, total - h));
    node.style.top = `${Math.round(top)}px`;
    node.style.height = `${h}px`;
    node.style.lineHeight = `${h}px`;
    nodes.push(node);
  }
  container.replaceChildren(...nodes);
}

/** Highlights the label of a display row (or none). */
export function setActiveRow(container, row) {
  const prev = container.querySelector('.row-label.active');
  if (prev && prev.dataset.row !== String(row)) prev.classList.remove('active');
  if (row == null) return;
  const node = container.querySelector(`.row-label[data-row="${row}"]`);
  if (node) node.classList.add('active');
}

/**
 * Draws the x axis.
 * @param {HTMLElement} axis .x-axis
 * @param {{step: number, x: number}[]} ticks From axes.stepTicks.
 * @param {number} width Heatmap width in CSS pixels.
 */
export function renderXAxis(axis, ticks, width) {
  const doc = axis.ownerDocument;
  axis.style.width = `${width}px`;
  axis.replaceChildren(...ticks.map((t) => {
    const node = el(doc, 'div', {className: 'x-tick', text: t.step.toLocaleString('en-US')});
    node.style.left = `${(t.x * width).toFixed(1)}px`;
    return node;
  }));
}

/**
 * Draws the legend: colour bar with ticks, and the special colours.
 * @param {HTMLElement} legend #legend
 * @param {{kind, min, max, unit, lut?, diverging?}} scale A ratio scale
 *   (diverging) gets "x" ticks and its two ends named.
 * @param {{title: string, showZero?: boolean, showMismatch?: boolean,
 *   noScale?: boolean, specials?: object, specialLabels?: object,
 *   lowLabel?: string, highLabel?: string}} opts noScale: no value is on the
 *   scale (no steps, or every cell non-finite or missing), so the bar would
 *   describe nothing. specials/specialLabels replace the special colours
 *   and their names (keys nonfinite, missing, zero).
 */
export function renderLegend(legend, scale, opts) {
  const doc = legend.ownerDocument;
  const swatches = legendSwatches(doc, opts);
  if (opts.noScale) {
    legend.replaceChildren(el(doc, 'span', {className: 'legend-title', text: opts.title}), swatches);
    return;
  }
  const bar = doc.createElement('canvas');
  bar.className = 'legend-bar';
  bar.width = LUT_SIZE;
  bar.height = 1;
  const ctx = bar.getContext('2d');
  ctx.putImageData(new ImageData(new Uint8ClampedArray(scale.lut || VIRIDIS_LUT), LUT_SIZE, 1), 0, 0);
  const tickValues = scale.diverging
    ? logTicks(scale.min, scale.max, 7)
    : scale.kind === 'log' ? logTicks(scale.min, scale.max, 6) : linearTicks(scale.min, scale.max, 4);
  const labels = scale.diverging ? tickValues.map(ratioTickLabel) : formatTicks(tickValues);
  const ticks = el(doc, 'div', {className: 'legend-ticks'});
  tickValues.forEach((v, i) => {
    const t = el(doc, 'span', {className: 'legend-tick', text: labels[i]});
    t.style.left = `${(scale.unit(v) * 100).toFixed(2)}%`;
    ticks.append(t);
  });
  const scaleBox = el(doc, 'div', {className: 'legend-scale'}, bar, ticks);
  if (scale.diverging) {
    // Say which way is which: the ends of a ratio bar are the two runs.
    const ends = el(doc, 'div', {className: 'legend-ends'},
      el(doc, 'span', {text: opts.lowLabel || 'lower'}), el(doc, 'span', {text: opts.highLabel || 'higher'}));
    scaleBox.append(ends);
  }
  legend.replaceChildren(el(doc, 'span', {className: 'legend-title', text: opts.title}), scaleBox, swatches);
}

/** A ratio tick: "1\u00d7", "0.5\u00d7", "1000\u00d7", "1e-6\u00d7". */
export function ratioTickLabel(v) {
  const r = Number(v.toPrecision(3));
  const text = r >= 1e-3 && r < 1e4 ? String(r) : r.toExponential().replace('e+', 'e');
  return `${text}\u00d7`;
}

function legendSwatches(doc, opts) {
  const colors = opts.specials || SPECIAL_COLORS;
  const names = opts.specialLabels || {};
  const items = [
    swatch(doc, rgbCss(colors.nonfinite), names.nonfinite || 'NaN / Inf'),
    swatch(doc, rgbCss(colors.missing), names.missing || 'no gradient'),
  ];
  if (opts.showZero) items.push(swatch(doc, rgbCss(colors.zero), names.zero || '\u2264 0'));
  if (opts.showMismatch) items.push(swatch(doc, 'transparent', 'mismatch', MISMATCH_COLOR));
  return el(doc, 'div', {className: 'legend-swatches'}, ...items);
}

function swatch(doc, fill, text, outline) {
  const box = el(doc, 'span', {className: 'swatch-box'});
  box.style.background = fill;
  if (outline) box.style.boxShadow = `inset 0 0 0 2px ${outline}`;
  return el(doc, 'span', {className: 'swatch'}, box, el(doc, 'span', {text}));
}

/** Fills the status line from statusParts(). */
export function renderStatus(status, parts) {
  const doc = status.ownerDocument;
  const nodes = [];
  parts.forEach((p, i) => {
    if (i > 0) nodes.push(el(doc, 'span', {className: 'sep', text: ' \u00b7 '}));
    nodes.push(el(doc, 'span', {className: p.kind === 'warn' ? 'status-warn' : 'status-part', text: p.text}));
  });
  status.replaceChildren(...nodes);
}

/** Shows (or, with null, hides) the error box. */
export function showError(box, message) {
  box.hidden = !message;
  box.textContent = message || '';
}

/** Shows the problems of a run (tags that could not be read), or hides the box. */
export function showProblems(box, problems) {
  const doc = box.ownerDocument;
  if (!problems || problems.length === 0) {
    box.hidden = true;
    box.replaceChildren();
    return;
  }
  box.hidden = false;
  const list = el(doc, 'ul');
  for (const p of problems) list.append(el(doc, 'li', {text: `${p.tag}: ${p.reason}`}));
  const n = problems.length;
  box.replaceChildren(
    el(doc, 'div', {text: `${n} tag${n === 1 ? '' : 's'} of this run could not be read; the rest is shown.`}),
    list,
  );
}

/**
 * Fills and places the tooltip near the pointer, inside the window.
 * @param {HTMLElement} tip #tooltip
 * @param {[string, string, string?][]} rows [key, value, className?]
 */
export function showTooltip(tip, rows, clientX, clientY) {
  const doc = tip.ownerDocument;
  tip.replaceChildren(
    ...rows.map(([k, v, cls]) =>
      el(doc, 'div', {className: 'tip-row'}, el(doc, 'span', {className: 'tip-key', text: k}),
        el(doc, 'span', {className: `tip-value${cls ? ' ' + cls : ''}`, text: v})),
    ),
  );
  tip.hidden = false;
  const win = doc.defaultView;
  const pad = 14;
  const w = tip.offsetWidth;
  const h = tip.offsetHeight;
  let x = clientX + pad;
  let y = clientY + pad;
  if (x + w > win.innerWidth - 4) x = Math.max(4, clientX - pad - w);
  if (y + h > win.innerHeight - 4) y = Math.max(4, clientY - pad - h);
  tip.style.transform = `translate(${Math.round(x)}px, ${Math.round(y)}px)`;
}

export function hideTooltip(tip) {
  tip.hidden = true;
}

/**
 * Marks rows named by findings: a small bar beside the label, coloured by
 * the worst severity (every affected row, even where labels are thinned).
 * @param {HTMLElement} container .row-marks of a plot.
 * @param {{row: number, severity: string, kinds: string[]}[]} marks From rowMarks.
 * @param {number} rowHeight CSS pixels per row.
 * @param {number} rows Number of rows.
 */
export function renderRowMarks(container, marks, rowHeight, rows) {
  // marks are by display row (index.js maps findings' rows through the plan).
  const doc = container.ownerDocument;
  container.style.height = `${Math.round(rowHeight * rows)}px`;
  const gap = rowHeight >= 6 ? 1 : 0;
  container.replaceChildren(...(marks || []).map((m) => {
    const node = el(doc, 'div', {
      className: `row-mark sev-${m.severity === 'error' ? 'error' : 'warning'}`,
      title: m.kinds.map((k) => k.replace(/_/g, ' ')).join(', '),
      dataset: {row: String(m.row)},
    });
    node.style.top = `${(m.row * rowHeight + gap).toFixed(1)}px`;
    node.style.height = `${Math.max(2, rowHeight - 2 * gap).toFixed(1)}px`;
    return node;
  }));
}

/** Greys out the labels of rows a run does not have (side-by-side view). */
export function markAbsentRows(container, absent, runName) {
  for (const node of container.querySelectorAll('.row-label')) {
    const gone = !!(absent && absent[Number(node.dataset.row)]);
    node.classList.toggle('absent', gone);
    if (gone) node.title = `${node.title} (not in ${runName})`;
  }
}

/**
 * The trace's y axis: tick labels of the scale, right-aligned in the label
 * column, at the heights the trace draws them (4 px padding each end).
 * @param {HTMLElement} axis .trace-axis
 * @param {object} scale From makeScale / makeRatioScale.
 * @param {number} height CSS pixels.
 * @param {boolean} noScale No value on the scale: no ticks.
 */
export function renderTraceAxis(axis, scale, height, noScale) {
  const doc = axis.ownerDocument;
  axis.style.height = `${height}px`;
  if (noScale) {
    axis.replaceChildren();
    return;
  }
  const values = scale.diverging
    ? logTicks(scale.min, scale.max, 3)
    : scale.kind === 'log' ? logTicks(scale.min, scale.max, 4) : linearTicks(scale.min, scale.max, 3);
  const labels = scale.diverging ? values.map(ratioTickLabel) : formatTicks(values);
  const pad = 6; // chart.PAD
  axis.replaceChildren(...values.map((v, i) => {
    const node = el(doc, 'div', {className: 'trace-tick', text: labels[i]});
    node.style.top = `${(pad + (1 - scale.unit(v)) * (height - 2 * pad)).toFixed(1)}px`;
    return node;
  }));
}
