"""Compare in the tab: headless Chromium over a real `tensorboard` process, runs whose names share nothing.

The models are built in this one process, as a notebook comparing two
initialisations builds them (Keras numbers their layers apart), plus the
example's runs (examples/vanishing_or_wrong.py), whose models are named after
the run. The tab must pair their rows by structure and say so.

Run alone with `python -m pytest -n0 tests/test_browser_compare.py`.
"""

import pytest

from conftest import TensorBoardProcess
from tests.reader.test_compare import STEPS
from tests.reader.test_compare import functional_and_subclassed
from tests.reader.test_compare import sequential
from tests.reader.test_compare import train
from tests.tensorflow.test_examples import run_example
from tests.test_browser import Tab
from tests.test_browser import api
from tests.test_browser import float32_close

EXAMPLE_STEPS = 7


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    import tensorflow as tf

    tf.keras.backend.clear_session()  # Keras' layer numbering starts over, as in a fresh notebook
    tf.keras.utils.set_random_seed(5)
    path = tmp_path_factory.mktemp("browser_compare") / "logs"
    for run, model in zip(
        ("twin_a", "twin_b", "inserted", "functional", "subclassed"),
        [sequential(), sequential(), sequential(extra=True), *functional_and_subclassed()],
    ):
        train(model, path / run)
    run_example(
        "vanishing_or_wrong.py",
        *("--logdir", path, "--runs", "he_init", "wrong_gradient"),
        *("--steps", EXAMPLE_STEPS, "--check-every", 3, "--hidden", 16),
    )
    return path


@pytest.fixture(scope="module")
def tb(logdir):
    proc = TensorBoardProcess(logdir)
    try:
        for run in ("twin_a", "twin_b", "inserted", "functional", "subclassed"):
            proc.wait_for_steps(run, STEPS)
        for run in ("he_init", "wrong_gradient"):
            proc.wait_for_steps(run, EXAMPLE_STEPS)
        yield proc
    finally:
        proc.close()


@pytest.fixture
def tab(browser, tb):
    t = Tab(browser, tb.url)
    yield t
    t.close()


def note(tab):
    return tab.frame.locator("#align-note").inner_text()


def labels(tab, plot):
    """``(prefix shown above the labels, [full name of each label])`` of one plot: "" or "-other"."""
    return tab.frame.evaluate(
        """(suffix) => {
          const names = [...document.querySelectorAll(`#row-labels${suffix} .row-label`)].map((n) => n.title);
          const plot = document.getElementById(`row-labels${suffix}`).closest('.plot');
          return [plot.querySelector('.row-prefix').textContent, names];
        }""",
        plot,
    )


def listed(tb, run, granularity="layer"):
    return {e["run"]: e for e in api(tb, "runs")["runs"]}[run]["granularities"][granularity]["rows"]


def test_auto_numbered_sequential_twins_align_by_structure_side_by_side_and_as_a_ratio(tab, tb, artifacts):
    a, b = listed(tb, "twin_a"), listed(tb, "twin_b")
    assert not set(a) & set(b)
    tab.select("#run-select", "twin_a")
    tab.select("#compare-select", "twin_b")
    s = tab.state()
    assert s["compare"] == {"other": "twin_b", "mode": "side", "alignment": "structure"}
    assert s["rows"] == a and s["otherRows"] == a
    assert (
        "rows aligned by structure (depth and shapes; sequential/\u2026 \u2194 sequential_1/\u2026): "
        "5 of 5 rows in both twin_a and twin_b"
    ) in note(tab)
    assert tab.frame.locator("#align button[data-value=structure]").get_attribute("aria-pressed") == "true"
    # Each plot labels its rows with its own run's names, row for row: the
    # lower one twin_b's (sequential_1/...), not twin_a's.
    assert labels(tab, "") == ["sequential/", a] and labels(tab, "-other") == ["sequential_1/", b]
    assert s["otherLabels"] == b
    tab.page.screenshot(path=str(artifacts / "gradients_compare_twins_side.png"))
    # Row 1 of the lower heatmap is twin_b's layer normalization, with twin_b's value.
    fields = tab.hover(*tab.cell_point(1, STEPS - 1, canvas="#heatmap-other"))
    other = api(tb, "heatmap", run="twin_b", metric="grad_norm")
    assert fields["run"] == "twin_b" and fields["aligned with"] == b[1] == "sequential_1/layer_normalization_1"
    assert float32_close(fields["grad_norm"], other["values"][STEPS - 1][1])
    tab.click("#compare-mode button[data-value=ratio]")
    s = tab.state()
    assert s["compare"] == {"other": "twin_b", "mode": "ratio", "alignment": "structure"} and s["drawn"]
    assert s["rows"] == a and "5 of 5 rows" in note(tab)
    # By name stays one click away, and then nothing lines up.
    tab.click("#compare-mode button[data-value=side]")
    tab.click("#align button[data-value=name]")
    s = tab.state()
    assert s["compare"]["alignment"] == "name" and s["rows"] == a + b
    assert "rows aligned by name: 0 of 10 rows" in note(tab)


def test_an_inserted_layer_shows_as_only_in_its_run_at_its_depth(tab, tb, artifacts):
    a, b = listed(tb, "twin_a"), listed(tb, "inserted")
    tab.select("#run-select", "twin_a")
    tab.select("#compare-select", "inserted")
    s = tab.state()
    assert s["compare"]["alignment"] == "structure" and len(s["rows"]) == 6
    (only,) = [r for r in s["rows"] if r not in a]
    at = s["rows"].index(only)
    assert only in b and 2 <= at <= 4 and s["rows"][-1] == a[-1]  # among the hidden layers, not after the output
    # The lower plot names every row inserted has by inserted's name, the
    # inserted layer included; the upper one names twin_a's rows and the inserted layer.
    assert s["otherLabels"] == b and labels(tab, "-other")[1] == b
    upper = s["rows"][:at] + [f"{only} (not in twin_a)"] + s["rows"][at + 1 :]
    assert labels(tab, "")[1] == upper
    text = note(tab)
    assert "5 of 6 rows in both twin_a and inserted" in text and f"Only in inserted: {only}" in text
    # The run that lacks the row paints it as absent; the run that has it, with values.
    top = tab.row_colours("heatmap")
    bottom = tab.row_colours("heatmap-other")
    assert top[at] != top[at - 1] and bottom[at] != top[at]
    tab.page.screenshot(path=str(artifacts / "gradients_compare_inserted.png"))
    tab.click("#compare-mode button[data-value=ratio]")
    assert tab.state()["rows"] == s["rows"] and "Only in inserted" in note(tab)
    tab.page.screenshot(path=str(artifacts / "gradients_compare_inserted_ratio.png"))


def test_a_functional_model_aligns_with_its_subclassed_twin(tab, tb):
    tab.select("#run-select", "functional")
    tab.select("#compare-select", "subclassed")
    s = tab.state()
    assert s["compare"]["alignment"] == "structure" and s["rows"] == listed(tb, "functional")
    assert "2 of 2 rows in both functional and subclassed" in note(tab)
    tab.click("#granularity button[data-value=variable]")
    assert tab.state()["compare"]["alignment"] == "structure" and "4 of 4 rows" in note(tab)


def test_the_examples_two_runs_align_by_structure_norms_and_checks(tab, tb, artifacts):
    tab.select("#run-select", "he_init")
    tab.select("#compare-select", "wrong_gradient")
    s = tab.state()
    assert s["compare"]["alignment"] == "structure" and s["rows"] == ["he_init/hidden", "he_init/output"]
    assert "(depth and shapes; he_init/\u2026 \u2194 wrong_gradient/\u2026): 2 of 2 rows" in note(tab)
    fields = tab.hover(*tab.cell_point(1, 0, canvas="#heatmap-other"))
    assert fields["aligned with"] == "wrong_gradient/output"
    assert labels(tab, "-other") == ["wrong_gradient/", ["wrong_gradient/hidden", "wrong_gradient/output"]]
    # The per-variable checks, side by side: the check's rows align the same way.
    tab.select("#metric-select", "check_error")
    tab.click("#granularity button[data-value=variable]")
    s = tab.state()
    assert s["metric"] == "check_error" and s["compare"]["alignment"] == "structure"
    assert s["rows"] == [f"he_init/{v}" for v in ("hidden/kernel", "hidden/bias", "output/kernel", "output/bias")]
    assert "4 of 4 rows" in note(tab)
    fields = tab.hover(*tab.cell_point(2, 0, canvas="#heatmap-other"))
    assert fields["aligned with"] == "wrong_gradient/output/kernel" and fields["check"] == "mismatch"
    tab.page.screenshot(path=str(artifacts / "gradients_compare_example_checks.png"))
