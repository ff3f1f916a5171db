"""The Gradients tab in a real browser: headless Chromium over a real `tensorboard` process.

Every check goes through the whole stack: summaries written by TensorFlow,
read by TensorBoard's default (Rust) data path, served by the plugin, drawn
by the frontend inside TensorBoard's iframe. Pixels are read back from the
canvas in the page and the mouse is moved for real.

Run alone with `python -m pytest -n0 tests/test_browser.py`. Also writes the
README picture: `python tests/test_browser.py readme LOGDIR docs/gradients_tab.png`
(LOGDIR from `tb-gradcheck demo --no-serve --logdir LOGDIR`).
"""

import json
import re
import sys
import time
import urllib.parse

import numpy as np
import pytest

from conftest import TensorBoardProcess

API = "/data/plugin/gradients/"
WIDE = {"width": 1400, "height": 900}
NARROW = {"width": 900, "height": 900}
GROWING_STEPS = 20


def write_growing(path, first, count):
    """A small run written with GradientWriter, steps first..first+count-1 (appendable)."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, name="a"),
                                 tf.keras.layers.Dense(2, name="b")], name="small")
    x = tf.random.normal([8, 4], seed=1)
    with GradientWriter(str(path)) as writer:
        for step in range(first, first + count):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            writer.write(grads, model.trainable_variables, tf.constant(step, tf.int64))


CHECK_MISMATCH = ("small/b", (4, 5))  # layer, check writes (steps 40 and 50) that fail
CHECK_ERROR = 0.034


def write_checks(path):
    """Gradient-check records at layer granularity, every 10 steps; small/b fails at steps 40 and 50.

    Written with the stored layout from tb_gradcheck.metadata (rows x
    analytic, numeric, relative_error, status) until the writer has a public
    check method for this test to call instead.
    """
    import tensorflow as tf
    from tensorboard.compat.proto import summary_pb2

    from tb_gradcheck import metadata

    rows = ["small/a", "small/b"]
    content = metadata.check_layout("layer", rows)
    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = metadata.PLUGIN_NAME
    md.plugin_data.content = metadata.encode(content)
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    ok, bad = metadata.CHECK_STATUSES.index("ok"), metadata.CHECK_STATUSES.index("mismatch")
    col = {c: i for i, c in enumerate(metadata.CHECK_COLUMNS)}

    def record(error, status):
        cells = {"analytic": 1.0, "numeric": 1.0, "relative_error": error, "noise_floor": 1e-6, "min_detectable_error": 0.02,
                 "status": status}
        return [cells[c] for c in metadata.CHECK_COLUMNS]

    with tf.summary.create_file_writer(str(path)).as_default():
        for k in range(GROWING_STEPS // 10 * 5):
            t = np.array([record(1e-5, ok), record(2e-5, ok)], np.float32)
            if k in CHECK_MISMATCH[1]:
                t[1, col["relative_error"]], t[1, col["status"]] = CHECK_ERROR, bad
            tf.summary.write(metadata.tag_for(content), tf.constant(t), step=10 * k, metadata=md)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    from tb_gradcheck import demo

    path = tmp_path_factory.mktemp("browser") / "logs"
    demo.write_runs(str(path), steps=200)
    write_growing(path / "growing", 0, GROWING_STEPS)
    write_growing(path / "checked", 0, 100)
    write_checks(path / "checked")
    return path


@pytest.fixture(scope="module")
def tb(logdir):
    # --reload_interval 1: the live-refresh test appends data and waits for it.
    proc = TensorBoardProcess(logdir, extra_flags=["--reload_interval", "1"])
    try:
        proc.wait_for_steps("sigmoid", 200)
        proc.wait_for_steps("relu_he", 200)
        proc.wait_for_steps("growing", GROWING_STEPS)
        proc.wait_for_steps("checked", 100)
        yield proc
    finally:
        proc.close()


def api(tb, route, **params):
    return tb.get_json(API + route + ("?" + urllib.parse.urlencode(params) if params else ""))


# --- page helpers -------------------------------------------------------------


class Tab:
    """One page showing TensorBoard at #gradients, and the plugin's iframe."""

    def __init__(self, browser, url, viewport=WIDE):
        self.context = browser.new_context(viewport=viewport, device_scale_factor=1)
        self.page = self.context.new_page()
        self.errors = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url + "/#gradients")
        self.attach()

    def attach(self):
        """Finds the plugin's iframe and waits for its first drawing."""
        self.frame = None
        deadline = time.time() + 30
        while self.frame is None and time.time() < deadline:
            for f in self.page.frames:
                if "plugin_entry" in f.url:
                    self.frame = f
            self.page.wait_for_timeout(50)  # lets Playwright process frame events
        assert self.frame is not None, "the Gradients iframe never appeared"
        self.frame.wait_for_function("() => window.tbGradcheck !== undefined", timeout=30000)
        self.wait_ready()

    def wait_ready(self):
        # ready is "0" while a request is out; give the page a frame to start one first.
        self.frame.wait_for_timeout(50)
        self.frame.wait_for_function("() => document.body.dataset.ready === '1'", timeout=30000)

    def state(self):
        return self.frame.evaluate("() => window.tbGradcheck.state()")

    def select(self, selector, value):
        self.frame.select_option(selector, value)
        self.wait_ready()

    def click(self, selector):
        self.frame.click(selector)
        self.wait_ready()

    def visible(self, selector):
        return self.frame.locator(selector).is_visible()

    def box(self, selector):
        """The element's box in page coordinates (what page.mouse uses)."""
        return self.frame.locator(selector).bounding_box()

    def row_colours(self, canvas_id="heatmap", x_fraction=None):
        """Mean RGB of each drawn row of a canvas (device pixels read back in the page)."""
        rows = len(self.state()["rows"])
        return self.frame.evaluate(
            """([id, rows, xf]) => {
                const c = document.getElementById(id);
                const ctx = c.getContext('2d');
                const data = ctx.getImageData(0, 0, c.width, c.height).data;
                const out = [];
                for (let r = 0; r < rows; r++) {
                  const y = Math.floor((r + 0.5) * c.height / rows);
                  let x0 = 0, x1 = c.width;
                  if (xf !== null) { x0 = Math.floor(xf * c.width); x1 = x0 + 1; }
                  const sum = [0, 0, 0];
                  for (let x = x0; x < x1; x++) {
                    const i = (y * c.width + x) * 4;
                    for (let k = 0; k < 3; k++) sum[k] += data[i + k];
                  }
                  out.push(sum.map((s) => s / (x1 - x0)));
                }
                return out;
            }""",
            [canvas_id, rows, x_fraction],
        )

    def cell_point(self, row, col, canvas="#heatmap"):
        """Page coordinates of the centre of (row, column) of a heatmap."""
        s = self.state()
        b = self.box(canvas)
        rows = len(s["otherRows"] if canvas != "#heatmap" else s["rows"])
        return b["x"] + (col + 0.5) * b["width"] / s["columns"], b["y"] + (row + 0.5) * b["height"] / rows

    def hover(self, x, y):
        """Moves the real mouse to page point (x, y); returns the tooltip as {key: value}."""
        self.page.mouse.move(x - 3, y - 3)
        self.page.mouse.move(x, y, steps=2)
        self.frame.wait_for_function("() => !document.getElementById('tooltip').hidden", timeout=5000)
        self.frame.wait_for_timeout(50)  # one animation frame: the tooltip follows the last move
        return dict(self.frame.evaluate(
            """() => [...document.querySelectorAll('#tooltip .tip-row')].map(
                (r) => [r.querySelector('.tip-key').textContent, r.querySelector('.tip-value').textContent])"""
        ))

    def client_point(self, x, y):
        """Page point -> the iframe's client coordinates (what cellAt takes)."""
        b = self.page.locator("iframe").bounding_box()
        return x - b["x"], y - b["y"]

    def close(self):
        assert not self.errors, self.errors
        self.context.close()


@pytest.fixture
def tab(browser, tb):
    t = Tab(browser, tb.url)
    yield t
    t.close()


def float32_close(text, expected):
    # The tooltip prints the shortest decimal that reads back as the same
    # float32, so parsing it gives the stored float32 exactly; 1e-6 relative
    # covers float64 printing of that value and nothing more.
    return float(text.rstrip("\u00d7")) == pytest.approx(float(expected), rel=1e-6)


# --- tests ----------------------------------------------------------------------


def test_heatmap_draws_one_row_per_layer_with_distinct_colours(tab, tb, artifacts):
    tab.select("#run-select", "sigmoid")
    state = tab.state()
    runs = {r["run"]: r for r in api(tb, "runs")["runs"]}
    heat = api(tb, "heatmap", run="sigmoid", metric="grad_norm")
    assert state["run"] == "sigmoid" and state["metric"] == "grad_norm" and state["drawn"]
    assert state["rows"] == heat["layers"] == runs["sigmoid"]["granularities"]["layer"]["rows"]
    assert len(tab.frame.locator("#row-labels .row-label").all()) == len(state["rows"])
    colours = np.array(tab.row_colours())
    # Vanishing gradients: the norm falls by orders of magnitude toward the
    # input, so on viridis each row is a visibly different colour, darkest at
    # the input side.
    diffs = np.abs(np.diff(colours, axis=0)).sum(axis=1)
    assert (diffs > 3).all(), colours
    luminance = colours @ [0.299, 0.587, 0.114]
    assert luminance[0] < luminance[-1] - 100, luminance
    tab.page.screenshot(path=str(artifacts / "gradients_tab_heatmap.png"))


def test_hover_tooltip_shows_the_layer_and_value_the_api_returns(tab, tb):
    tab.select("#run-select", "sigmoid")
    state = tab.state()
    heat = api(tb, "heatmap", run="sigmoid", metric="grad_norm", width=state["columns"])
    assert state["columns"] == len(heat["steps"]) == 200  # 200 steps fit the canvas: one column per step
    for row, col in [(3, 120), (10, 7), (0, 199)]:
        x, y = tab.cell_point(row, col)
        fields = tab.hover(x, y)
        assert fields["run"] == "sigmoid"
        assert fields["layer"] == heat["layers"][row]
        assert fields["step"] == str(heat["steps"][col])
        assert float32_close(fields["grad_norm"], heat["values"][col][row]), (fields, heat["values"][col][row])
        cell = tab.frame.evaluate("([x, y]) => window.tbGradcheck.cellAt(x, y)", list(tab.client_point(x, y)))
        assert cell["rowName"] == heat["layers"][row] and cell["step"] == heat["steps"][col]
    # The hovered row's label lights up, and leaving hides the tooltip.
    assert tab.frame.locator("#row-labels .row-label.active").inner_text() == "dense_0"
    tab.page.mouse.move(5, 5)
    tab.frame.wait_for_function("() => document.getElementById('tooltip').hidden")


def test_metric_granularity_and_scale_switches_redraw(tab, tb):
    tab.select("#run-select", "sigmoid")
    before = np.array(tab.row_colours())

    tab.select("#metric-select", "grad_max_abs")
    s = tab.state()
    assert s["metric"] == "grad_max_abs" and s["drawn"]
    assert not np.allclose(before, tab.row_colours())
    assert "max |gradient|" in tab.frame.locator("#legend").inner_text()

    tab.click("#granularity button[data-value=variable]")
    s = tab.state()
    variables = api(tb, "runs")["runs"]
    variables = next(r for r in variables if r["run"] == "sigmoid")["granularities"]["variable"]["rows"]
    assert s["granularity"] == "variable" and s["rows"] == variables and len(variables) == 22
    assert tab.frame.locator("#granularity button[data-value=variable]").get_attribute("aria-pressed") == "true"

    loads = s["loads"]
    log_colours = np.array(tab.row_colours())
    tab.click("#scale button[data-value=linear]")
    s = tab.state()
    assert s["scale"] == "linear"
    assert s["loads"] == loads  # same data, new colours: no request
    assert not np.allclose(log_colours, tab.row_colours())

    # The selection survives a reload of the page (localStorage).
    tab.page.reload()
    tab.attach()
    s = tab.state()
    assert (s["run"], s["metric"], s["granularity"], s["scale"]) == ("sigmoid", "grad_max_abs", "variable", "linear")


def test_empty_logdir_shows_how_to_write_data(browser, tmp_path, artifacts):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = TensorBoardProcess(empty)
    try:
        t = Tab(browser, proc.url)
        assert t.visible("#empty")
        assert "No gradient data was found yet" in t.frame.locator("#empty").inner_text()
        assert not t.visible("#heatmap") and not t.visible("#findings") and not t.visible("#error")
        t.page.screenshot(path=str(artifacts / "gradients_tab_empty.png"))
        t.close()
    finally:
        proc.close()


def test_a_4xx_answer_is_shown_with_the_servers_message(tab):
    # The page asks for a metric the run does not have; the real server
    # answers 404 and names it, and the tab shows that, not a stale picture.
    def bad_metric(route):
        url = re.sub(r"metric=[^&]*", "metric=no_such_metric", route.request.url)
        route.continue_(url=url)

    tab.frame.page.route(re.compile(r".*/data/plugin/gradients/heatmap\?.*"), bad_metric)
    tab.select("#run-select", "sigmoid")
    error = tab.frame.locator("#error")
    assert error.is_visible()
    text = error.inner_text()
    assert "404" in text and "no_such_metric" in text, text
    assert not tab.visible("#heatmap")
    tab.page.unroute(re.compile(r".*/data/plugin/gradients/heatmap\?.*"))
    tab.click("#refresh")
    assert not tab.visible("#error") and tab.state()["drawn"]


def test_findings_panel_lists_vanishing_and_a_click_highlights_its_cells(tab, tb, artifacts):
    tab.select("#run-select", "sigmoid")
    tab.frame.wait_for_function("() => window.tbGradcheck.state().findings !== null")
    expected = api(tb, "findings", run="sigmoid")["findings"]
    assert [f["kind"] for f in expected] == ["vanishing"]
    vanishing = expected[0]
    panel = tab.frame.locator("#findings")
    assert panel.is_visible()
    item = panel.locator("li.finding[data-kind=vanishing]")
    text = item.inner_text()
    assert "Vanishing gradients" in text and "WARNING" in text.upper() and "steps 0\u2013199" in text
    assert item.locator(".layer-name").all_inner_texts() == vanishing["layers"]
    # Affected rows are marked beside their labels without any click.
    marks = tab.frame.locator("#row-marks .row-mark.sev-warning")
    assert marks.count() == len(vanishing["layers"])

    untouched = tab.row_colours("heatmap")
    item.locator(".finding-main").click()
    tab.wait_ready()
    s = tab.state()
    assert s["activeFinding"] == "vanishing" and s["metric"] == vanishing["metric"]
    assert [h[0] for h in s["highlight"]] == vanishing["layers"]
    for name, first, last in s["highlight"]:
        e = vanishing["evidence"][name]
        assert first <= e["first_step"] and last >= e["last_step"]
    # The overlay washes out the other cells and leaves the highlighted ones clear.
    alpha = tab.frame.evaluate(
        """(rows) => {
            const c = document.querySelector('#main-pane .heatmap-overlay');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            return [0, rows - 1].map((r) => d[(Math.floor((r + 0.5) * c.height / rows) * c.width + Math.floor(c.width / 2)) * 4 + 3]);
        }""",
        len(s["rows"]),
    )
    assert alpha[0] == 0 and alpha[1] > 100, alpha
    assert tab.row_colours("heatmap") == untouched  # the base image is not redrawn
    assert "active" in item.get_attribute("class")
    tab.page.screenshot(path=str(artifacts / "gradients_tab.png"))

    # Evidence opens with formatted numbers.
    item.locator("summary").click()
    evidence = item.locator(".evidence-table").inner_text()
    assert "mlp/dense_0" in evidence and "orders below later layers" in evidence
    assert re.search(r"\d\.\d{1,2}\b", evidence)

    tab.page.keyboard.press("Escape")
    tab.frame.wait_for_function("() => window.tbGradcheck.state().activeFinding === null")
    assert tab.state()["highlight"] == []

    tab.select("#run-select", "relu_he")
    tab.frame.wait_for_function("() => window.tbGradcheck.state().findingsRun === 'relu_he' && window.tbGradcheck.state().findings !== null")
    assert "No findings: gradients look healthy" in panel.inner_text()
    assert tab.frame.locator("#row-marks .row-mark").count() == 0


def test_compare_ratio_and_side_by_side(tab, tb, artifacts):
    tab.select("#run-select", "sigmoid")
    tab.select("#compare-select", "relu_he")
    s = tab.state()
    assert s["compare"] == {"other": "relu_he", "mode": "side"}
    assert s["otherRows"] == s["rows"]  # same model: the union is each run's rows
    assert tab.visible("#heatmap-other")
    other_heat = api(tb, "heatmap", run="relu_he", metric="grad_norm")
    x, y = tab.cell_point(2, 50, canvas="#heatmap-other")
    fields = tab.hover(x, y)
    assert fields["run"] == "relu_he" and fields["layer"] == "mlp/dense_2"
    assert float32_close(fields["grad_norm"], other_heat["values"][50][2])
    tab.page.screenshot(path=str(artifacts / "gradients_compare_side.png"))

    tab.click("#compare-mode button[data-value=ratio]")
    s = tab.state()
    assert s["compare"]["mode"] == "ratio" and s["scale"] == "ratio" and s["drawn"]
    ratio = api(tb, "compare", run="sigmoid", other="relu_he", metric="grad_norm", width=s["columns"])
    assert s["rows"] == ratio["layers"] and ratio["only_in_run"] == [] and ratio["only_in_other"] == []
    colours = np.array(tab.row_colours())
    # sigmoid's input-side gradients are orders of magnitude below relu_he's:
    # a ratio far below 1, the blue end of the diverging map.
    r, g, b = colours[0]
    assert b > r + 60, colours[0]
    assert not tab.visible("#heatmap-other")
    legend = tab.frame.locator("#legend").inner_text()
    assert "1\u00d7" in legend and "relu_he larger" in legend
    x, y = tab.cell_point(0, 100)
    fields = tab.hover(x, y)
    assert fields["runs"] == "sigmoid \u00f7 relu_he"
    # The ratio is float64 (run / other) printed to 7 significant digits.
    assert float(fields["ratio (grad_norm)"].rstrip("\u00d7")) == pytest.approx(ratio["values"][100][0], rel=1e-6)
    tab.page.screenshot(path=str(artifacts / "gradients_compare_ratio.png"))


def test_gradient_check_outlines_mismatches_and_lists_the_failing_layer(tab, tb):
    tab.select("#run-select", "checked")
    tab.select("#metric-select", "check_error")
    s = tab.state()
    heat = api(tb, "heatmap", run="checked", metric="check_error")
    assert s["rows"] == heat["layers"] == ["small/a", "small/b"] and s["drawn"]
    # The check exists at layer granularity only: Variable is disabled.
    assert tab.frame.locator("#granularity button[data-value=variable]").is_disabled()
    assert "mismatch" in tab.frame.locator("#legend").inner_text()
    col = heat["steps"].index(40)
    # The mismatch cell carries the magenta outline (#ff00e5) on the base canvas.
    outline = tab.frame.evaluate(
        """([row, col, rows, cols]) => {
            const c = document.getElementById('heatmap');
            const x = Math.floor(col * c.width / cols) + 1, y = Math.floor((row + 0.5) * c.height / rows);
            return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));
        }""",
        [1, col, 2, len(heat["steps"])],
    )
    assert outline == [255, 0, 229], outline
    fields = tab.hover(*tab.cell_point(1, col))
    assert fields["layer"] == "small/b" and fields["check"] == "mismatch"
    assert float32_close(fields["check_error"], CHECK_ERROR)
    tab.frame.wait_for_function("() => window.tbGradcheck.state().findings !== null")
    item = tab.frame.locator("#findings li.finding[data-kind=check_failure]")
    assert item.locator(".layer-name").all_inner_texts() == ["small/b"]
    assert item.locator(".layer-number").all_inner_texts() == ["rel. error 3.4%"]
    assert "steps 40\u201350" in item.inner_text() and "sev-error" in item.get_attribute("class")
    item.locator(".finding-main").click()
    tab.wait_ready()
    assert tab.state()["highlight"] == [["small/b", 40, 50]]


def test_narrow_window_puts_findings_under_the_heatmap(browser, tb, artifacts):
    t = Tab(browser, tb.url, viewport=NARROW)
    try:
        t.select("#run-select", "sigmoid")
        t.frame.wait_for_function("() => window.tbGradcheck.state().findings !== null")
        plot, panel = t.box("#heatmap"), t.box("#findings")
        assert panel["y"] >= plot["y"] + plot["height"]
        assert plot["x"] + plot["width"] <= NARROW["width"]
        # Nothing sticks out sideways.
        assert t.frame.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
        t.page.screenshot(path=str(artifacts / "gradients_tab_narrow.png"), full_page=True)
    finally:
        t.close()
    wide = Tab(browser, tb.url)
    try:
        wide.select("#run-select", "sigmoid")
        plot, panel = wide.box("#heatmap"), wide.box("#findings")
        assert panel["x"] >= plot["x"] + plot["width"] and panel["y"] < plot["y"] + plot["height"]
    finally:
        wide.close()


def test_poll_refetches_only_when_the_run_changed_and_keeps_the_selection(tab, tb, logdir):
    tab.select("#run-select", "growing")
    tab.select("#metric-select", "grad_max_abs")
    tab.click("#scale button[data-value=linear]")
    s = tab.state()
    assert s["steps"] == GROWING_STEPS
    loads = s["loads"]
    tab.frame.evaluate("() => window.tbGradcheck.poll()")
    assert tab.state()["loads"] == loads  # nothing new: no refetch

    write_growing(logdir / "growing", GROWING_STEPS, 5)
    tb.wait_for_steps("growing", GROWING_STEPS + 5)
    tab.frame.evaluate("() => window.tbGradcheck.poll()")
    tab.wait_ready()
    s = tab.state()
    assert s["steps"] == GROWING_STEPS + 5 and s["loads"] == loads + 1
    assert (s["run"], s["metric"], s["scale"]) == ("growing", "grad_max_abs", "linear")


# --- README picture ---------------------------------------------------------------


def readme_picture(logdir, out):
    """docs/gradients_tab.png: the sigmoid demo at 1400x900, its finding shown."""
    from playwright.sync_api import sync_playwright

    from conftest import CHROMIUM, CHROMIUM_ARGS

    proc = TensorBoardProcess(logdir)
    try:
        proc.wait_for_steps("sigmoid", 1000)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            t = Tab(browser, proc.url)
            t.select("#run-select", "sigmoid")
            t.frame.wait_for_function("() => window.tbGradcheck.state().findings !== null")
            t.click("#findings li.finding[data-kind=vanishing] .finding-main")
            x, y = t.cell_point(2, int(t.state()["columns"] * 0.62))
            t.hover(x, y)
            t.page.screenshot(path=out)
            t.close()
            browser.close()
    finally:
        proc.close()


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "readme":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    readme_picture(sys.argv[2], sys.argv[3])
    print(json.dumps({"wrote": sys.argv[3]}))
