// DOM of the Gradients tab: controls, status line, legend, row labels, x
// axis, tooltip, empty state and error box.
//
// Layer, variable and run names are user data (a layer may be called
// `<img src=x onerror=alert(1)>`): everything here goes through
// createElement and textContent, never innerHTML.

import {LUT_SIZE, MISMATCH_COLOR, SPECIAL_COLORS, VIRIDIS_LUT, fitLabel, formatTicks, logTicks, linearTicks, rgbCss} from './heatmap.js';

export const FONT_FAMILY = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
export const LABEL_FONT = `11px ${FONT_FAMILY}`;
// Rows shorter than this get every k-th label only, so labels never overlap.
const LABEL_LINE = 12;
// Spacing of thinned labels: at least this many pixels apart, on rows that
// are multiples of 2, 5, 10, 20, ... (row 0, 5, 10 reads better than 0, 3, 6).
const THINNED_SPACING = 16;
const LABEL_STRIDES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000];

/** Every how many rows a label goes, for a row height in CSS pixels. */
export function labelStride(rowHeight) {
  if (rowHeight >= LABEL_LINE) return 1;
  const need = THINNED_SPACING / Math.max(rowHeight, 1e-3);
  return LABEL_STRIDES.find((k) => k >= need) || Math.ceil(need);
}

/**
 * Creates an element.
 * @param {Document} doc
 * @param {string} tag
 * @param {{id?, className?, text?, title?, attrs?: object, dataset?: object}} [props]
 * @param {...Node} children
 */
export function el(doc, tag, props = {}, ...children) {
  const node = doc.createElement(tag);
  if (props.id) node.id = props.id;
  if (props.className) node.className = props.className;
  if (props.text != null) node.textContent = props.text;
  if (props.title != null) node.title = props.title;
  if (props.attrs) for (const [k, v] of Object.entries(props.attrs)) node.setAttribute(k, v);
  if (props.dataset) Object.assign(node.dataset, props.dataset);
  for (const child of children) if (child) node.append(child);
  return node;
}

function labelled(doc, text, control, id) {
  return el(doc, 'label', {className: 'control', id}, el(doc, 'span', {className: 'control-label', text}), control);
}

function segmented(doc, id, label, options) {
  const group = el(doc, 'div', {id, className: 'segmented', attrs: {role: 'group', 'aria-label': label}});
  for (const [value, text] of options) {
    group.append(
      el(doc, 'button', {text, attrs: {type: 'button', 'aria-pressed': 'false'}, dataset: {value}}),
    );
  }
  return el(doc, 'div', {className: 'control'}, el(doc, 'span', {className: 'control-label', text: label}), group);
}

/**
 * Builds the whole tab into `root`.
 * @param {HTMLElement} root document.body.
 * @returns {object} References to the elements the wiring needs.
 */
export function buildLayout(root) {
  const doc = root.ownerDocument;
  const runSelect = el(doc, 'select', {id: 'run-select', attrs: {'aria-label': 'Run'}});
  const metricSelect = el(doc, 'select', {id: 'metric-select', attrs: {'aria-label': 'Metric'}});
  const aggregateSelect = el(doc, 'select', {id: 'aggregate-select', attrs: {'aria-label': 'Aggregate'}});
  const granularity = segmented(doc, 'granularity', 'Rows', [['layer', 'Layer'], ['variable', 'Variable']]);
  const scale = segmented(doc, 'scale', 'Scale', [['log', 'Log'], ['linear', 'Linear']]);
  const aggregateControl = labelled(doc, 'Aggregate', aggregateSelect, 'aggregate-control');
  aggregateControl.hidden = true;
  const refresh = el(
    doc,
    'button',
    {id: 'refresh', className: 'button', attrs: {type: 'button', title: 'Reload runs and the heatmap'}},
    el(doc, 'span', {className: 'refresh-icon', text: '\u21bb', attrs: {'aria-hidden': 'true'}}),
    el(doc, 'span', {text: 'Refresh'}),
  );
  const selectors = el(
    doc,
    'div',
    {className: 'selectors'},
    labelled(doc, 'Run', runSelect),
    labelled(doc, 'Metric', metricSelect),
    granularity,
    scale,
    aggregateControl,
  );
  // A plain link: the export route answers with Content-Disposition, so the
  // browser downloads it; no script and no blob needed.
  const download = el(doc, 'a', {
    id: 'download',
    className: 'button',
    text: 'CSV',
    title: 'Download this matrix, unbinned, as CSV',
    attrs: {download: '', role: 'button'},
  });
  download.prepend(el(doc, 'span', {className: 'download-icon', text: '\u2913', attrs: {'aria-hidden': 'true'}}));
  download.hidden = true;
  const actions = el(doc, 'div', {className: 'actions'}, download, refresh);
  const toolbar = el(doc, 'header', {className: 'toolbar'}, selectors, actions);

  const error = el(doc, 'div', {id: 'error', className: 'message message-error', attrs: {role: 'alert'}});
  error.hidden = true;
  const problems = el(doc, 'div', {id: 'problems', className: 'message message-warn'});
  problems.hidden = true;

  const empty = el(
    doc,
    'div',
    {id: 'empty', className: 'empty'},
    el(doc, 'div', {className: 'empty-title', text: 'No gradient data was found yet.'}),
    el(doc, 'p', {
      text:
        'Write gradient statistics from your training loop into the log directory TensorBoard reads, ' +
        'then press Refresh:',
    }),
    el(doc, 'code', {text: 'tb_gradcheck.GradientWriter(logdir).write(grads, variables, step)'}),
  );
  empty.hidden = true;

  const status = el(doc, 'div', {id: 'status', className: 'status', attrs: {'aria-live': 'polite'}});
  const legend = el(doc, 'div', {id: 'legend', className: 'legend'});
  const infobar = el(doc, 'div', {className: 'infobar'}, status, legend);

  const plot = buildPlot(doc);
  // Findings panel (later): sits to the right of the plot.
  const findings = el(doc, 'aside', {id: 'findings', className: 'findings'});
  findings.hidden = true;
  const body = el(doc, 'div', {className: 'view-body'}, plot.root, findings);
  const view = el(doc, 'section', {className: 'view'}, infobar, body);
  view.hidden = true;

  const tooltip = el(doc, 'div', {id: 'tooltip', className: 'tooltip', attrs: {role: 'tooltip'}});
  tooltip.hidden = true;

  const app = el(doc, 'div', {className: 'app'}, toolbar, error, problems, empty, view);
  root.append(app, tooltip);
  return {
    app, toolbar, selectors, runSelect, metricSelect, aggregateSelect, aggregateControl,
    granularity: granularity.querySelector('.segmented'), scale: scale.querySelector('.segmented'),
    refresh, download, error, problems, empty, status, legend, view, plot, findings, tooltip,
  };
}

/**
 * The plot: row labels | heatmap (canvas wrapper), x axis underneath. One
 * per heatmap, so a second run side by side is a second plot.
 * @param {Document} doc
 * @param {string} [suffix] Appended to ids, "" for the main plot.
 */
export function buildPlot(doc, suffix = '') {
  const prefix = el(doc, 'div', {className: 'row-prefix'});
  const labels = el(doc, 'div', {id: `row-labels${suffix}`, className: 'row-labels'});
  const canvasWrap = el(doc, 'div', {className: 'canvas-wrap'});
  const noData = el(doc, 'div', {className: 'no-steps', text: 'No steps recorded yet for this selection.'});
  noData.hidden = true;
  canvasWrap.append(noData);
  const xAxis = el(doc, 'div', {className: 'x-axis'});
  const xTitle = el(doc, 'div', {className: 'x-title', text: 'step'});
  const root = el(
    doc,
    'div',
    {className: 'plot'},
    el(doc, 'div', {className: 'plot-corner'}, prefix),
    el(doc, 'div', {className: 'plot-spacer'}),
    labels,
    canvasWrap,
    el(doc, 'div', {className: 'plot-spacer'}),
    el(doc, 'div', {className: 'x-wrap'}, xAxis, xTitle),
  );
  return {root, prefix, labels, canvasWrap, xAxis, noData};
}

/**
 * Replaces a select's options.
 * @param {HTMLSelectElement} select
 * @param {{value: string, label: string}[]} items
 * @param {string} selected
 */
export function setOptions(select, items, selected) {
  const doc = select.ownerDocument;
  select.replaceChildren(...items.map((it) => {
    const opt = el(doc, 'option', {text: it.label});
    opt.value = it.value;
    return opt;
  }));
  if (selected != null) select.value = selected;
}

/** Marks the button with data-value=value pressed; disables those not in enabled. */
export function setSegmented(group, value, enabled) {
  for (const button of group.querySelectorAll('button')) {
    const v = button.dataset.value;
    button.setAttribute('aria-pressed', String(v === value));
    button.classList.toggle('active', v === value);
    button.disabled = enabled ? !enabled.includes(v) : false;
  }
}

/** A width measurer for a font (canvas measureText), cached per call site. */
export function makeMeasure(doc, font = LABEL_FONT) {
  const ctx = doc.createElement('canvas').getContext('2d');
  ctx.font = font;
  const cache = new Map();
  return (s) => {
    let w = cache.get(s);
    if (w === undefined) {
      w = ctx.measureText(s).width;
      cache.set(s, w);
    }
    return w;
  };
}

/**
 * How wide the label column should be for these labels.
 * @returns {number} CSS pixels, clamped to [64, maxWidth].
 */
export function labelColumnWidth(labels, measure, maxWidth) {
  let widest = 0;
  for (const s of labels) widest = Math.max(widest, measure(s));
  return Math.round(Math.max(64, Math.min(maxWidth, widest + 14)));
}

/**
 * Draws the row labels.
 * @param {HTMLElement} container #row-labels.
 * @param {string[]} names Full names (tooltips and title attributes).
 * @param {string} prefix Dropped from the labels when non-empty.
 * @param {number} rowHeight CSS pixels per row.
 * @param {number} width Label column width.
 * @param {(s: string) => number} measure
 */
export function renderRowLabels(container, names, prefix, rowHeight, width, measure) {
  const doc = container.ownerDocument;
  const total = Math.round(rowHeight * names.length);
  container.style.height = `${total}px`;
  const every = labelStride(rowHeight);
  const nodes = [];
  const textWidth = width - 10;
  for (let r = 0; r < names.length; r += every) {
    const full = names[r];
    const short = prefix && full.startsWith(prefix) ? full.slice(prefix.length) : full;
    const node = el(doc, 'div', {className: 'row-label', text: fitLabel(short, textWidth, measure), title: full});
    node.dataset.row = String(r);
    const h = Math.max(rowHeight, LABEL_LINE);
    // Centred on its row, but inside the column (row 0 of a 4 px row would
    // otherwise lose its top half).
    const top = Math.min(Math.max(0, (r + 0.5) * rowHeight - h / 2), Math.max(0, total - h));
    node.style.top = `${Math.round(top)}px`;
    node.style.height = `${h}px`;
    node.style.lineHeight = `${h}px`;
    nodes.push(node);
  }
  container.replaceChildren(...nodes);
}

/** Highlights the label of a row (or none). */
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
 * @param {{step: number, x: number}[]} ticks From stepTicks.
 * @param {number} width Heatmap width in CSS pixels.
 */
export function renderXAxis(axis, ticks, width) {
  const doc = axis.ownerDocument;
  axis.style.width = `${width}px`;
  const nodes = ticks.map((t) => {
    const node = el(doc, 'div', {className: 'x-tick', text: t.step.toLocaleString('en-US')});
    node.style.left = `${(t.x * width).toFixed(1)}px`;
    return node;
  });
  axis.replaceChildren(...nodes);
}

/**
 * Draws the legend: colour bar with ticks, and the special colours.
 * @param {HTMLElement} legend #legend
 * @param {{kind, min, max, unit}} scale
 * @param {{title: string, showZero?: boolean, showMismatch?: boolean,
 *   noScale?: boolean}} opts noScale: no value is on the scale (no steps, or
 *   every cell non-finite or missing), so the bar would describe nothing.
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
  ctx.putImageData(new ImageData(new Uint8ClampedArray(VIRIDIS_LUT), LUT_SIZE, 1), 0, 0);
  const tickValues = scale.kind === 'log' ? logTicks(scale.min, scale.max, 6) : linearTicks(scale.min, scale.max, 4);
  const labels = formatTicks(tickValues);
  const ticks = el(doc, 'div', {className: 'legend-ticks'});
  tickValues.forEach((v, i) => {
    const t = el(doc, 'span', {className: 'legend-tick', text: labels[i]});
    t.style.left = `${(scale.unit(v) * 100).toFixed(2)}%`;
    ticks.append(t);
  });
  const scaleBox = el(doc, 'div', {className: 'legend-scale'}, bar, ticks);
  legend.replaceChildren(el(doc, 'span', {className: 'legend-title', text: opts.title}), scaleBox, swatches);
}

function legendSwatches(doc, opts) {
  const items = [
    swatch(doc, rgbCss(SPECIAL_COLORS.nonfinite), 'NaN / Inf'),
    swatch(doc, rgbCss(SPECIAL_COLORS.missing), 'no gradient'),
  ];
  if (opts.showZero) items.push(swatch(doc, rgbCss(SPECIAL_COLORS.zero), '\u2264 0'));
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
