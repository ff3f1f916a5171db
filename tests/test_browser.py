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


def write_growing(path, first, count, name="small", steps=None, every_n_steps=1):
    """A small run written with GradientWriter, steps first..first+count-1 (appendable), or ``steps``."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(3, name="a"), tf.keras.layers.Dense(2, name="b")], name=name
    )
    x = tf.random.normal([8, 4], seed=1)
    with GradientWriter(str(path), every_n_steps=every_n_steps) as writer:
        for step in steps if steps is not None else range(first, first + count):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            writer.write(grads, model.trainable_variables, tf.constant(step, tf.int64))


CHECK_MISMATCH = ("small/b", (4, 5))  # layer, check writes (steps 40 and 50) that fail
CHECK_ERROR = 0.034


def write_checks(path):
    """Gradient-check records at layer granularity, every 10 steps; small/b fails at steps 40 and 50.

    Written with the stored layout from tb_gradcheck.core.metadata (rows x
    analytic, numeric, relative_error, status) until the writer has a public
    check method for this test to call instead.
    """
    import tensorflow as tf
    from tensorboard.compat.proto import summary_pb2

    from tb_gradcheck.core import metadata
    from tb_gradcheck.core import tags

    rows = ["small/a", "small/b"]
    content = metadata.check_layout("layer", rows)
    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = metadata.PLUGIN_NAME
    md.plugin_data.content = metadata.encode(content)
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    ok, bad = metadata.CHECK_STATUSES.index("ok"), metadata.CHECK_STATUSES.index("mismatch")
    col = {c: i for i, c in enumerate(metadata.CHECK_COLUMNS)}

    def record(error, status):
        cells = {
            "analytic": 1.0,
            "numeric": 1.0,
            "relative_error": error,
            "noise_floor": 1e-6,
            "min_detectable_error": 0.02,
            "status": status,
            "float64_recheck": metadata.CHECK_RECHECKS.index("none"),
        }
        return [cells[c] for c in metadata.CHECK_COLUMNS]

    with tf.summary.create_file_writer(str(path)).as_default():
        for k in range(GROWING_STEPS // 10 * 5):
            t = np.array([record(1e-5, ok), record(2e-5, ok)], np.float32)
            if k in CHECK_MISMATCH[1]:
                t[1, col["relative_error"]], t[1, col["status"]] = CHECK_ERROR, bad
            tf.summary.write(tags.tag_for(content), tf.constant(t), step=10 * k, metadata=md)


# A transformer-sized run: 250 blocks of 8 rows (2,000 rows). Blocks 0..44
# have vanishing gradients; one NaN sits in row 1,234 at one step.
BLOCK_PARTS = ("attn/q", "attn/k", "attn/v", "attn/o", "mlp/in", "mlp/out", "ln1", "ln2")
BIG_ROWS = [f"transformer/block_{b:03d}/{p}" for b in range(250) for p in BLOCK_PARTS]
BIG_STEPS = 40
NAN_ROW, NAN_STEP = 1234, 17
VANISHING_BLOCKS = range(0, 45)  # the input side, as vanishing gradients decay toward the input
LONG_RUN = "long_" + "very_" * 28 + "name"
GAPPY_STEPS = list(range(0, 30)) + list(range(90, 100))


def write_big(path):
    """BIG_ROWS x BIG_STEPS, written as GradientWriter's layout by tf.summary.write (fast for 2,000 rows)."""
    from rawlogs import stats_content
    from rawlogs import write_raw
    from tb_gradcheck.core import metadata

    columns = metadata.stored_columns(1)  # written every step: no onset columns
    norm, nonfinite = (columns.index(c) for c in ("grad_norm", "grad_nonfinite"))
    n = len(BIG_ROWS)
    base = np.ones((1, 2 * n + 1, len(columns)), np.float32)
    base[..., columns.index("grad_zero_fraction")] = 0
    base[..., columns.index("dead_unit_fraction")] = 0
    base[..., nonfinite] = 0
    for b in VANISHING_BLOCKS:
        for k in (0, n):  # the layer row and its variable row
            base[0, k + 8 * b : k + 8 * (b + 1), norm] = 1e-9
    points = []
    for step in range(BIG_STEPS):
        arr = base.copy()
        arr[0, :n, norm] *= 1 + 0.3 * np.sin(step / 5 + np.arange(n) / 40)
        arr[0, n : 2 * n, norm] = arr[0, :n, norm]
        arr[0, -1, :] = 0
        arr[0, -1, 0] = step + 1
        if step == NAN_STEP:
            arr[0, [NAN_ROW, n + NAN_ROW], norm] = np.nan
            arr[0, [NAN_ROW, n + NAN_ROW], nonfinite] = 3
        points.append((step, arr))
    write_raw(path, points, content=stats_content(BIG_ROWS))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    from tb_gradcheck import demo

    path = tmp_path_factory.mktemp("browser") / "logs"
    demo.write_runs(str(path), steps=200)
    write_growing(path / "growing", 0, GROWING_STEPS)
    write_growing(path / "checked", 0, 100)
    write_checks(path / "checked")
    write_growing(path / "aaa_healthy", 0, 10)  # alphabetically first, and nothing to find
    write_growing(path / "renamed", 0, GROWING_STEPS, name="other_net")  # same model, another root scope
    write_growing(path / "windowed", 0, 50, every_n_steps=5)
    write_growing(path / "gappy", 0, 0, steps=GAPPY_STEPS)
    write_growing(path / LONG_RUN, 0, 5)
    write_big(path / "transformer")
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
        for run, steps in [
            ("aaa_healthy", 10),
            ("renamed", GROWING_STEPS),
            ("windowed", 10),
            ("gappy", len(GAPPY_STEPS)),
            (LONG_RUN, 5),
            ("transformer", BIG_STEPS),
        ]:
            proc.wait_for_steps(run, steps)
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
        return dict(
            self.frame.evaluate(
                """() => [...document.querySelectorAll('#tooltip .tip-row')].map(
                (r) => [r.querySelector('.tip-key').textContent, r.querySelector('.tip-value').textContent])"""
            )
        )

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
    # The rules are causal: the finding starts once enough writes show it, and runs to the last step.
    assert "Vanishing gradients" in text and "WARNING" in text.upper() and re.search("steps \\d+\u2013199", text)
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
    tab.frame.wait_for_function(
        "() => window.tbGradcheck.state().findingsRun === 'relu_he' && window.tbGradcheck.state().findings !== null"
    )
    assert "No findings: gradients look healthy" in panel.inner_text()
    assert tab.frame.locator("#row-marks .row-mark").count() == 0


def test_compare_ratio_and_side_by_side(tab, tb, artifacts):
    tab.select("#run-select", "sigmoid")
    tab.select("#compare-select", "relu_he")
    s = tab.state()
    assert s["compare"] == {"other": "relu_he", "mode": "side", "alignment": "name"}
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


# --- what a new user tripped on (issue 15), and thousands of rows ---------------


def pixel(tab, canvas_id, fx, fy):
    """RGB of a canvas pixel at fractions (fx, fy) of its size."""
    return tab.frame.evaluate(
        """([id, fx, fy]) => {
            const c = document.getElementById(id);
            const x = Math.min(c.width - 1, Math.floor(fx * c.width)), y = Math.min(c.height - 1, Math.floor(fy * c.height));
            return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));
        }""",
        [canvas_id, fx, fy],
    )


def test_the_tab_opens_on_the_run_with_the_most_severe_findings(tab, tb):
    runs = [r["run"] for r in api(tb, "runs")["runs"]]
    worst = {}
    for run in runs:
        severities = [f["severity"] for f in api(tb, "findings", run=run)["findings"]]
        worst[run] = (
            2 if "error" in severities else 1 if severities else 0,
            severities.count("error") or len(severities),
        )
    assert runs[0] == "aaa_healthy" and worst["aaa_healthy"] == (0, 0)
    expected = max(runs, key=lambda r: (worst[r], -runs.index(r)))
    assert worst[expected][0] == 2
    state = tab.state()
    assert state["run"] == expected and state["findingsRun"] == expected and state["drawn"]


def test_chart_caption_sits_above_the_chart_never_over_its_data(tab):
    tab.select("#run-select", "sigmoid")
    caption, chart = tab.box("#trace-caption"), tab.box("#trace")
    assert caption["height"] > 0 and chart["height"] >= 100
    assert caption["y"] + caption["height"] <= chart["y"] + 0.5, (caption, chart)
    # Hovering a row names it in the caption, still outside the plot.
    tab.hover(*tab.cell_point(10, 100))
    assert tab.frame.locator("#trace-caption").inner_text().startswith("mlp/logits")
    caption = tab.box("#trace-caption")
    assert caption["y"] + caption["height"] <= chart["y"] + 0.5


def test_a_windowed_run_opens_on_max_for_norms(tab, tb):
    tab.select("#run-select", "windowed")
    info = next(r for r in api(tb, "runs")["runs"] if r["run"] == "windowed")
    assert info["window"] == 5 and "max" in info["aggregates"]["grad_norm"]
    s = tab.state()
    assert (s["metric"], s["aggregate"]) == ("grad_norm", "max")
    assert tab.visible("#aggregate-select") and "max of each window" in tab.frame.locator("#status").inner_text()


def test_an_all_zero_metric_says_so_instead_of_a_black_block(tab, tb):
    tab.select("#run-select", "relu_he")
    tab.select("#metric-select", "grad_nonfinite")
    heat = api(tb, "heatmap", run="relu_he", metric="grad_nonfinite")
    assert {v for step in heat["values"] for v in step} == {0.0}
    s = tab.state()
    assert s["allZero"] and not s["drawn"]
    assert tab.visible("#all-zero") and not tab.visible("#heatmap") and not tab.visible("#trace")
    assert "no NaN or Inf" in tab.frame.locator("#all-zero").inner_text()
    tab.select("#metric-select", "grad_norm")
    assert not tab.state()["allZero"] and tab.visible("#heatmap")


def test_the_tab_follows_tensorboards_dark_mode(tab, browser, tb, artifacts):
    tab.select("#run-select", "sigmoid")
    background = "() => getComputedStyle(document.body).backgroundColor"
    assert tab.frame.evaluate(background) == "rgb(255, 255, 255)" and not tab.state()["dark"]
    # TensorBoard's own setting toggles body.dark-mode on the host page.
    tab.page.evaluate("() => document.body.classList.add('dark-mode')")
    tab.frame.wait_for_function("() => window.tbGradcheck.state().dark")
    assert tab.frame.evaluate(background) == "rgb(48, 48, 48)"  # TensorBoard's #303030
    assert tab.frame.evaluate("() => getComputedStyle(document.querySelector('.row-label')).color").startswith(
        "rgba(255, 255, 255"
    )
    tab.page.screenshot(path=str(artifacts / "gradients_tab_dark.png"))
    tab.page.evaluate("() => document.body.classList.remove('dark-mode')")
    tab.frame.wait_for_function("() => !window.tbGradcheck.state().dark")
    # A browser that prefers dark opens TensorBoard dark, and the tab with it.
    context = browser.new_context(viewport=WIDE, color_scheme="dark")
    page = context.new_page()
    try:
        page.goto(tb.url + "/#gradients")
        frame = None
        while frame is None:
            frame = next((f for f in page.frames if "plugin_entry" in f.url), None)
            page.wait_for_timeout(50)
        frame.wait_for_function("() => window.tbGradcheck && window.tbGradcheck.state().drawn", timeout=30000)
        assert page.evaluate("() => document.body.classList.contains('dark-mode')")
        assert frame.evaluate("() => window.tbGradcheck.state().dark")
    finally:
        context.close()


def test_the_toolbar_keeps_its_line_with_a_long_run_name(tab):
    tab.select("#run-select", "sigmoid")
    tab.select("#compare-select", "relu_he")
    height = tab.box(".toolbar")["height"]
    assert height < 2 * tab.box("#run-select")["height"] + 40  # one line of controls
    tab.select("#run-select", LONG_RUN)
    tab.select("#compare-select", "sigmoid")
    assert tab.state()["run"] == LONG_RUN and tab.state()["compare"]["other"] == "sigmoid"
    toolbar, select = tab.box(".toolbar"), tab.box("#run-select")
    assert toolbar["height"] <= height + 1, (height, toolbar)
    assert select["width"] <= 200
    assert tab.frame.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert tab.frame.locator("#run-select").get_attribute("title") == LONG_RUN


def test_a_sampled_series_has_a_linear_step_axis(tab):
    tab.select("#run-select", "gappy")
    s = tab.state()
    assert s["columns"] == len(GAPPY_STEPS) and (s["firstStep"], s["lastStep"]) == (0, 99)
    axis, ticks = tab.box("#heatmap"), tab.frame.locator(".x-tick")
    positions = {}
    for k in range(ticks.count()):
        b = ticks.nth(k).bounding_box()
        positions[int(ticks.nth(k).inner_text().replace(",", ""))] = (b["x"] + b["width"] / 2 - axis["x"]) / axis[
            "width"
        ]
    # Step 50 lies halfway along 0..99 (with equal columns it would sit at 30/40).
    assert abs(positions[50] - 0.505) < 0.02, positions
    # The cell under the middle of the plot is step 29's, stretched over the gap to step 90.
    fields = tab.hover(axis["x"] + axis["width"] * 0.6, axis["y"] + 5)
    assert fields["step"] == "29"


def test_compare_aligns_runs_whose_models_were_named_differently(tab, tb, artifacts):
    tab.select("#run-select", "growing")
    tab.select("#compare-select", "renamed")
    s = tab.state()
    assert s["compare"] == {"other": "renamed", "mode": "side", "alignment": "structure"}
    assert s["rows"] == ["small/a", "small/b"] and s["otherRows"] == s["rows"]
    note = tab.frame.locator("#align-note").inner_text()
    assert "aligned by structure (depth and shapes; small/\u2026 \u2194 other_net/\u2026): 2 of 2 rows" in note
    fields = tab.hover(*tab.cell_point(1, 5, canvas="#heatmap-other"))
    other = api(tb, "heatmap", run="renamed", metric="grad_norm")
    assert fields["run"] == "renamed" and fields["aligned with"] == "other_net/b"
    assert float32_close(fields["grad_norm"], other["values"][5][1])
    tab.page.screenshot(path=str(artifacts / "gradients_compare_structure.png"))
    # Ratio by structure: the server aligns the same way.
    tab.click("#compare-mode button[data-value=ratio]")
    ratio = api(tb, "compare", run="growing", other="renamed", metric="grad_norm", align="structure")
    assert tab.state()["compare"]["alignment"] == "structure"
    assert (
        ratio["alignment"] == "structure"
        and ratio["only_in_run"] == []
        and ratio["other_layers"] == ["other_net/a", "other_net/b"]
    )
    assert tab.state()["drawn"]
    # By name stays available, and then nothing lines up.
    tab.click("#compare-mode button[data-value=side]")
    tab.click("#align button[data-value=name]")
    s = tab.state()
    assert s["compare"]["alignment"] == "name" and len(s["rows"]) == 4
    assert "Only in growing: small/a, small/b" in tab.frame.locator("#align-note").inner_text()


def test_two_thousand_rows_fit_the_window_and_keep_a_lone_nan(tab, artifacts):
    tab.select("#run-select", "transformer")
    s = tab.state()
    assert len(s["rows"]) == 2000 and len(s["displayRows"]) == 2000 and len(s["groups"]) == 250
    heat = tab.box("#heatmap")
    assert heat["y"] + heat["height"] <= WIDE["height"], heat  # every row is above the fold
    assert s["pixelRows"] == round(heat["height"])
    # The NaN in row 1,234 is red in its pixel row, and the tooltip there names it.
    y = (NAN_ROW + 0.5) / 2000
    x = (NAN_STEP + 0.5) / BIG_STEPS
    assert pixel(tab, "heatmap", x, y) == [255, 23, 68]
    fields = tab.hover(heat["x"] + x * heat["width"], heat["y"] + y * heat["height"])
    assert BIG_ROWS[NAN_ROW] in fields["layers"] and fields["grad_norm (max)"] == "NaN", fields
    tab.page.screenshot(path=str(artifacts / "gradients_tab_2000_rows.png"))
    # The findings name the 360 vanishing layers by their ends and count.
    tab.frame.wait_for_function("() => window.tbGradcheck.state().findings !== null")
    summary = tab.frame.locator("li.finding[data-kind=vanishing] .finding-summary").inner_text()
    assert summary == "transformer/block_000 \u2026 block_044, 360 layers", summary
    assert tab.frame.locator("li.finding[data-kind=vanishing] .layer-chip").count() <= 4


def test_blocks_collapse_filter_and_zoom(tab, tb):
    tab.select("#run-select", "transformer")
    tab.click("#collapse-all")
    s = tab.state()
    assert len(s["displayRows"]) == 250 and s["displayRows"][154] == "transformer/block_154/ (8)"
    # A collapsed block shows its max: the NaN of row 1,234 is in block 154.
    assert pixel(tab, "heatmap", (NAN_STEP + 0.5) / BIG_STEPS, 154.5 / 250) == [255, 23, 68]
    tab.frame.locator('#row-labels .group-toggle[data-group="transformer/block_000/"]').click()
    assert len(tab.state()["displayRows"]) == 257
    tab.click("#expand-all")
    tab.frame.fill("#row-filter", "mlp/out")
    tab.wait_ready()
    s = tab.state()
    assert len(s["displayRows"]) == 250 and all(r.endswith("mlp/out") for r in s["displayRows"])
    tab.frame.fill("#row-filter", "")
    tab.wait_ready()
    # Drag a box over the middle rows and steps 10..29: the server sends those steps.
    loads = tab.state()["loads"]
    box = tab.box("#heatmap")
    x0, x1 = box["x"] + box["width"] * 10.2 / BIG_STEPS, box["x"] + box["width"] * 29.8 / BIG_STEPS
    y0, y1 = box["y"] + box["height"] * 0.6, box["y"] + box["height"] * 0.65
    tab.page.mouse.move(x0, y0)
    tab.page.mouse.down()
    tab.page.mouse.move(x1, y1, steps=4)
    tab.page.mouse.up()
    tab.wait_ready()
    s = tab.state()
    assert s["loads"] == loads + 1 and (s["firstStep"], s["lastStep"]) == (10, 29)
    first, last = s["zoom"]["rows"]
    assert abs(first - 1200) <= 4 and abs(last - 1300) <= 4 and len(s["displayRows"]) == last - first + 1
    assert "Zoomed" in tab.frame.locator("#zoom-note").inner_text()
    tab.click("#reset-zoom")
    s = tab.state()
    assert s["zoom"] is None and len(s["displayRows"]) == 2000 and s["lastStep"] == BIG_STEPS - 1


# --- README picture ---------------------------------------------------------------


def readme_picture(logdir, out):
    """docs/gradients_tab.png: the sigmoid demo at 1400x900, its finding shown."""
    from playwright.sync_api import sync_playwright

    from conftest import CHROMIUM
    from conftest import CHROMIUM_ARGS

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


def test_rows_named_by_an_index_show_their_class(browser, tmp_path, artifacts):
    # A top-level nn.Sequential written by the PyTorch writer: its rows are 0, 2, 4; the tab labels them
    # "0 (Linear)" in the row labels, the tooltip and the finding's chips, and finds them by that label.
    import torch
    from torch import nn

    from tb_gradcheck.torch import GradientWriter

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    with GradientWriter(tmp_path / "sequential", model, optimizer=optimizer) as writer:
        for step in range(40):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            writer.clip_grad_norm_(1e-4)  # binds at every step: a finding that names the rows
            writer.write(step)
            optimizer.step()
    proc = TensorBoardProcess(tmp_path)
    try:
        proc.wait_for_steps("sequential", 40)
        t = Tab(browser, proc.url)
        labels = [e.inner_text() for e in t.frame.locator("#row-labels .row-label").all()]
        assert labels == ["0 (Linear)", "2 (Linear)", "4 (Linear)"]
        assert t.state()["rows"] == ["0", "2", "4"]  # matched by name
        fields = t.hover(*t.cell_point(1, 10))
        assert fields["layer"] == "2 (Linear)"
        chips = [e.inner_text() for e in t.frame.locator("#findings .layer-chip .layer-name").all()]
        assert chips and all(c.endswith("(Linear)") for c in chips)
        t.frame.fill("#row-filter", "linear")
        t.wait_ready()
        assert len(t.frame.locator("#row-labels .row-label").all()) == 3
        t.page.screenshot(path=str(artifacts / "gradients_tab_sequential.png"))
        t.close()
    finally:
        proc.close()
