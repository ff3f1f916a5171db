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

// A plain link: the export route answers with Content-Disposition, so the
// browser downloads it; no script and no blob needed. Hidden until a
// selection gives it an href.
function downloadLink(doc, id, format) {
  const link = el(doc, 'a', {
    id,
    className: 'button',
    text: format,
    title: `Download this matrix, unbinned, as ${format}`,
    attrs: {download: '', role: 'button'},
  });
  link.prepend(el(doc, 'span', {className: 'download-icon', text: '\u2913', attrs: {'aria-hidden': 'true'}}));
  link.hidden = true;
  return link;
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
  const compareSelect = el(doc, 'select', {id: 'compare-select', attrs: {'aria-label': 'Compare with'}});
  const compareMode = segmented(doc, 'compare-mode', 'Show', [['side', 'Side by side'], ['ratio', 'Ratio']]);
  compareMode.id = 'compare-mode-control';
  compareMode.hidden = true;
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
    el(doc, 'div', {className: 'selectors-sep', attrs: {'aria-hidden': 'true'}}),
    labelled(doc, 'Compare with', compareSelect, 'compare-control'),
    compareMode,
  );
  const download = downloadLink(doc, 'download', 'CSV');
  const downloadJson = downloadLink(doc, 'download-json', 'JSON');
  const actions = el(doc, 'div', {className: 'actions'}, download, downloadJson, refresh);
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
  // The compared run, side by side: a second plot under the first, on the
  // same rows (aligned by name) and the same colour scale.
  const otherPlot = buildPlot(doc, '-other');
  const plotTitle = el(doc, 'div', {id: 'plot-title', className: 'plot-title'});
  const otherTitle = el(doc, 'div', {id: 'plot-title-other', className: 'plot-title'});
  const otherError = el(doc, 'div', {id: 'other-error', className: 'message message-error', attrs: {role: 'alert'}});
  otherError.hidden = true;
  const otherBox = el(doc, 'div', {id: 'other-pane', className: 'pane pane-other'}, otherTitle, otherError, otherPlot.root);
  otherBox.hidden = true;
  plotTitle.hidden = true;
  const compareNote = el(doc, 'div', {id: 'compare-note', className: 'compare-note'});
  compareNote.hidden = true;
  const plots = el(
    doc, 'div', {className: 'plots'},
    el(doc, 'div', {id: 'main-pane', className: 'pane'}, plotTitle, compareNote, plot.root),
    otherBox,
  );
  // Findings: to the right of the plots on wide screens, under them on narrow.
  const findings = buildFindingsPanel(doc);
  const body = el(doc, 'div', {className: 'view-body'}, plots, findings.root);
  const view = el(doc, 'section', {className: 'view'}, infobar, body);
  view.hidden = true;

  const tooltip = el(doc, 'div', {id: 'tooltip', className: 'tooltip', attrs: {role: 'tooltip'}});
  tooltip.hidden = true;

  const app = el(doc, 'div', {className: 'app'}, toolbar, error, problems, empty, view);
  root.append(app, tooltip);
  return {
    app, toolbar, selectors, runSelect, metricSelect, aggregateSelect, aggregateControl,
    granularity: granularity.querySelector('.segmented'), scale: scale.querySelector('.segmented'),
    refresh, download, downloadJson, error, problems, empty, status, legend, view, plot, findings, tooltip,
    compareSelect, compareMode: compareMode.querySelector('.segmented'), compareModeControl: compareMode,
    otherPlot, otherBox, otherTitle, otherError, plotTitle, compareNote,
  };
}

function buildFindingsPanel(doc) {
  const count = el(doc, 'span', {id: 'findings-count', className: 'findings-count'});
  const runName = el(doc, 'span', {className: 'findings-run'});
  const head = el(doc, 'div', {className: 'findings-head'},
    el(doc, 'h2', {className: 'findings-title', text: 'Findings'}), count, runName);
  const list = el(doc, 'ol', {id: 'findings-list', className: 'findings-list'});
  const note = el(doc, 'div', {id: 'findings-note', className: 'findings-note'});
  const hint = el(doc, 'div', {className: 'findings-hint', text: 'Click a finding to show its cells; click again or press Esc to clear.'});
  hint.hidden = true;
  const root = el(doc, 'aside', {id: 'findings', className: 'findings', attrs: {'aria-label': 'Findings'}}, head, note, list, hint);
  return {root, count, runName, list, note, hint};
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
  const marks = el(doc, 'div', {id: `row-marks${suffix}`, className: 'row-marks', attrs: {'aria-hidden': 'true'}});
  const xAxis = el(doc, 'div', {className: 'x-axis'});
  const xTitle = el(doc, 'div', {className: 'x-title', text: 'step'});
  // The trace: every row as a line over the same steps, between the heatmap
  // and the x axis they share.
  const traceAxis = el(doc, 'div', {className: 'trace-axis'});
  const traceCaption = el(doc, 'div', {className: 'trace-caption'});
  const traceWrap = el(doc, 'div', {id: `trace${suffix}`, className: 'trace-wrap'}, traceCaption);
  traceAxis.hidden = true;
  traceWrap.hidden = true;
  const root = el(
    doc,
    'div',
    {className: 'plot'},
    el(doc, 'div', {className: 'plot-corner'}, prefix),
    el(doc, 'div', {className: 'plot-spacer'}),
    el(doc, 'div', {className: 'label-col'}, labels, marks),
    canvasWrap,
    traceAxis,
    traceWrap,
    el(doc, 'div', {className: 'plot-spacer'}),
    el(doc, 'div', {className: 'x-wrap'}, xAxis, xTitle),
  );
  return {root, prefix, labels, marks, canvasWrap, xAxis, noData, traceAxis, traceWrap, traceCaption};
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
 * Fills the findings panel.
 * @param {object} panel From buildLayout().findings.
 * @param {{run: string, findings: object[]|null, error?: string|null,
 *   loading?: boolean, activeKey?: string|null, keyOf: (f) => string,
 *   headline: (f, layer) => string, evidence: (f) => object[],
 *   kindLabel: (kind) => string, stepText: (steps) => string}} opts
 */
export function renderFindings(panel, opts) {
  const doc = panel.root.ownerDocument;
  const findings = opts.findings || [];
  panel.runName.textContent = opts.run ? opts.run : '';
  panel.runName.title = opts.run ? `findings of run ${opts.run}` : '';
  const worst = findings.some((f) => f.severity === 'error') ? 'error' : findings.length ? 'warning' : 'ok';
  panel.count.textContent = opts.findings ? String(findings.length) : '';
  panel.count.className = `findings-count count-${worst}`;
  panel.count.hidden = !opts.findings;
  panel.root.dataset.state = opts.error ? 'error' : opts.loading && !opts.findings ? 'loading' : findings.length ? 'findings' : 'healthy';
  let note = null;
  if (opts.error) {
    note = el(doc, 'div', {className: 'findings-error', text: opts.error});
  } else if (opts.loading && !opts.findings) {
    note = el(doc, 'div', {className: 'findings-loading', text: 'Looking for problems\u2026'});
  } else if (findings.length === 0) {
    note = el(doc, 'div', {className: 'findings-healthy'},
      el(doc, 'span', {className: 'healthy-icon', text: '\u2713', attrs: {'aria-hidden': 'true'}}),
      el(doc, 'span', {text: 'No findings: gradients look healthy.'}));
  }
  panel.note.replaceChildren(...(note ? [note] : []));
  panel.note.hidden = !note;
  panel.hint.hidden = findings.length === 0 || !!opts.error;
  panel.list.replaceChildren(...findings.map((f, i) => findingItem(doc, f, i, opts)));
}

function findingItem(doc, f, index, opts) {
  const key = opts.keyOf(f);
  const active = key === opts.activeKey;
  const sev = f.severity === 'error' ? 'error' : 'warning';
  const head = el(doc, 'div', {className: 'finding-head'},
    el(doc, 'span', {className: `severity-pill sev-${sev}`, text: sev}),
    el(doc, 'span', {className: 'finding-kind', text: opts.kindLabel(f.kind)}),
    el(doc, 'span', {className: 'finding-steps', text: opts.stepText(f.steps)}));
  const layers = el(doc, 'ul', {className: 'finding-layers', attrs: {'aria-label': 'affected layers'}});
  for (const layer of f.layers || []) {
    const headline = opts.headline(f, layer);
    layers.append(el(doc, 'li', {className: 'layer-chip', title: layer},
      el(doc, 'span', {className: 'layer-name', text: layer}),
      headline ? el(doc, 'span', {className: 'layer-number', text: headline}) : null));
  }
  const main = el(doc, 'button', {
    className: 'finding-main',
    attrs: {type: 'button', 'aria-pressed': String(active), title: active ? 'Clear the highlight' : 'Show these cells on the heatmap'},
    dataset: {key, index: String(index)},
  }, head, el(doc, 'p', {className: 'finding-message', text: f.message || ''}), layers);
  const item = el(doc, 'li', {className: `finding sev-${sev}${active ? ' active' : ''}`, dataset: {kind: f.kind, index: String(index)}}, main);
  const evidence = opts.evidence(f);
  if (evidence.length) {
    const table = el(doc, 'table', {className: 'evidence-table'});
    for (const {layer, items} of evidence) {
      table.append(el(doc, 'tr', {className: 'evidence-layer'}, el(doc, 'th', {text: layer, attrs: {colspan: '2'}})));
      for (const [label, value] of items) {
        table.append(el(doc, 'tr', {}, el(doc, 'td', {className: 'evidence-key', text: label}),
          el(doc, 'td', {className: 'evidence-value', text: value})));
      }
    }
    const n = evidence.length;
    item.append(el(doc, 'details', {className: 'finding-evidence'},
      el(doc, 'summary', {text: `Evidence (${n} layer${n === 1 ? '' : 's'})`}), table));
  }
  return item;
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
  const pad = 4;
  axis.replaceChildren(...values.map((v, i) => {
    const node = el(doc, 'div', {className: 'trace-tick', text: labels[i]});
    node.style.top = `${(pad + (1 - scale.unit(v)) * (height - 2 * pad)).toFixed(1)}px`;
    return node;
  }));
}
