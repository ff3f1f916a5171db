"""Hostile names in a real browser: markup in layer, run and tag names is shown as text and never runs.

The names go in the way a user's would: Keras layer names (Keras 3 refuses
only "/"), a run directory name, and the tag of an unreadable summary.
Every payload, if it ever became markup, would set window.__pwned and open
a dialog; the test listens for both in the page and in the plugin's iframe,
after the tab has drawn the heatmap, listed the findings, shown the
problems, and shown the tooltip under the real mouse.
"""

import csv
import os
import time
import urllib.parse

import pytest

from conftest import ROOT
from conftest import TensorBoardProcess
from rawlogs import stats_points
from rawlogs import write_raw

IMG = '<img src=x onerror="window.__pwned=1;alert(1)">'
LAYERS = [
    IMG,  # vanishing: it is named in the findings too
    "<svg onload=window.__pwned=2;alert(2)>",
    "a\"b'c`d\\e",
    "\u202eevil\u200f RTL \u05e9\u05dc\u05d5\u05dd",
    "日本語 レイヤー",
    "z" * 300,
]
# Keras refuses "/" in a layer name; a plain tf.Variable takes it (and is its own layer).
RAW = "</span><script>window.__pwned=3</script><b>bold</b>"
ROWS = [f"m/{n}" for n in LAYERS] + [RAW]
RUN = "<img src=x onerror=window.__pwned=5;alert(5)> &a=%20#x?\u202e"
TAG = 'gradients/stats/<img src=x onerror="window.__pwned=4;alert(4)">'
UNREADABLE = "unreadable_only"
PAGE_ARGS = {"viewport": {"width": 1400, "height": 900}, "device_scale_factor": 1}


@pytest.fixture(scope="module")
def tb(tmp_path_factory):
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    logdir = tmp_path_factory.mktemp("hostile") / "logs"
    model = tf.keras.Sequential([tf.keras.Input((3,))] + [tf.keras.layers.Dense(3, name=n) for n in LAYERS], name="m")
    assert [layer.name for layer in model.layers] == LAYERS  # Keras kept every name as given
    variables = model.trainable_variables + [tf.Variable(tf.ones([2]), name=RAW)]
    with GradientWriter(logdir / RUN) as writer:
        for step in range(30):
            vanishing = (f"m/{IMG}/", f"m/{LAYERS[3]}/")
            scale = [1e-12 if getattr(v, "path", "").startswith(vanishing) else 1.0 for v in variables]
            writer.write([tf.fill(v.shape, s) for v, s in zip(variables, scale)], variables, step)
    write_raw(logdir / RUN, stats_points(1, range(2)), tag=TAG, content=b"not json")  # a problem with a hostile tag
    # A run with nothing readable: the tab must say why it shows nothing.
    write_raw(
        logdir / UNREADABLE,
        stats_points(1, range(2)),
        tag="gradients/stats/future",
        content=b'{"version": 99, "kind": "stats"}',
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = TensorBoardProcess(logdir, env=env)
    try:
        entry = proc.wait_for_steps(RUN, 30)
        assert entry["granularities"]["layer"]["rows"] == ROWS
        yield proc
    finally:
        proc.close()


def plugin_frame(page):
    deadline = time.time() + 30
    while time.time() < deadline:
        for frame in page.frames:
            if "plugin_entry" in frame.url:
                return frame
        page.wait_for_timeout(50)
    raise AssertionError("the Gradients iframe never appeared")


def wait_ready(frame):
    frame.wait_for_timeout(50)
    frame.wait_for_function("() => window.tbGradcheck && document.body.dataset.ready === '1'", timeout=30000)


def test_hostile_names_show_as_literal_text_and_run_no_script(browser, tb):
    context = browser.new_context(**PAGE_ARGS)
    page = context.new_page()
    dialogs, errors = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(tb.url + "/#gradients")
        frame = plugin_frame(page)
        wait_ready(frame)
        frame.wait_for_function("() => window.tbGradcheck.state().findings !== null", timeout=30000)
        wait_ready(frame)
        state = frame.evaluate("() => window.tbGradcheck.state()")
        assert state["run"] == RUN and state["rows"] == ROWS and state["drawn"]

        # The run selector: the name, as text, and as the value it sends back.
        option = frame.evaluate(
            "() => { const o = document.querySelector('#run-select option'); return [o.textContent, o.value]; }"
        )
        assert option == [RUN, RUN]

        # Row labels: the full name in the title and the text (long names are
        # shortened with an ellipsis in the middle, never cut into markup).
        labels = frame.evaluate(
            "() => [...document.querySelectorAll('#row-labels .row-label')].map("
            "(n) => [n.querySelector('.row-text').textContent, n.title])"
        )
        assert [title for _, title in labels] == ROWS
        for text, name in labels:
            head, _, tail = text.partition("\u2026")
            assert text == name or (name.startswith(head) and name.endswith(tail)), (text, name)
        assert labels[0][0].startswith("m/<img src=x") and labels[-1][0].startswith("</span><script>")

        # The findings panel names the vanishing layer literally, in the message and the chip.
        findings = frame.evaluate(
            "() => [...document.querySelectorAll('#findings-list .finding')].map((n) => n.textContent)"
        )
        assert any(f"m/{IMG}" in text and "anishing" in text for text in findings), findings
        # The right-to-left override in a name ends with the name (a bidi isolate), so it
        # cannot reverse the rest of the message: the numbers after it read as written.
        messages = frame.evaluate("() => [...document.querySelectorAll('.finding-message')].map((n) => n.textContent)")
        vanishing = next(m for m in messages if m.startswith("Vanishing"))
        assert f"\u2068m/{LAYERS[3]}\u2069" in vanishing and f"\u2068m/{IMG}\u2069" in vanishing, vanishing
        # And as drawn: after the names, "gradient" is still left of "norm" (an override
        # leaking out of the name draws the rest of the sentence right to left).
        order = frame.evaluate("""() => {
            const node = [...document.querySelectorAll('.finding-message')].find((n) => n.textContent.startsWith('Vanishing'));
            const text = node.firstChild, at = text.textContent.indexOf(': gradient norm');
            const x = (i) => { const r = document.createRange(); r.setStart(text, i); r.setEnd(text, i + 1); return r.getBoundingClientRect().x; };
            return [x(at + 2), x(at + 11)];
        }""")
        assert order[0] < order[1], order
        chips = frame.evaluate(
            "() => [...document.querySelectorAll('.layer-chip .layer-name')].map((n) => n.textContent)"
        )
        assert f"m/{IMG}" in chips, chips

        # The problems box lists the unreadable tag by its name.
        problems = frame.evaluate("() => document.getElementById('problems').textContent")
        assert TAG in problems and "not UTF-8 JSON" in problems, problems

        # The tooltip, under the real mouse, over each row in turn.
        box = frame.locator("#heatmap").bounding_box()
        for row, name in enumerate(ROWS):
            x, y = box["x"] + box["width"] / 2, box["y"] + (row + 0.5) * box["height"] / len(ROWS)
            page.mouse.move(x - 2, y - 2)
            page.mouse.move(x, y, steps=2)
            frame.wait_for_function("() => !document.getElementById('tooltip').hidden", timeout=5000)
            frame.wait_for_timeout(50)
            tip = dict(
                frame.evaluate(
                    "() => [...document.querySelectorAll('#tooltip .tip-row')].map("
                    "(r) => [r.querySelector('.tip-key').textContent, r.querySelector('.tip-value').textContent])"
                )
            )
            assert tip["layer"] == name and tip["run"] == RUN, tip

        # The download link carries the hostile run name through the URL and back.
        href = frame.evaluate("() => document.getElementById('download').href")
        assert urllib.parse.parse_qs(urllib.parse.urlparse(href).query)["run"] == [RUN]
        fetched = frame.evaluate(
            "async (u) => { const r = await fetch(u); return [r.status, (await r.text()).split('\\n')[0]]; }", href
        )
        assert fetched[0] == 200 and next(csv.reader([fetched[1]])) == ["step"] + ROWS, fetched

        # Nothing ran and nothing became markup.
        for where in (page, frame):
            assert where.evaluate("() => window.__pwned") is None
        markup = frame.evaluate("() => document.querySelectorAll('img, svg, [onerror], [onload]').length")
        # The only script is TensorBoard's own entry script, which imports index.js and calls render().
        scripts = frame.evaluate("() => [...document.querySelectorAll('script')].map((n) => n.textContent)")
        assert markup == 0 and len(scripts) == 1 and "m.render()" in scripts[0], (markup, scripts)
        assert dialogs == [] and errors == [], (dialogs, errors)
    finally:
        context.close()


def test_a_run_with_only_unreadable_tags_shows_why(browser, tb):
    context = browser.new_context(**PAGE_ARGS)
    page = context.new_page()
    errors = []
    heatmap_requests = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: heatmap_requests.append(r.url) if "/heatmap?" in r.url else None)
    try:
        page.goto(tb.url + "/#gradients")
        frame = plugin_frame(page)
        wait_ready(frame)
        heatmap_requests.clear()
        frame.select_option("#run-select", UNREADABLE)
        wait_ready(frame)
        assert frame.evaluate("() => window.tbGradcheck.state().run") == UNREADABLE
        problems = frame.locator("#problems")
        assert problems.is_visible()
        text = problems.text_content()
        assert "gradients/stats/future" in text and "written by a newer tb_gradcheck (content version 99" in text, text
        error = frame.evaluate(
            "() => { const e = document.getElementById('error'); return e.hidden ? null : e.textContent; }"
        )
        assert error == f"Nothing in run {UNREADABLE} can be read; see the problems above.", error
        assert heatmap_requests == [], heatmap_requests  # nothing to ask for, so nothing asked
        assert errors == [], errors
    finally:
        context.close()
