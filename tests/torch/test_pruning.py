"""``torch.nn.utils.prune``: units the mask removes are pruned, not dead (``tb_gradcheck/core/deadunits.py``).

Pruning keeps ``weight_orig`` as the parameter and multiplies it by the
buffer ``weight_mask`` in a forward pre-hook, so a masked element's gradient
is exactly 0 by construction. Structured pruning (``ln_structured``,
``dim=0``) masks whole output rows: a bias-less layer's pruned units get no
gradient at all. Counted as dead, 80% pruned read "dead from
initialisation: a bias or weight scale initialised wrong", a warning on a
run whose loss fell from 4.2 to 0.007. They are left out of the fraction;
the units the layer still has are judged as before.
"""

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn

from tb_gradcheck.findings import diagnose
from tb_gradcheck.reader import queries
from tb_gradcheck.reader import store
from tb_gradcheck.torch import GradientWriter
from tests.torch.test_writer import DEVICES
from tests.torch.test_writer import _rows

torch.set_num_threads(1)


def _model(bias, amount):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 64, bias=bias), nn.ReLU(), nn.Linear(64, 1))
    prune.ln_structured(model[2], "weight", amount=amount, n=2, dim=0)
    return model


def _batch():
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(1))
    return x, x[:, :4].sum(1, keepdim=True)


@pytest.mark.parametrize("device", DEVICES)
def test_pruned_units_are_left_out_of_the_dead_fraction_and_the_rest_are_counted(tmp_path, device):
    """48 of 64 rows pruned, 8 of the other 16 dead (weights below 0 on ReLU inputs): 8 / 16 dead, not 56 / 64."""
    for bias in (False, True):
        model = _model(bias, 0.75)
        layer = model[2]
        kept = np.flatnonzero(layer.weight_mask.sum(1).numpy() > 0)
        assert len(kept) == 16
        with torch.no_grad():
            layer.weight_orig[kept[:8]] = -1.0  # inputs are ReLU outputs (>= 0): no positive pre-activation
            if bias:
                layer.bias[kept[:8]] = -1.0
                layer.bias[np.flatnonzero(layer.weight_mask.sum(1).numpy() == 0)[:10]] = -1.0  # 10 pruned: dead bias
        run = tmp_path / str(bias)
        model.to(device)
        writer = GradientWriter(str(run), model)
        x, y = (t.to(device) for t in _batch())
        for step in range(3):  # on a GPU the written step is a CUDA graph from the second write: replayed at the third
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            writer.write(step)
        grads = {n: p.grad.double().cpu().numpy() for n, p in model.named_parameters()}
        writer.close()
        rows = (grads["2.weight_orig"] == 0).all(axis=1)
        assert rows.sum() == 48 + 8  # the premise: every pruned row and the 8 planted get no gradient
        _, variables, _ = _rows(run, "variable")
        np.testing.assert_allclose(variables["2.weight_orig"]["dead_unit_fraction"], 8 / 16)
        _, layers, _ = _rows(run, "layer")
        if bias:
            # A pruned row whose bias is not masked is still a unit, its bias: dead where the bias gets no gradient.
            units = rows & (grads["2.bias"] == 0)
            assert units.sum() > 8
            np.testing.assert_allclose(layers["2"]["dead_unit_fraction"], units.mean())
        else:
            np.testing.assert_allclose(layers["2"]["dead_unit_fraction"], 8 / 16)
        assert layers["0"]["dead_unit_fraction"] == 0.0


def test_a_healthy_run_with_most_of_a_layer_pruned_has_no_dead_finding(tmp_path):
    model = _model(False, 0.8)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    writer = GradientWriter(str(tmp_path / "run"), model, optimizer=optimizer)
    x, y = _batch()
    losses = []
    for step in range(100):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        writer.write(step)
        optimizer.step()
    writer.close()
    assert losses[-1] < losses[0] / 10  # the premise: it learns
    s, ctx, eid = store.local_store(str(tmp_path))
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, "run"), "stats", "layer")
    found = diagnose.find("run", matrix)
    assert not [f for f in found if f.severity in ("warning", "error")], [f.message for f in found]


@pytest.mark.parametrize("device", DEVICES)
def test_pruning_again_during_training_is_followed(tmp_path, device):
    """Iterative pruning replaces the mask buffer: each written step reads the mask the forward pass used."""
    model = _model(False, 0.5).to(device)
    writer = GradientWriter(str(tmp_path), model)
    x, y = (t.to(device) for t in _batch())
    pruned = []
    for step in range(6):
        if step == 3:
            prune.ln_structured(model[2], "weight", amount=0.5, n=2, dim=0)  # half of the rows left: 48 of 64
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        pruned.append(int((model[2].weight_mask.sum(1) == 0).sum()))
        rows = (model[2].weight_orig.grad == 0).all(dim=1).cpu().numpy()
        kept = (model[2].weight_mask.sum(1) > 0).cpu().numpy()
        want = rows[kept].mean()  # dead among the rows the mask keeps
        writer.write(step)
        writer.flush()
        _, variables, _ = _rows(tmp_path, "variable")
        np.testing.assert_allclose(variables["2.weight_orig"]["dead_unit_fraction"], want, err_msg=f"step {step}")
    writer.close()
    assert pruned == [32, 32, 32, 48, 48, 48]
