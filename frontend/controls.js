// The tab's frame (DOM): toolbar (run, metric, rows, scale, aggregate,
// compare), the row bar (filter, collapse, zoom), message boxes, the plots
// and the findings panel's place. Returns the elements index.js wires.

import {exportUrl} from './api.js';
import {el} from './dom.js';
import {ratioMetricEnds} from './format.js';
import {buildFindingsPanel} from './panel.js';
import {aggregatesOf, granularitiesWithMetric, metricChoices} from './selection.js';
import {currentScale} from './state.js';
import {buildPlot, showProblems} from './views.js';

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
  const align = segmented(doc, 'align', 'Align rows', [['structure', 'By structure'], ['name', 'By name']]);
  align.id = 'align-control';
  align.hidden = true;
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
  const rowbar = buildRowbar(doc);

  const plot = buildPlot(doc);
  // The compared run, side by side: a second plot under the first, on the
  // same rows (aligned by name) and the same colour scale.
  const otherPlot = buildPlot(doc, '-other');
  const plotTitle = el(doc, 'div', {id: 'plot-title', className: 'plot-title'});
  const alignNote = el(doc, 'div', {id: 'align-note', className: 'align-note'});
  alignNote.hidden = true;
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
    el(doc, 'div', {id: 'main-pane', className: 'pane'}, plotTitle,
      el(doc, 'div', {className: 'align-bar'}, align, alignNote), compareNote, plot.root),
    otherBox,
  );
  // Findings: to the right of the plots on wide screens, under them on narrow.
  const findings = buildFindingsPanel(doc);
  const body = el(doc, 'div', {className: 'view-body'}, plots, findings.root);
  const view = el(doc, 'section', {className: 'view'}, infobar, rowbar.root, body);
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
    otherPlot, otherBox, otherTitle, otherError, plotTitle, compareNote, alignNote, rowbar,
    align: align.querySelector('.segmented'), alignControl: align,
  };
}

// Filter, collapse/expand all, and the zoom state, above the plots.
function buildRowbar(doc) {
  const filter = el(doc, 'input', {id: 'row-filter', className: 'row-filter',
    attrs: {type: 'search', placeholder: 'Filter rows by name', 'aria-label': 'Filter rows by name', spellcheck: 'false'}});
  const collapseAll = el(doc, 'button', {id: 'collapse-all', className: 'button small', text: 'Collapse blocks',
    attrs: {type: 'button', title: 'Show each repeated block as one row (its max)'}});
  const expandAll = el(doc, 'button', {id: 'expand-all', className: 'button small', text: 'Expand all', attrs: {type: 'button'}});
  const zoomNote = el(doc, 'span', {id: 'zoom-note', className: 'zoom-note'});
  const resetZoom = el(doc, 'button', {id: 'reset-zoom', className: 'button small', text: 'Reset zoom', attrs: {type: 'button'}});
  const hint = el(doc, 'span', {className: 'rowbar-hint', text: 'Drag on the heatmap to zoom into rows and steps.'});
  zoomNote.hidden = true;
  resetZoom.hidden = true;
  const root = el(doc, 'div', {className: 'rowbar'}, filter, collapseAll, expandAll, zoomNote, resetZoom, hint);
  return {root, filter, collapseAll, expandAll, zoomNote, resetZoom, hint};
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

/**
 * Shows the state in the controls: options, pressed buttons, what is hidden.
 * @param {object} ui From buildLayout.
 * @param {object} st The controller's state (runs, sel, scale, compare, alignment).
 * @param {object} r The selected run's entry in `runs`.
 * @param {string|null} mode The compare mode shown (null, 'side', 'ratio').
 */
export function showControls(ui, st, r, mode) {
  const sel = st.sel;
  setOptions(ui.runSelect, st.runs.map((x) => ({value: x.run, label: x.run})), sel.run);
  ui.runSelect.title = sel.run;
  setOptions(ui.metricSelect, metricChoices(r), sel.metric);
  setSegmented(ui.granularity, sel.granularity, granularitiesWithMetric(r, sel.metric));
  const aggs = aggregatesOf(r, sel.metric);
  ui.aggregateControl.hidden = aggs.length <= 1;
  setOptions(ui.aggregateSelect, aggs.map((a) => ({value: a, label: a})), sel.aggregate);
  const others = st.runs.filter((x) => x.run !== sel.run);
  setOptions(ui.compareSelect, [{value: '', label: 'none'}, ...others.map((x) => ({value: x.run, label: x.run}))], st.compare.other || '');
  ui.compareSelect.title = st.compare.other || '';
  ui.compareSelect.disabled = others.length === 0;
  ui.compareModeControl.hidden = ui.alignControl.hidden = !st.compare.other;
  setSegmented(ui.compareMode, mode === 'ratio' ? 'ratio' : 'side', sel.metric === 'check_error' ? ['side'] : undefined);
  if (st.alignment) setSegmented(ui.align, st.alignment.mode);
  const ratioScale = mode === 'ratio' || !!ratioMetricEnds(sel.metric);
  setSegmented(ui.scale, ratioScale ? 'log' : currentScale(st), ratioScale ? ['log'] : undefined);
  showProblems(ui.problems, r.problems);
  for (const [a, fmt] of [[ui.download, 'csv'], [ui.downloadJson, 'json']]) {
    a.href = exportUrl(sel, fmt);
    a.title = `Download ${sel.run}'s ${sel.metric} matrix, unbinned, as ${fmt.toUpperCase()}`;
    a.hidden = false;
  }
}

/**
 * Wires the toolbar and the findings panel to the controller.
 * @param {object} ui From buildLayout.
 * @param {{select(change), granularity(value), scale(value), compareWith(run),
 *   compareMode(mode), align(mode), refresh(), toggleFinding(key),
 *   clearFinding()}} on A segmented control calls with the value of the
 *   button pressed, never a disabled one; compareWith with null for none.
 */
export function wireControls(ui, on) {
  const pressed = (handler) => (e) => {
    const b = e.target.closest('button');
    if (b && !b.disabled && b.dataset.value) handler(b.dataset.value);
  };
  ui.runSelect.addEventListener('change', () => on.select({run: ui.runSelect.value}));
  ui.metricSelect.addEventListener('change', () => on.select({metric: ui.metricSelect.value}));
  ui.aggregateSelect.addEventListener('change', () => on.select({aggregate: ui.aggregateSelect.value}));
  ui.granularity.addEventListener('click', pressed((v) => on.granularity(v)));
  ui.scale.addEventListener('click', pressed((v) => on.scale(v)));
  ui.compareSelect.addEventListener('change', () => on.compareWith(ui.compareSelect.value || null));
  ui.compareMode.addEventListener('click', pressed((v) => on.compareMode(v)));
  ui.align.addEventListener('click', pressed((v) => on.align(v)));
  ui.refresh.addEventListener('click', () => on.refresh());
  ui.findings.list.addEventListener('click', (e) => {
    const b = e.target.closest('button.finding-main');
    if (b) on.toggleFinding(b.dataset.key);
  });
  ui.app.ownerDocument.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') on.clearFinding();
  });
}


/**
 * Wires the row bar and the group toggles of the row labels to the controller.
 * @param {object} ui From buildLayout.
 * @param {HTMLElement[]} labelColumns The plots' .row-labels.
 * @param {{filter(text), collapseAll(), expandAll(), resetZoom(), toggleGroup(key)}} on
 */
export function wireRowbar(ui, labelColumns, on) {
  const rb = ui.rowbar;
  rb.filter.addEventListener('input', () => on.filter(rb.filter.value));
  rb.collapseAll.addEventListener('click', () => on.collapseAll());
  rb.expandAll.addEventListener('click', () => on.expandAll());
  rb.resetZoom.addEventListener('click', () => on.resetZoom());
  for (const column of labelColumns) {
    column.addEventListener('click', (e) => {
      const b = e.target.closest('button.group-toggle');
      if (b) on.toggleGroup(b.dataset.group);
    });
  }
}
