"""The forward-side findings on runs written by ``tb_gradcheck.torch.GradientWriter(activations=True)``.

Each run is trained (or driven) by PyTorch, written through the real writer
and read back by ``tb-gradcheck report --format json`` (TensorBoard's
multiplexer under the reader): saturated sigmoid layers named beside the
vanishing gradient they cause, the dead-by-output fraction in a dead
finding, activations that grow by orders, massive activations, and a
healthy run with none of them.
"""

import json

import pytest
import torch
from torch import nn

from tb_gradcheck import cli
from tb_gradcheck.findings import diagnose
from tb_gradcheck.torch import GradientWriter

torch.set_num_threads(1)


def _report(capsys, run_dir):
    cli.main(["report", str(run_dir), "--format", "json", "--fail-on", "never"])
    body = json.loads(capsys.readouterr().out)
    (run,) = body["runs"].values()
    return {f["kind"]: f for f in run["findings"]}


def _fit(run_dir, model, x, y, steps, lr=0.1, drive=None):
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with GradientWriter(run_dir, model, optimizer=optimizer, activations=True) as writer:
        for step in range(steps):
            if drive is not None:
                drive(model, step)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            writer.write(step)
            optimizer.step()


def deep_sigmoid(scaled=(0, 2, 4, 6), gain=30.0):
    """Eight Linear + Sigmoid layers; the ``scaled`` ones' weights ``gain`` times their default: saturated."""
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(32, 32), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(32, 1))
    with torch.no_grad():
        for i in scaled:
            model[i].weight.mul_(gain)
    return model


def test_saturated_sigmoid_layers_are_named_beside_the_vanishing_gradient(tmp_path, capsys):
    torch.manual_seed(1)
    _fit(tmp_path, deep_sigmoid(), torch.randn(64, 32), torch.randn(64, 1), steps=30)
    found = _report(capsys, tmp_path)
    assert set(found["saturated"]["layers"]) == {"0", "2", "4", "6"}
    assert all(e["max_saturated_fraction"] >= 0.5 for e in found["saturated"]["evidence"].values())
    vanishing = found["vanishing"]
    saturated = [n for n, e in vanishing["evidence"].items() if e.get("median_saturated_fraction", 0) >= 0.5]
    assert saturated and set(saturated) <= {"0", "2", "4", "6"}
    assert "tanh/sigmoid outputs are saturated in" in vanishing["message"]


def test_dead_finding_gives_the_dead_by_output_fraction(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[2].bias.fill_(-100.0)  # no positive pre-activation for any input: every unit dead
    torch.manual_seed(1)
    _fit(tmp_path, model, torch.randn(64, 8), torch.randn(64, 1), steps=12)
    dead = _report(capsys, tmp_path)["dead"]
    e = dead["evidence"]["2"]
    assert e["dead_by_output"] == 1.0 and e["median_dead_unit_fraction"] == 1.0 and e["views_disagree"] is False
    assert "By output, 100% of units had no positive value." in dead["message"]


def test_each_dead_layer_of_a_chain_is_named_by_its_own_outputs(tmp_path, capsys):
    """Layers 2, 4 and 6 have no positive output for any input; layer 0's units live.

    By gradient only layer 6 shows its units: none passes a gradient, so the
    layers before it get none and are cut off. Their outputs show their own
    units: 2 and 4 are as dead as 6 (fixing 6 alone leaves them dead), 0 is
    alive, and still no gradient reaches the three layers before 6.
    """
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(8, 8), nn.ReLU())], nn.Linear(8, 1))
    with torch.no_grad():
        for i in (2, 4, 6):
            model[i].bias.fill_(-100.0)
    torch.manual_seed(1)
    x = torch.randn(64, 8)
    silent = {}
    for i in (1, 3, 5, 7):  # the ReLUs after layers 0, 2, 4, 6, on the run's inputs
        model[i].register_forward_hook(
            lambda m, a, out, i=i: silent.__setitem__(i - 1, float((out <= 0).all(0).float().mean()))
        )
    with torch.no_grad():
        model(x)
    assert silent[0] < 0.5 and silent[2] == silent[4] == silent[6] == 1.0  # the premise, on the units' outputs
    _fit(tmp_path, model, x, torch.randn(64, 1), steps=12)
    dead = _report(capsys, tmp_path)["dead"]
    assert dead["layers"] == ["2", "4", "6"]
    assert {n: e["state"] for n, e in dead["evidence"].items()} == {"2": "silent", "4": "silent", "6": "silent"}
    assert dead["evidence"]["6"]["layers_cut_off_behind"] == 3
    assert "no gradient reaches the 3 layers before it" in dead["message"]


def test_a_disagreement_between_gradient_and_output_is_said(tmp_path, capsys):
    # Layer 0's ReLU passes positive outputs, but layer 2's weights are zero and frozen: no gradient reaches
    # layer 0's units, which the gradient view calls dead and the output view alive.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].bias.fill_(1.0)
        model[2].weight.zero_()
    model[2].weight.requires_grad_(False)
    torch.manual_seed(1)
    _fit(tmp_path, model, torch.randn(64, 8), torch.randn(64, 1), steps=12)
    dead = _report(capsys, tmp_path)["dead"]
    e = dead["evidence"]["0"]
    assert e["median_dead_unit_fraction"] == 1.0 and e["dead_by_output"] == 0.0 and e["views_disagree"] is True
    assert "The gradient and the output disagree in 0 (Linear)" in diagnose.describe(_as_finding(dead), str)


class Scale(nn.Module):
    """x * w, elementwise: a row whose output the test sets directly."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * self.weight


@pytest.mark.parametrize("start, steps", [(1.0, 24), (1e-3, 30)])
def test_activations_growing_by_orders_are_found(tmp_path, capsys, start, steps):
    # A LayerNorm after the growing layer keeps the loss and the gradients from growing with it: the forward
    # view alone sees the growth. From 1e-3 it is counted from unit scale, and found once it is 2 orders past it.
    model = nn.Sequential(Scale(16), nn.LayerNorm(16), nn.Linear(16, 1))
    x, y = torch.randn(32, 16), torch.randn(32, 1)

    def grow(model, step):  # the weights double every step: the outputs too, start * 2**step
        with torch.no_grad():
            model[0].weight.fill_(start * 2.0**step)

    _fit(tmp_path, model, x, y, steps=steps, lr=0.0, drive=grow)
    found = _report(capsys, tmp_path)
    assert "exploding" not in found
    growth = found["activation_growth"]
    assert growth["layers"] == ["0"] and growth["severity"] == "warning"
    assert growth["evidence"]["0"]["max_growth_orders"] >= 2


class LayerScale(nn.Module):
    """A residual branch scaled by a learned vector that starts tiny (CaiT, DeiT-III, ConvNeXt: 1e-5 or 1e-6)."""

    def __init__(self, width, init=1e-6):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((width,), init))

    def forward(self, x):
        return x * self.gamma


class ScaledBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.scale = LayerScale(width)

    def forward(self, x):
        return x + self.scale(self.fc2(nn.functional.gelu(self.fc1(self.norm(x)))))


def test_a_layer_scale_rising_toward_unit_scale_is_not_growth(tmp_path, capsys):
    # Adam moves each gamma by about the learning rate a step, so the branches' outputs rise from 1e-6 of their
    # input's scale to about 0.1 while the loss falls: 2.4 orders above their first writes, all below unit scale.
    # Counted from their start, every LayerScale was flagged as growing toward a divergence.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), ScaledBlock(32), ScaledBlock(32), nn.LayerNorm(32), nn.Linear(32, 1))
    x = torch.randn(256, 8)
    y = torch.sin(3 * x[:, :1]) * x[:, 1:2]
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    losses = []
    with GradientWriter(tmp_path, model, optimizer=optimizer, activations=True) as writer:
        for step in range(150):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            writer.write(step)
            optimizer.step()
            losses.append(loss.item())
    # The premise: it learns, and the branches rose by over 2 orders without reaching unit scale.
    assert losses[-1] < 0.5 * losses[0]
    gamma = model[1].scale.gamma.detach().abs().mean().item()
    assert 1e-2 < gamma < 0.5
    assert "activation_growth" not in _report(capsys, tmp_path)


def test_massive_activations_use_the_literatures_thresholds(tmp_path, capsys):
    # One value of 1e4 among 4 million unit-scale ones: |a| > 100 and about 2,000 times the RMS.
    torch.manual_seed(0)
    x = torch.randn(4096, 1024)
    x[7, 3] = 1e4
    model = nn.Sequential(Scale(1024), nn.Linear(1024, 1))
    _fit(tmp_path / "massive", model, x, torch.zeros(4096, 1), steps=8, lr=0.0)
    massive = _report(capsys, tmp_path / "massive")["massive_activations"]
    assert massive["layers"] == ["0"] and massive["severity"] == "info"
    assert massive["evidence"]["0"]["max_abs_activation"] == pytest.approx(1e4, rel=1e-6)
    # The same outlier at 1e2 is under a thousand times the RMS: not massive.
    x[7, 3] = 1e2
    _fit(tmp_path / "plain", nn.Sequential(Scale(1024), nn.Linear(1024, 1)), x, torch.zeros(4096, 1), 8, lr=0.0)
    assert "massive_activations" not in _report(capsys, tmp_path / "plain")


def test_a_healthy_run_has_no_forward_side_finding(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    torch.manual_seed(1)
    _fit(tmp_path, model, torch.randn(64, 8), torch.randn(64, 1), steps=30, lr=0.05)
    assert not set(_report(capsys, tmp_path)) & {"saturated", "activation_growth", "massive_activations"}


def _as_finding(body):
    from tb_gradcheck.findings import finding

    return finding.Finding(
        body["kind"],
        body["severity"],
        "run",
        body["layers"],
        body["steps"],
        body["metric"],
        "last",
        "",
        body["evidence"],
        labels={"0": "0 (Linear)"},
    )


def test_units_without_gradient_in_a_saturated_tanh_layer_are_its_saturated_units_not_idle_relu_units(tmp_path, capsys):
    """Pixel values 0-255 fed unnormalised into a tanh MLP: the first layer's pre-activations are in the hundreds.

    tanh's derivative rounds to exactly 0 in float32 there, so most of its units get no gradient on whole
    batches. That is the saturation (one cause, one finding), not "idle units, common in healthy ReLU networks".
    """
    torch.manual_seed(0)
    x = (128 + 40 * torch.randn(64, 32)).round().clamp(0, 255)  # pixels around mid-grey
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    saturated = (model[1](model[0](x)).abs() > 0.99).float().mean()
    assert saturated > 0.5  # the premise, measured on the outputs
    _fit(tmp_path, model, x, torch.randn(64, 1), steps=30, lr=1e-3)
    found = _report(capsys, tmp_path)
    assert "dead" not in found, found.get("dead", {}).get("message")
    sat = found["saturated"]
    assert sat["layers"] == ["0"]
    (dead,) = [c for c in sat["consequences"] if c["kind"] == "dead"]
    assert dead["layers"] == ["0"] and dead["evidence"]["0"]["median_dead_unit_fraction"] > 0.25
    assert "It explains what followed: dead units in" in sat["message"]
