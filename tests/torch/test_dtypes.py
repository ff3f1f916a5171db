"""The PyTorch writer on parameters that are not float32: complex (``torch.cfloat``, ``torch.cdouble``) weights.

A complex gradient's statistics are its elements' moduli's: ``grad_norm``
is ``sqrt(sum |z|^2)``, ``grad_max_abs`` the largest ``|z|`` (not the
largest real or imaginary part), a zero is ``z == 0`` (both parts), a unit
is dead where every ``z`` of it is 0. The twins here compute them in
float64 from the ``.grad`` the optimizer applies.
"""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import read_events
from conftest import stats_content
from tb_gradcheck.torch import GradientWriter
from tests.torch.test_writer import DEVICES
from tests.torch.test_writer import _rows

torch.set_num_threads(1)


class _Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=torch.cfloat)
        self.gain = nn.Parameter(torch.randn(2, dtype=torch.cdouble))

    def forward(self, x):
        return self.lin(x)[:, :2] * self.gain  # output 2 of ``lin`` is never used: its unit gets no gradient


def _twin(g, units_axis0=True):
    g = g.detach().to(torch.complex128)
    a = g.abs()
    units = a.reshape(a.shape[0], -1) if units_axis0 else a.reshape(-1, 1)
    return {
        "grad_norm": float(torch.sqrt((a**2).sum())),
        "grad_max_abs": float(a.max()),
        "grad_zero_fraction": float((g == 0).double().mean()),
        "grad_nonfinite": float((~torch.isfinite(g)).sum()),
        "dead_unit_fraction": float((units == 0).all(dim=1).double().mean()),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_complex_parameters_statistics_are_their_moduli(tmp_path, device):
    torch.manual_seed(0)
    model = _Complex().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = GradientWriter(str(tmp_path), model, optimizer=optimizer)
    x = torch.randn(16, 4, dtype=torch.cfloat, device=device)
    optimizer.zero_grad()
    model(x).abs().pow(2).mean().backward()
    grads = {n: p.grad.cpu().clone() for n, p in model.named_parameters()}
    weights = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    # The premise: a gradient whose largest part is not its largest modulus, and one unit dead.
    g = grads["lin.weight"]
    assert float(g.abs().max()) > float(torch.view_as_real(g).abs().max()) * 1.01
    assert (grads["lin.bias"][2] == 0) and not (grads["lin.bias"][:2] == 0).any()
    writer.write(0)
    optimizer.step()
    writer.close()
    _, variables, _ = _rows(tmp_path, "variable")
    for name, grad in grads.items():
        want = _twin(grad)
        want["weight_norm"] = float(weights[name].to(torch.complex128).abs().pow(2).sum().sqrt())
        want["update_norm"] = float(
            (model.get_parameter(name).detach().cpu() - weights[name]).to(torch.complex128).abs().pow(2).sum().sqrt()
        )
        for column, value in want.items():
            np.testing.assert_allclose(variables[name][column], value, rtol=1e-6, err_msg=f"{name} {column}")
    assert variables["lin.weight"]["dead_unit_fraction"] == variables["lin.bias"]["dead_unit_fraction"] == 1 / 3
    _, layers, _ = _rows(tmp_path, "layer")
    both = torch.cat([grads["lin.weight"].ravel(), grads["lin.bias"]]).to(torch.complex128)
    np.testing.assert_allclose(layers["lin"]["grad_norm"], float(both.abs().pow(2).sum().sqrt()), rtol=1e-6)
    np.testing.assert_allclose(layers["lin"]["dead_unit_fraction"], 1 / 3)


@pytest.mark.parametrize("device", DEVICES)
def test_complex_nonfinite_elements_are_counted_in_every_step_of_a_window(tmp_path, device):
    """A NaN in either part makes the element non-finite: flagged between writes, counted at the written step."""
    torch.manual_seed(0)
    model = _Complex().to(device)
    writer = GradientWriter(str(tmp_path), model, every_n_steps=2)
    x = torch.randn(16, 4, dtype=torch.cfloat, device=device)
    for step in (1, 2):  # one window, written at 2
        model.zero_grad()
        model(x).abs().pow(2).mean().backward()
        with torch.no_grad():
            model.lin.weight.grad[0, 0] = complex(0.0, float("nan"))  # only the imaginary part
            model.gain.grad[1] = complex(float("inf"), 1.0)
        writer.write(step)
    writer.close()
    content = stats_content(tmp_path)
    ((step, slabs, _),) = read_events(tmp_path, "stats", "variable")
    assert step == 2
    column = content["columns"].index("grad_nonfinite")
    last, total = content["aggregates"].index("last"), content["aggregates"].index("sum")
    rows = content["variable"]["rows"]
    for name, want in (("lin.weight", 1), ("lin.bias", 0), ("gain", 1)):
        assert slabs[last, rows.index(name), column] == want, name  # the written step's elements
        assert slabs[total, rows.index(name), column] == 2 * want, name  # both steps of the window flagged
