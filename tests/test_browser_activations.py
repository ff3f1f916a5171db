"""Activation metrics in the tab: headless Chromium over a real `tensorboard` process, a deep sigmoid MLP.

Two runs written by ``tb_gradcheck.torch.GradientWriter(activations=True)``:
``sigmoid_saturated`` (eight Linear + Sigmoid layers, the first four with
weights 30 times their default, so their sigmoids saturate) and
``sigmoid_default`` (the same stack at PyTorch's default initialisation).
The tab must offer the activation metrics in its metric picker, draw the
saturated layers apart from the others in the depth x step heatmap, list
them in the findings, and compare the two runs on an activation metric.

Run alone with `python -m pytest -n0 tests/test_browser_activations.py`.
"""

import numpy as np
import pytest

from conftest import TensorBoardProcess
from tests.findings.test_activations import _fit
from tests.findings.test_activations import deep_sigmoid
from tests.test_browser import Tab
from tests.test_browser import api
from tests.test_browser import float32_close

STEPS = 30
SATURATED = ["0", "2", "4", "6"]
METRIC = "act_saturated_fraction"


@pytest.fixture(scope="module")
def tb(tmp_path_factory):
    import torch

    logdir = tmp_path_factory.mktemp("browser_activations")
    for run, model in (("sigmoid_saturated", deep_sigmoid()), ("sigmoid_default", deep_sigmoid(scaled=()))):
        torch.manual_seed(1)
        _fit(logdir / run, model, torch.randn(64, 32), torch.randn(64, 1), steps=STEPS)
    proc = TensorBoardProcess(logdir)
    try:
        proc.wait_for_steps("sigmoid_saturated", STEPS)
        proc.wait_for_steps("sigmoid_default", STEPS)
        yield proc
    finally:
        proc.close()


def test_saturated_layers_stand_out_in_the_activation_heatmap(browser, tb, artifacts):
    tab = Tab(browser, tb.url)
    tab.select("#run-select", "sigmoid_saturated")
    options = tab.frame.locator("#metric-select option").all_inner_texts()
    assert "saturated (tanh/sigmoid) (act_saturated_fraction)" in options and "activation RMS (act_rms)" in options, (
        "|".join(options)
    )
    assert "activation RMS (act_rms)" in options
    tab.select("#metric-select", METRIC)
    s = tab.state()
    assert s["metric"] == METRIC and s["granularity"] == "layer"
    # A fraction opens on the linear scale (0 is a colour there, not log's black "<= 0"); gradient norms stay log.
    assert s["scale"] == "linear"
    # An output is a module's: the activation metric has no variable rows to switch to.
    assert tab.frame.locator("#granularity button[data-value=variable]").is_disabled()
    heat = api(tb, "heatmap", run="sigmoid_saturated", metric=METRIC)
    values = np.array(heat["values"], np.float64)
    rows = heat["layers"]
    saturated = [rows.index(n) for n in SATURATED]
    assert (values[:, saturated] >= 0.5).all()  # 30x weights: most sigmoid outputs within 1% of 0 or 1
    calm = [j for j, n in enumerate(rows) if n not in SATURATED and n != "16"]  # 16 feeds no sigmoid
    assert (values[:, calm] < 0.05).all()
    # Drawn: every saturated row's colour is far from every calm row's.
    colours = np.array(tab.row_colours())
    gap = min(np.abs(colours[i] - colours[j]).sum() for i in saturated for j in calm)
    assert gap > 60, colours
    fields = tab.hover(*tab.cell_point(saturated[0], 10))
    assert fields["layer"] == "0 (Linear)"
    assert float32_close(fields[METRIC], values[10 * len(heat["steps"]) // s["columns"], saturated[0]])
    # The findings name the saturated layers, beside the vanishing gradient they cause.
    tab.frame.wait_for_function("() => window.tbGradcheck.state().findings !== null")
    item = tab.frame.locator("#findings li.finding[data-kind=saturated]")
    assert "Saturated tanh/sigmoid" in item.inner_text()
    assert [n.split(" ")[0] for n in item.locator(".layer-name").all_inner_texts()] == SATURATED
    tab.page.screenshot(path=str(artifacts / "gradients_activations_saturated.png"))
    tab.close()


def test_compare_on_an_activation_metric(browser, tb, artifacts):
    tab = Tab(browser, tb.url)
    tab.select("#run-select", "sigmoid_saturated")
    tab.select("#metric-select", "act_rms")
    tab.select("#compare-select", "sigmoid_default")
    s = tab.state()
    assert s["compare"]["other"] == "sigmoid_default" and s["metric"] == "act_rms" and s["drawn"]
    other = api(tb, "heatmap", run="sigmoid_default", metric="act_rms")
    fields = tab.hover(*tab.cell_point(0, 5, canvas="#heatmap-other"))
    assert fields["run"] == "sigmoid_default"
    assert float32_close(fields["act_rms"], other["values"][5 * len(other["steps"]) // s["columns"]][0])
    tab.page.screenshot(path=str(artifacts / "gradients_activations_compare.png"))
    tab.close()
