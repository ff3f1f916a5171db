"""Drawing speed of the Gradients tab in headless Chromium on a 200-layer x 10,000-step run.

The tab reports each draw's duration (``performance.now()`` around the
redraw, through ``window.tbGradcheck.lastDrawMs()``). The baseline, measured
in the same page, is the least any canvas heatmap can do: one
``putImageData`` of a buffer the size of the plot plus the scaled
``drawImage`` onto the visible canvas. Hover cost is the time the page
spends handling one real mouse move over the heatmap.
"""

import os
import statistics
import sys
import tempfile
import time

from benchmarks.common import row

TARGET_REDRAW_MS = 100
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

_BARE_DRAW = """([w, h]) => {
  const src = document.createElement('canvas'); src.width = w; src.height = h;
  const dst = document.createElement('canvas'); dst.width = 1200; dst.height = 800;
  const data = new ImageData(w, h);
  for (let i = 0; i < data.data.length; i += 4) { data.data[i] = i & 255; data.data[i + 3] = 255; }
  const times = [];
  for (let k = 0; k < 15; k++) {
    const t0 = performance.now();
    src.getContext('2d').putImageData(data, 0, 0);
    const ctx = dst.getContext('2d'); ctx.imageSmoothingEnabled = false;
    ctx.drawImage(src, 0, 0, 1200, 800);
    ctx.getImageData(0, 0, 1, 1);  // forces the draw to finish, as reading a pixel must
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)];
}"""


# Synchronous cost of the tab's mousemove handling: dispatchEvent runs the
# listeners before it returns. Timed over 400 moves in a batch, since the
# page clock is coarsened to 0.1 ms.
_HOVER = """([x, y, w, h]) => {
  const target = document.querySelector('.heatmap-overlay') || document.getElementById('heatmap');
  const plain = document.createElement('div'); document.body.appendChild(plain);
  const batch = (el) => {
    const t0 = performance.now();
    for (let k = 0; k < 400; k++) {
      const px = x + 5 + (w - 10) * (k % 40) / 39, py = y + 5 + (h - 10) * ((k * 7) % 40) / 39;
      el.dispatchEvent(new MouseEvent('mousemove', {clientX: px, clientY: py, bubbles: true}));
    }
    return (performance.now() - t0) / 400;
  };
  batch(target);  // warm up
  const ours = batch(target), bare = batch(plain);
  plain.remove();
  return [ours, bare];
}"""


def run(quick=False):
    from playwright.sync_api import sync_playwright

    from benchmarks.backend import LAYERS, write_run
    from benchmarks.load import start_tensorboard

    steps = 2_000 if quick else 10_000
    redraws = 6 if quick else 20
    rows = []
    with tempfile.TemporaryDirectory() as logdir:
        write_run(logdir, steps)
        proc, base = start_tensorboard(logdir, run="big")  # returns once the plugin answers
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                deadline = time.time() + 300
                frame = None
                while time.time() < deadline:
                    page.goto(f"{base}/#gradients")
                    page.wait_for_selector("iframe", timeout=60_000)
                    frame = next((f for f in page.frames if "plugin_entry" in f.url), None)
                    if frame is None:
                        continue
                    frame.wait_for_function("() => document.body.dataset.ready === '1'", timeout=120_000)
                    if frame.evaluate("() => window.tbGradcheck.state().steps") >= steps:
                        break
                    time.sleep(2)
                state = frame.evaluate("() => window.tbGradcheck.state()")
                first = frame.evaluate("() => window.tbGradcheck.lastDrawMs()")
                draws = []
                for k in range(redraws):
                    frame.click("#scale button[data-value=%s]" % ("linear" if k % 2 == 0 else "log"))
                    frame.wait_for_function("() => document.body.dataset.ready === '1'")
                    draws.append(frame.evaluate("() => window.tbGradcheck.lastDrawMs()"))
                box = frame.locator("#heatmap").bounding_box()
                bare = frame.evaluate(_BARE_DRAW, [min(state["columns"], int(box["width"] * 2)), LAYERS])
                hover, idle = frame.evaluate(_HOVER, [box["x"], box["y"], box["width"], box["height"]])
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
    label = f"{LAYERS}x{steps}"
    rows.append(row(f"frontend: first draw of {label} ({state['columns']} columns sent) vs bare canvas blit",
                    bare, first, "ms", limit=TARGET_REDRAW_MS))
    rows.append(row(f"frontend: redraw p50 (scale toggle), {label}, vs bare canvas blit", bare,
                    statistics.median(draws), "ms", limit=TARGET_REDRAW_MS))
    rows.append(row(f"frontend: redraw max, {label}", bare, max(draws), "ms", limit=TARGET_REDRAW_MS))
    rows.append(row("frontend: mousemove handler over the heatmap (tooltip update) vs an element without handlers",
                    idle, hover, "ms"))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run(quick="--quick" in sys.argv))
