// The findings panel's data (DOM side, like trackview.js): asks the server
// for a run's findings, one request per run at a time, and renders the panel.
//
// Findings take the server a pass over every column of a run (a minute at
// 2,000 rows x 10,000 steps); aborting a fetch does not stop the server, so
// a poll every 15 s must not queue another computation behind one still
// running: a refresh asked for meanwhile is made once its answer is in.

import {findingsUrl} from './api.js';
import {evidenceItems, findingKey, kindLabel, layerHeadline, sortFindings} from './findings.js';
import {stepRangeText} from './format.js';
import {renderFindings} from './panel.js';
import {keepFindings, showFindingsOf, takeFindings, takeFindingsError} from './state.js';

/**
 * @param {object} env {st, api, ui, onShown(), onLoaded()}: the tab's state
 *   (it reads findings, findingsByRun, activeKey and sel, and changes them
 *   through state.js), its Api, its layout; onShown runs when a known list
 *   is shown again, onLoaded when a list (or an error) arrived.
 * @returns {{renderPanel, fetchFindings, show, load, after}}
 */
export function makeFindingsLoader({st, api, ui, onShown, onLoaded}) {
  const pending = new Map(); // run -> whether a refresh was asked while its findings were loading

  function renderPanel() {
    const f = st.findings;
    renderFindings(ui.findings, {
      run: f.run, findings: f.list, error: f.error, loading: f.list === null && !f.error, activeKey: st.activeKey,
      keyOf: findingKey, headline: layerHeadline, evidence: evidenceItems, stepText: stepRangeText,
      kindLabel, noun: st.sel ? st.sel.granularity : 'layer',
    });
  }

  /** The sorted findings of `run` (kept in st.findingsByRun), or null when a newer request replaced this one. */
  async function fetchFindings(run) {
    const res = await api.get(`findings:${run}`, findingsUrl(run));
    if (res.stale) return null;
    const list = sortFindings((res.value && res.value.findings) || []);
    keepFindings(st, run, list);
    return list;
  }

  /** The panel of `run` at once (its list if known, else "loading"), before its findings are asked for. */
  function show(run) {
    showFindingsOf(st, run);
    renderPanel();
  }

  /**
   * Shows the findings of `run`, asking the server unless they are known.
   * @param {string} run
   * @param {boolean} [fresh] Ask again (refresh, poll); else a list fetched
   *   while choosing the run to open on is used as it is.
   */
  async function load(run, fresh = false) {
    show(run);
    if (st.findings.list && !fresh) return onShown();
    if (pending.has(run)) {
      pending.set(run, true);
      return;
    }
    pending.set(run, false);
    try {
      const list = await fetchFindings(run);
      if (list === null || !takeFindings(st, run, list)) return;
    } catch (err) {
      if (!takeFindingsError(st, run, `Could not load findings: ${err.message}`)) return;
    } finally {
      const again = pending.get(run);
      pending.delete(run);
      if (again && st.sel && st.sel.run === run) load(run, true);
    }
    renderPanel();
    onLoaded();
  }

  /** What the tab calls once a heatmap answered: the findings of `run`, unless the selection moved on. */
  const after = (run, fresh = false) => () => {
    if (st.sel && st.sel.run === run) load(run, fresh);
  };

  return {renderPanel, fetchFindings, show, load, after};
}
