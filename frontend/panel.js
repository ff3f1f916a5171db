// The findings panel (DOM): one card per finding, most severe first; a
// click on a card spotlights its cells. Long sets of layers are named by
// their ends and count ("block_03 \u2026 block_47, 1,030 layers").

import {el} from './dom.js';
import {severityClass, worstSeverity} from './findings.js';
import {compactNames, LIST_ALL_UP_TO} from './format.js';

// Chips shown on a card whose layer set is long.
const CHIPS = 4;
// A server message naming 1,000 layers is a page of text: cut it, the
// summary line and the evidence table carry the names.
const MESSAGE_CHARS = 400;

function clip(text) {
  return text.length > MESSAGE_CHARS ? text.slice(0, MESSAGE_CHARS) + '\u2026' : text;
}

/** The panel's elements. */
export function buildFindingsPanel(doc) {
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
 * Fills the findings panel.
 * @param {object} panel From buildLayout().findings.
 * @param {{run: string, findings: object[]|null, error?: string|null,
 *   loading?: boolean, activeKey?: string|null, keyOf: (f) => string,
 *   headline: (f, layer) => string, evidence: (f) => object[],
 *   kindLabel: (finding) => string, stepText: (steps) => string}} opts
 */
export function renderFindings(panel, opts) {
  const doc = panel.root.ownerDocument;
  const findings = opts.findings || [];
  panel.runName.textContent = opts.run ? opts.run : '';
  panel.runName.title = opts.run ? `findings of run ${opts.run}` : '';
  const worst = worstSeverity(findings) || 'ok';
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
  const sev = severityClass(f.severity);
  const head = el(doc, 'div', {className: 'finding-head'},
    el(doc, 'span', {className: `severity-pill sev-${sev}`, text: sev}),
    el(doc, 'span', {className: 'finding-kind', text: opts.kindLabel(f)}),
    el(doc, 'span', {className: 'finding-steps', text: opts.stepText(f.steps)}));
  const names = f.layers || [];
  const layers = el(doc, 'ul', {className: 'finding-layers', attrs: {'aria-label': 'affected layers'}});
  // A long set of layers is said by its ends and its count; the chips show
  // the first few (the evidence table below keeps every layer).
  const long = names.length > LIST_ALL_UP_TO;
  for (const layer of long ? names.slice(0, CHIPS) : names) {
    const headline = opts.headline(f, layer);
    const label = (f.labels && f.labels[layer]) || layer; // "0 (Linear)" for a row named by an index
    layers.append(el(doc, 'li', {className: 'layer-chip', title: label},
      el(doc, 'span', {className: 'layer-name', text: label}),
      headline ? el(doc, 'span', {className: 'layer-number', text: headline}) : null));
  }
  if (long && names.length > CHIPS) {
    layers.append(el(doc, 'li', {className: 'layer-more', text: `+${(names.length - CHIPS).toLocaleString('en-US')} more`}));
  }
  const summary = long ? el(doc, 'p', {className: 'finding-summary', text: compactNames(names, opts.noun || 'layer')}) : null;
  const main = el(doc, 'button', {
    className: 'finding-main',
    attrs: {type: 'button', 'aria-pressed': String(active), title: active ? 'Clear the highlight' : 'Show these cells on the heatmap'},
    dataset: {key, index: String(index)},
  }, head, summary, el(doc, 'p', {className: 'finding-message', text: clip(f.message || '')}), layers);
  const item = el(doc, 'li', {className: `finding sev-${sev}${active ? ' active' : ''}`, dataset: {kind: f.kind, index: String(index)}}, main);
  const evidence = opts.evidence(f);
  if (evidence.length) {
    const n = evidence.length;
    const details = el(doc, 'details', {className: 'finding-evidence'},
      el(doc, 'summary', {text: `Evidence (${n.toLocaleString('en-US')} layer${n === 1 ? '' : 's'})`}));
    // Built on first open: a finding over 1,000 layers is thousands of cells.
    details.addEventListener('toggle', () => {
      if (!details.open || details.querySelector('table')) return;
      const table = el(doc, 'table', {className: 'evidence-table'});
      for (const {layer, items} of evidence) {
        table.append(el(doc, 'tr', {className: 'evidence-layer'}, el(doc, 'th', {text: layer, attrs: {colspan: '2'}})));
        for (const [label, value] of items) {
          table.append(el(doc, 'tr', {}, el(doc, 'td', {className: 'evidence-key', text: label}),
            el(doc, 'td', {className: 'evidence-value', text: value})));
        }
      }
      details.append(table);
    });
    item.append(details);
  }
  return item;
}

