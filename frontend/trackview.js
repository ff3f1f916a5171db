// The loss-scale track under the heatmap: the DOM half (canvas drawing). Pure helpers are in losstrack.js.
import {heatmapUrl} from './api.js';
import {lossScaleTrack, trackLayout} from './losstrack.js';

const LINE = '#1565c0';
const REFUSED = '#c62828';

/**
 * Fetches and draws the loss-scale track of the shown heatmap, or removes it.
 *
 * The hook: call after each heatmap draw with the same query the heatmap
 * used (run, granularity, width, reduce) and the run's metric list; it asks
 * for loss_scale and refused_steps with that query, so the columns match.
 * @param {HTMLElement} container Where the track goes (under the heatmap canvas).
 * @param {(url: string) => Promise<object>} fetchJson The tab's JSON fetcher.
 * @param {object} query The heatmap's query (see model.heatmapUrl).
 * @param {string[]} metrics The run's metrics (from `runs`).
 * @param {number} width Pixel width of the heatmap's cells area.
 * @param {() => boolean} [isCurrent] Whether the selection is still the one asked for: a late answer is dropped.
 * @returns {Promise<HTMLCanvasElement|null>} The track, or null for a run without loss scale.
 */
export async function showLossScaleTrack(container, fetchJson, query, metrics, width, isCurrent = () => true) {
  const old = container.querySelector('canvas.loss-scale-track');
  if (!metrics.includes('loss_scale')) {
    if (old) old.remove();
    return null;
  }
  const ask = (metric, reduce) => fetchJson(heatmapUrl({...query, metric, aggregate: 'last', reduce}));
  // Binned (a run with more steps than pixels): a bin shows its smallest
  // scale (the halvings in it) and its largest refused count (so a bin with
  // any refused step is marked); binning depends only on the steps and the
  // width, so these bins are the heatmap's.
  const [scaleResp, refusedResp] = await Promise.all([
    ask('loss_scale', query.reduce ? 'min' : null),
    metrics.includes('refused_steps') ? ask('refused_steps', query.reduce ? 'max' : null) : null,
  ]);
  if (!isCurrent()) return null;
  const track = lossScaleTrack(scaleResp, refusedResp);
  const canvas = old || document.createElement('canvas');
  canvas.className = 'loss-scale-track';
  if (!old) container.appendChild(canvas);
  if (!track) {
    canvas.remove();
    return null;
  }
  drawLossScaleTrack(canvas, track, width, 40);
  return canvas;
}

/** Draws `track` (losstrack.lossScaleTrack) into `canvas`: the scale as a step line, refused steps as ticks. */
export function drawLossScaleTrack(canvas, track, width, height) {
  canvas.width = width;
  canvas.height = height;
  const layout = trackLayout(track, width, height);
  const ctx = canvas.getContext('2d');
  ctx.clearRect(0, 0, width, height);
  ctx.fillStyle = REFUSED;
  for (const r of layout.refused) ctx.fillRect(Math.round(r.x) - 1, 0, 2, height);
  ctx.strokeStyle = LINE;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  layout.points.forEach((p, i) => (i ? ctx.lineTo(p.x, p.y) : ctx.moveTo(p.x, p.y)));
  ctx.stroke();
  canvas.title = layout.top === null ? '' :
    `loss scale ${layout.bottom}–${layout.top}; ${layout.refused.length} column(s) with refused steps (red)`;
}
