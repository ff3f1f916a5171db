"""tb_gradcheck.torch.GradientWriter against float64 twins: every statistic, depth order, units, windows.

The twins compute each statistic from its definition (docs/stored_format.md,
tb_gradcheck.tensorflow.units) in float64 NumPy on copies of the gradients the writer
read; the writer's events are read back with TensorBoard's own event file
loader (conftest.read_events).
"""

import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from conftest import read_events
from conftest import stats_content
from tb_gradcheck.core import metadata
from tb_gradcheck.torch import GradientWriter
from tb_gradcheck.torch import modules
from tb_gradcheck.torch import reductions

# Stored values are float32 of float64 statistics: one float32 rounding (2**-24 ~ 6e-8) apart.
RTOL = 1e-6
# The gradients' own device: a GPU where there is one (the reductions run there).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# One intra-op thread: these models are tiny, and on a shared 2-core machine PyTorch's thread pool made
# each step tens of times slower than one thread.
torch.set_num_threads(1)


class Zoo(nn.Module):
    """One of each module kind whose units the writer knows, registered out of forward order."""

    def __init__(self):
        super().__init__()
        self.head = weight_norm(nn.Linear(4, 3))  # registered first, runs last
        self.embed = nn.Embedding(10, 6)
        self.conv = nn.Conv1d(6, 8, 3, padding=1)
        self.deconv = nn.ConvTranspose1d(8, 4, 3, groups=2, padding=1)
        self.norm = nn.LayerNorm(4)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True, add_bias_kv=True)
        self.bn = nn.BatchNorm1d(4)
        self.unused = nn.Linear(3, 3)  # gets no gradient
        self.gain = nn.Parameter(torch.ones(()))
        self.frozen = nn.Linear(2, 2).requires_grad_(False)  # no row at all

    def forward(self, tokens):
        x = self.embed(tokens).transpose(1, 2)  # [B, 6, T]
        x = torch.relu(self.conv(x))
        x = self.deconv(x).transpose(1, 2)  # [B, T, 4]
        x = self.norm(x)
        x, _ = self.attn(x, x, x)
        x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        return self.head(x * self.gain).mean(dim=1)


ZOO_LAYERS = ["embed", "conv", "deconv", "norm", "attn", "attn.out_proj", "bn", "head", "gain", "unused"]


def _zoo_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (5, 7), generator=g), torch.randn(5, 3, generator=g)


def _unit_rows(model, name, g):
    """float64 ``[units, elements]``: the gradient's units as rows, by the definition for its module."""
    owner = name.rsplit(".", 1)[0] if "." in name else ""
    if ".parametrizations." in name:
        owner = name.split(".parametrizations.")[0]
    module = model.get_submodule(owner) if owner else model
    short = name.rsplit(".", 1)[-1]
    if g.ndim == 0:
        return g.reshape(1, 1)
    if isinstance(module, nn.Embedding) or (isinstance(module, nn.MultiheadAttention) and short.startswith("bias_")):
        return g.reshape(-1, g.shape[-1]).T
    if isinstance(module, nn.ConvTranspose1d) and short == "weight":
        groups, per_in, per_out = module.groups, g.shape[0] // module.groups, g.shape[1]
        return np.stack(
            [
                g[(o // per_out) * per_in : (o // per_out + 1) * per_in, o % per_out].ravel()
                for o in range(groups * per_out)
            ]
        )
    return g.reshape(g.shape[0], -1)


def _twin(model, grads):
    """``(layer rows, variable rows)`` of stored columns, each ``{name: {column: value}}``, in float64 NumPy."""
    variables, layers = {}, {}
    owners = {}
    for name, g in grads.items():
        owner = name.split(".parametrizations.")[0] if ".parametrizations." in name else name.rsplit(".", 1)[0]
        owner = owner if "." in name else name
        owners.setdefault(owner, []).append(name)
        if g is None:
            variables[name] = None
            continue
        units = _unit_rows(model, name, g)
        dead = ~(units != 0).any(axis=1)  # NaN != 0: not dead
        variables[name] = {
            "grad_norm": np.sqrt(np.sum(g.astype(np.float64) ** 2)),
            "grad_max_abs": np.max(np.abs(g)) if g.size else 0.0,
            "grad_zero_fraction": np.mean(g == 0) if g.size else 0.0,
            "grad_nonfinite": np.sum(~np.isfinite(g)),
            "dead_unit_fraction": dead.mean(),
            "_dead": dead,
        }
    for owner, names in owners.items():
        here = [n for n in names if variables[n] is not None]
        if not here:
            layers[owner] = None
            continue
        last = _unit_rows(model, names[-1], np.zeros(tuple(model.get_parameter(names[-1]).shape)))
        unit_count = last.shape[0]
        same = [variables[n]["_dead"] for n in here if len(variables[n]["_dead"]) == unit_count]
        size = sum(grads[n].size for n in here)
        layers[owner] = {
            "grad_norm": np.sqrt(sum(variables[n]["grad_norm"] ** 2 for n in here)),
            "grad_max_abs": max(variables[n]["grad_max_abs"] for n in here),
            "grad_zero_fraction": sum(np.sum(grads[n] == 0) for n in here) / size,
            "grad_nonfinite": sum(variables[n]["grad_nonfinite"] for n in here),
            "dead_unit_fraction": np.logical_and.reduce(same).mean() if same else -1.0,
        }
    return layers, variables


def _rows(run_dir, granularity, index=-1):
    content = stats_content(run_dir)
    names = content[granularity]["rows"]
    events = read_events(run_dir, "stats", granularity)
    step, array, _ = events[index]
    return step, {n: dict(zip(content["columns"], array[0, i])) for i, n in enumerate(names)}, content


def _assert_rows(
    stored,
    expected,
    columns=("grad_norm", "grad_max_abs", "grad_zero_fraction", "grad_nonfinite", "dead_unit_fraction"),
):
    for name, want in expected.items():
        got = stored[name]
        if want is None:
            assert all(got[c] == -1.0 for c in columns), (name, got)
            continue
        for c in columns:
            np.testing.assert_allclose(got[c], want[c], rtol=RTOL, err_msg=f"{name} {c}")


def _backward(model, seed=0):
    tokens, target = (t.to(next(model.parameters()).device) for t in _zoo_batch(seed))
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(tokens), target).backward()


def _grads(model):
    return {
        n: (None if p.grad is None else p.grad.detach().double().cpu().numpy().copy())
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def test_rows_are_modules_by_path_in_the_order_they_first_run(tmp_path):
    torch.manual_seed(0)
    model = Zoo()
    writer = GradientWriter(tmp_path, model)
    _backward(model)
    writer.write(0)
    writer.close()
    content = stats_content(tmp_path)
    assert content["layer"]["rows"] == ZOO_LAYERS
    assert content["variable"]["rows"][:3] == ["embed.weight", "conv.weight", "conv.bias"]
    assert "head.parametrizations.weight.original1" in content["variable"]["rows"]
    assert not any(r.startswith("frozen") for r in content["variable"]["rows"])


@pytest.mark.parametrize("device", DEVICES)
def test_every_statistic_matches_its_float64_twin_on_real_gradients(tmp_path, device):
    torch.manual_seed(0)
    model = Zoo().to(device)
    with torch.no_grad():
        model.conv.weight[2:5] = 0.0  # channels 2-4 never reach the output: dead units
        model.conv.bias[2:5] = -1e3
    writer = GradientWriter(tmp_path, model)
    _backward(model)
    writer.write(3)
    grads = _grads(model)
    weights = {n: p.detach().double().cpu().numpy() for n, p in model.named_parameters() if p.requires_grad}
    writer.close()
    layers, variables = _twin(model.cpu(), grads)
    step, stored_v, content = _rows(tmp_path, "variable")
    _, stored_l, _ = _rows(tmp_path, "layer")
    assert step == 3
    assert variables["conv.weight"]["dead_unit_fraction"] == pytest.approx(3 / 8)
    _assert_rows(stored_v, variables)
    _assert_rows(stored_l, layers)
    for name, w in weights.items():
        np.testing.assert_allclose(stored_v[name]["weight_norm"], np.linalg.norm(w.ravel()), rtol=RTOL)
    assert stored_l["unused"]["grad_norm"] == -1.0 and stored_l["unused"]["weight_norm"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_planted_nan_inf_zeros_and_tiny_values_match_the_twin(tmp_path, device):
    model = Zoo().to(device)
    writer = GradientWriter(tmp_path, model)
    _backward(model)  # records the forward order
    rng = np.random.default_rng(1)
    for name, p in model.named_parameters():
        if not p.requires_grad or name.startswith("unused"):
            continue
        g = rng.normal(size=p.shape) * 1e-30  # float32 squares underflow; float64 accumulation does not
        if g.ndim >= 2:
            g[0] = 0.0
        p.grad = torch.tensor(g, dtype=torch.float32, device=device)
    model.conv.weight.grad[1, 0, 0] = float("nan")
    model.deconv.weight.grad[3, 1, 2] = float("inf")
    model.norm.weight.grad[:] = 0.0
    writer.write(0)
    grads = _grads(model)
    writer.close()
    layers, variables = _twin(model.cpu(), grads)
    _, stored_v, _ = _rows(tmp_path, "variable")
    _, stored_l, _ = _rows(tmp_path, "layer")
    assert np.isnan(stored_l["conv"]["grad_norm"]) and stored_l["deconv"]["grad_norm"] == np.inf
    assert stored_v["norm.weight"]["dead_unit_fraction"] == 1.0
    for rows in (stored_v, stored_l):
        for name, got in rows.items():
            for c in ("grad_norm", "grad_max_abs"):
                if np.isfinite(got[c]) and got[c] > 0:
                    assert got[c] < 1e-28, (name, c, got[c])
    _assert_rows(stored_v, variables)
    _assert_rows(stored_l, layers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "scale", [0.0, 1e-42, 1e-30, 1e-12, 1.0, 1e12, 1e30, float("inf"), float("nan")], ids=lambda s: f"{s:g}"
)
def test_norms_match_float64_at_every_magnitude(scale, dtype):
    # float32 squares underflow below 1e-19 and overflow above 1e19, float64 ones below 1e-154 and above
    # 1e154: the multi-tensor norms accumulate float32 in float64 and scale float64 by its largest element.
    rng = np.random.default_rng(0)
    values = rng.normal(size=(300, 7))
    values[3] = 0.0
    if np.isfinite(scale):
        values = values * scale ** (1 if dtype == torch.float32 else 6)  # float64: 1e-252 to 1e180
    else:
        values[5, 2] = scale
    values = values.astype(np.float32 if dtype == torch.float32 else np.float64)
    grads = [torch.from_numpy(values), torch.from_numpy(values[:, 0].copy()), torch.zeros(0, dtype=dtype)]
    norms = reductions.norms(grads).numpy()
    expected = [_norm64(g.numpy()) for g in grads]
    np.testing.assert_allclose(norms, expected, rtol=1e-6)
    specs = [modules.UnitSpec((g.shape[0], -1), (1,), g.shape[0]) for g in grads]
    found = reductions.extras(grads, specs, reductions.Constants())
    np.testing.assert_array_equal(found["max_abs"], [np.abs(g.numpy()).max() if g.numel() else 0.0 for g in grads])
    np.testing.assert_array_equal(found["nonfinite"], [np.sum(~np.isfinite(g.numpy())) for g in grads])
    np.testing.assert_array_equal(found["nonzero"], [np.sum(g.numpy() != 0) for g in grads])


def _norm64(values):
    """The L2 norm in float64, scaled by the largest |element| so float64's squares cannot leave its range."""
    values = np.asarray(values, np.float64).ravel()
    largest = np.abs(values).max() if values.size else 0.0
    if not np.isfinite(largest) or largest == 0:
        return largest
    return largest * np.sqrt(np.sum((values / largest) ** 2))


@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e25])
def test_norms_of_long_tensors_match_float64(scale):
    # A CPU's float32 sum of 16 million elements rounds by ~6e-4 relative; the norms must not.
    values = (np.random.default_rng(0).normal(size=16_777_219) * scale).astype(np.float32)
    grads = [torch.from_numpy(values), torch.from_numpy(values[:5_000_003]), torch.from_numpy(values[:70_000])]
    norms = reductions.norms(grads).numpy()
    expected = [np.linalg.norm(g.numpy().astype(np.float64)) for g in grads]
    np.testing.assert_allclose(norms, expected, rtol=1e-7)


def test_norms_inside_and_outside_the_float32_band_come_back_in_order():
    # A CPU sums float32 squares in float32 inside a band and takes the rest again in float64: one list
    # mixing short and long tensors, inside and outside the band (vanishing, exploding, zero, NaN, Inf,
    # empty) comes back in its order, each norm its float64 one.
    rng = np.random.default_rng(2)
    scales = [1.0, 1e-30, 1e25, 1e-42, 0.0, 1e-3, float("nan"), float("inf"), 1e-30, 1.0]
    sizes = [100, 64, 300, 50, 20, 70_000, 10, 10, 70_001, 0]
    grads = []
    for scale, size in zip(scales, sizes):
        values = rng.normal(size=size)
        if np.isfinite(scale):
            values = values * scale
        else:
            values[3] = scale
        grads.append(torch.from_numpy(values.astype(np.float32)))
    norms = reductions.norms(grads).numpy()
    np.testing.assert_allclose(norms, [_norm64(g.numpy()) for g in grads], rtol=1e-6)


def test_norms_of_mixed_dtypes_come_back_in_order():
    # One multi-tensor kernel per dtype: the results are put back in the tensors' order.
    grads = [torch.full((3,), 2.0), torch.full((4,), 1e-200, dtype=torch.float64), torch.full((5,), 3.0).bfloat16()]
    np.testing.assert_allclose(reductions.norms(grads).numpy(), [2 * 3**0.5, 2e-200, 3 * 5**0.5], rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unit_maxima_match_each_units_definition(tmp_path, dtype):
    # Every unit layout of the Zoo (first axis, single elements, an embedding's last axis, a transposed
    # convolution's groups, a scalar), one unit of each gradient zeroed and a NaN planted (NaN is nonzero).
    model = Zoo()
    writer = GradientWriter(tmp_path, model)
    _backward(model)
    rows = writer._structure()
    where = [i for i, p in enumerate(rows.params) if p.grad is not None]
    tensors, specs = [rows.params[i].grad.to(dtype) for i in where], [rows.specs[i] for i in where]
    for k, (g, spec) in enumerate(zip(tensors, specs)):
        units = g.reshape(spec.view)
        dims = [d for d in range(units.dim()) if d not in spec.dims]
        units.select(dims[0], k % units.shape[dims[0]]).zero_()  # one unit of each gradient off
    tensors[1].reshape(-1)[2] = float("nan")
    found = reductions.extras(tensors, specs, reductions.Constants())
    writer.close()
    names = [rows.names[i] for i in where]
    expected = [np.abs(_unit_rows(model, n, g.float().numpy())).max(axis=1) for n, g in zip(names, tensors)]
    np.testing.assert_array_equal(found["unit_nonzero"].numpy(), np.concatenate(expected))  # 0: dead
    assert (found["unit_nonzero"].numpy() == 0).sum() >= len(tensors)
    np.testing.assert_array_equal(found["nonzero"].numpy(), [(g.float() != 0).sum() for g in tensors])
    np.testing.assert_array_equal(found["nonfinite"].numpy(), [(~torch.isfinite(g)).sum() for g in tensors])
    largest = [g.float().abs().max() for g in tensors]
    np.testing.assert_array_equal(found["max_abs"].numpy(), largest)
    assert np.isnan(found["max_abs"][1].item()) and not np.isnan(found["max_abs"][0].item())
    # A GPU's ways (a multi-tensor copy of |g|, nonzero counts of |g| * 0) give the same numbers.
    tensors[3].reshape(-1)[:2] = torch.tensor([float("inf"), -float("inf")])
    tensors[2][0] = float("inf")  # a bias: counted from its units
    on_cpu = reductions.extras(tensors, specs, reductions.Constants(), cpu=True)
    on_gpu = reductions.extras(tensors, specs, reductions.Constants(), cpu=False)
    assert on_cpu["nonfinite"][1] == 1 and on_cpu["nonfinite"][2] == 1 and on_cpu["nonfinite"][3] == 2
    for name, value in on_cpu.items():
        np.testing.assert_array_equal(value.numpy(), on_gpu[name].numpy(), err_msg=name)


def test_sparse_embedding_gradient_is_its_dense_sum(tmp_path):
    torch.manual_seed(0)
    sparse = nn.Sequential(nn.Embedding(12, 5, sparse=True), nn.Linear(5, 2))
    dense = nn.Sequential(nn.Embedding(12, 5), nn.Linear(5, 2))
    dense.load_state_dict(sparse.state_dict())
    tokens = torch.tensor([[1, 1, 3], [3, 7, 1]])  # repeated rows: the sparse gradient is not coalesced
    for model, run in ((sparse, "sparse"), (dense, "dense")):
        writer = GradientWriter(tmp_path / run, model)
        model(tokens).sum().backward()
        writer.write(0)
        writer.close()
    assert sparse[0].weight.grad.is_sparse
    _, s, content = _rows(tmp_path / "sparse", "variable")
    _, d, _ = _rows(tmp_path / "dense", "variable")
    assert content["variable"]["sparse_rows"] == ["0.weight"] and content["layer"]["sparse_rows"] == ["0"]
    for c in ("grad_norm", "grad_max_abs", "grad_zero_fraction", "grad_nonfinite", "dead_unit_fraction"):
        np.testing.assert_allclose(s["0.weight"][c], d["0.weight"][c], rtol=RTOL, err_msg=c)


def test_gradient_accumulation_writes_the_accumulated_gradient_once(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    writer = GradientWriter(tmp_path, model)
    data = torch.randn(4, 6, 4)
    for step in range(2):
        model.zero_grad()
        for micro in data:
            model(micro).pow(2).mean().backward()
        expected = np.linalg.norm(model[0].weight.grad.double().numpy())
        writer.write(step)
    writer.close()
    events = read_events(tmp_path, "stats", "variable")
    assert [e[0] for e in events] == [0, 1]
    np.testing.assert_allclose(events[-1][1][0, 0, 0], expected, rtol=RTOL)


def test_compiled_model_writes_the_same_numbers_as_eager(tmp_path):
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    twin = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    twin.load_state_dict(eager.state_dict())
    compiled = torch.compile(twin, backend="eager")
    x = torch.randn(3, 4)
    for model, run in ((eager, "eager"), (compiled, "compiled")):
        writer = GradientWriter(tmp_path / run, model)
        for step in range(3):
            model.zero_grad()
            # The writer's forward hooks (kept on a compiled model) never make dynamo recompile it.
            with torch._dynamo.config.patch(error_on_recompile=step > 0):
                model(x).pow(2).sum().backward()
            writer.write(step)
        writer.close()
    _, a, content = _rows(tmp_path / "eager", "layer")
    _, b, content_b = _rows(tmp_path / "compiled", "layer")
    assert content["layer"]["rows"] == content_b["layer"]["rows"] == ["0", "2"]
    for name in a:
        for c in ("grad_norm", "grad_max_abs", "weight_norm"):
            np.testing.assert_allclose(b[name][c], a[name][c], rtol=1e-6)


def test_a_compiled_training_step_that_calls_the_writer_writes_what_eager_does(tmp_path):
    """``torch.compile`` over the whole step (forward, backward, write, optimizer step): the writer runs eagerly inside it."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    batches = [(torch.randn(5, 4), torch.randn(5, 2)) for _ in range(5)]
    for model, run in zip(models, ("eager", "compiled")):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = GradientWriter(tmp_path / run, model, every_n_steps=2, optimizer=optimizer)

        def train_step(x, y, step, model=model, optimizer=optimizer, writer=writer):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            writer.clip_grad_norm_(0.5)
            writer.write(step)
            optimizer.step()

        step_fn = torch.compile(train_step, backend="eager") if run == "compiled" else train_step
        for step, (x, y) in enumerate(batches):
            step_fn(x, y, step)
        writer.close()
    for index in range(3):  # steps 0, 2 and the partial window at 4
        step_a, a, content = _rows(tmp_path / "eager", "layer", index)
        step_b, b, content_b = _rows(tmp_path / "compiled", "layer", index)
        assert step_a == step_b and content == content_b
        for name in a:
            for c in content["columns"]:
                np.testing.assert_allclose(b[name][c], a[name][c], rtol=1e-6, err_msg=f"{name} {c}")


@pytest.mark.parametrize("device", DEVICES)
def test_window_aggregates_equal_an_every_step_twin(tmp_path, device):
    """Windows of 4 against every step written: the same gradients, NaN and Inf in the second window.

    Between writes a window counts the steps with a non-finite gradient
    (``grad_nonfinite``'s mean, max, min and sum), its ``last`` slab the
    elements at the write step, as a step written alone does.
    """
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).to(device)
    every = GradientWriter(tmp_path / "every", model)
    window = GradientWriter(tmp_path / "window", model, every_n_steps=4)
    rng = np.random.default_rng(0)
    steps = range(1, 11)  # writes at 4 and 8; 9 and 10 are a partial window written at close
    for step in steps:
        for p in model.parameters():
            p.grad = torch.tensor(
                rng.normal(size=p.shape) * 10.0 ** rng.integers(-3, 3), dtype=torch.float32, device=device
            )
        if step == 6:
            model[2].weight.grad[0, 0] = float("nan")
            model[2].weight.grad[1, 2] = float("nan")  # two elements, one step
        if step == 8:  # a write step: its "last" slab counts the three elements
            model[2].weight.grad[0, :3] = torch.tensor([float("inf"), float("nan"), -float("inf")])
        if step == 7:
            model[0].bias.grad = None
        if step == 10:  # the last step of the partial window: flagged between writes, its elements not counted
            model[0].weight.grad[1, :2] = float("nan")
        every.write(step)
        window.write(step)
    every.close()
    window.close()
    content = stats_content(tmp_path / "window")
    assert content["aggregates"] == list(metadata.AGGREGATES) and content["window"] == 4
    col = {c: i for i, c in enumerate(content["columns"])}
    for granularity in ("layer", "variable"):
        per_step = {s: a[0] for s, a, _ in read_events(tmp_path / "every", "stats", granularity)}
        windows = read_events(tmp_path / "window", "stats", granularity)
        assert [s for s, _, _ in windows] == [4, 8, 10]
        bounds = {4: range(1, 5), 8: range(5, 9), 10: range(9, 11)}
        for write_step, slabs, _ in windows:
            seen = np.stack([per_step[s] for s in bounds[write_step]])  # [S, R, C] every-step rows
            for c in ("grad_norm", "grad_nonfinite"):
                x = seen[:, :, col[c]]
                here = x != -1
                if c == "grad_nonfinite":
                    x = np.where(here, np.minimum(x, 1.0), x)  # steps, not elements
                with np.errstate(invalid="ignore"):
                    want = {
                        "mean": np.where(here.any(0), np.where(here, x, 0).sum(0) / np.maximum(here.sum(0), 1), -1),
                        "max": np.where(here.any(0), np.where(here, x, -np.inf).max(0), -1),
                        "min": np.where(here.any(0), np.where(here, x, np.inf).min(0), -1),
                        "sum": np.where(here.any(0), np.where(here, x, 0).sum(0), -1),
                    }
                for a, name in enumerate(metadata.AGGREGATES[1:], start=1):
                    np.testing.assert_allclose(
                        slabs[a, :, col[c]], want[name], rtol=RTOL, err_msg=f"{write_step} {c} {name}"
                    )
            last = per_step[write_step]
            full = [
                "grad_norm",
                "grad_max_abs",
                "grad_zero_fraction",
                "grad_nonfinite",
                "dead_unit_fraction",
                "weight_norm",
            ]
            if write_step != 10:  # the partial window at close has only the window's own columns in "last"
                for c in full:
                    np.testing.assert_allclose(
                        slabs[0, :, col[c]], last[:, col[c]], rtol=RTOL, err_msg=f"{write_step} {c}"
                    )
            else:  # its count of NaN and Inf elements was not taken: MISSING where the step had some, else 0
                counted = last[:, col["grad_nonfinite"]]
                assert counted.max() == 2
                np.testing.assert_array_equal(slabs[0, :, col["grad_nonfinite"]], np.where(counted > 0, -1, counted))
            norms = seen[:, :, col["grad_norm"]]
            finite = np.where(np.isfinite(norms) & (norms != -1), norms, -np.inf).max(0)
            np.testing.assert_allclose(
                slabs[2, :, col["grad_norm_finite"]], np.where(finite > -np.inf, finite, -1), rtol=RTOL
            )
            bad = seen[:, :, col["grad_nonfinite"]] > 0
            first = np.where(bad.any(0), write_step - np.array(list(bounds[write_step]))[np.argmax(bad, 0)], -1)
            np.testing.assert_array_equal(slabs[0, :, col["first_nonfinite_offset"]], first)
    # The NaN at step 6 reached the layer of its parameter and no other.
    layer_slabs = dict((s, a) for s, a, _ in read_events(tmp_path / "window", "stats", "layer"))
    assert layer_slabs[8][0, 1, col["first_nonfinite_offset"]] == 2.0
    assert layer_slabs[8][0, 0, col["first_nonfinite_offset"]] == -1.0


def test_a_phase_moves_the_written_steps_to_the_end_of_each_window(tmp_path):
    """every_n_steps=3, phase=2: writes at 2 and 5 (Lightning logs at such steps), each window its 3 steps."""
    model = nn.Linear(2, 2)
    writer = GradientWriter(tmp_path, model, every_n_steps=3, phase=2)
    for step in range(6):
        model.zero_grad()
        (model(torch.ones(1, 2)).sum() * (step + 1)).backward()
        writer.write(step)
    writer.close()
    events = read_events(tmp_path, "stats", "layer")
    assert [s for s, _, _ in events] == [2, 5]
    col = {c: i for i, c in enumerate(stats_content(tmp_path)["columns"])}
    # Step k's gradient is (k + 1) times step 0's: the windows' sums hold steps 0-2 and 3-5.
    first, second = (a[metadata.AGGREGATES.index("sum"), 0, col["grad_norm"]] for _, a, _ in events)
    np.testing.assert_allclose(second / first, (4 + 5 + 6) / (1 + 2 + 3), rtol=1e-6)


def test_header_row_counts_written_steps(tmp_path):
    model = nn.Linear(2, 2)
    writer = GradientWriter(tmp_path, model, every_n_steps=2)
    for step in range(6):
        model.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        writer.write(step)
    writer.close()
    # Writes at 0, 2 and 4, and the partial window of step 5 at close.
    assert [w for _, w, _ in read_events(tmp_path, "progress")] == [1.0, 2.0, 3.0, 4.0]


def test_misuse_raises_expected_received(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="Expected `model` to be a torch.nn.Module"):
        GradientWriter(tmp_path, "model")
    with pytest.raises(ValueError, match="Expected exactly one of `logdir` and `writer`"):
        GradientWriter(None, model)
    with pytest.raises(ValueError, match="every_n_steps"):
        GradientWriter(tmp_path, model, every_n_steps=0)
    with pytest.raises(ValueError, match=r"Expected `phase` below `every_n_steps` \(3\). Received: 3"):
        GradientWriter(tmp_path, model, every_n_steps=3, phase=3)
    with pytest.raises(ValueError, match="Expected `phase` to be a non-negative integer"):
        GradientWriter(tmp_path, model, every_n_steps=3, phase=-1)
    writer = GradientWriter(tmp_path, model)
    with pytest.raises(TypeError, match="Expected `step` to be an integer"):
        writer.write(1.5)
    with pytest.raises(ValueError, match="non-negative"):
        writer.write(-1)
    with pytest.raises(TypeError, match="GradientCheckReport"):
        writer.write_check({}, 0)
    writer.close()
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(0)


def _no_wait(event):
    raise AssertionError("a write waited for a CUDA event")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host synchronisation is a GPU's")
@pytest.mark.parametrize("scaled", [True, False])
def test_no_step_synchronises_the_host_cuda(tmp_path, monkeypatch, scaled):
    """Written steps too: their copy to the host is waited for only at close (or flush)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
    optimizer = torch.optim.Adam(model.parameters()) if scaled else torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda") if scaled else None
    writer = GradientWriter(tmp_path, model, every_n_steps=5, optimizer=optimizer, scaler=scaler)
    x = torch.randn(8, 16, device="cuda")
    for step in range(17):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=scaled):
            loss = model(x).float().pow(2).mean()
        (scaler.scale(loss) if scaled else loss).backward()
        quiet = step > 5  # after a whole window has made every index and buffer it needs
        torch.cuda.set_sync_debug_mode("error" if quiet else "default")
        if quiet:
            monkeypatch.setattr(torch.cuda.Event, "synchronize", _no_wait)
        try:
            writer.clip_grad_norm_(1.0)
            writer.write(step)
            if not scaled:  # GradScaler.step reads found_inf on the host: outside the quiet part
                optimizer.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            monkeypatch.undo()
        if scaled:
            scaler.step(optimizer)
            scaler.update()
    writer.close()
    assert [s for s, _, _ in read_events(tmp_path, "stats")] == [0, 5, 10, 15, 16]


def test_write_check_writes_the_reports_rows_as_the_tab_reads_them(tmp_path):
    from tb_gradcheck.check import report

    def row(name, granularity, status, error):
        return report.CheckRow(name, granularity, 4, 1.0, 1.0 + error, error, 1e-6, status, "", ())

    layers = (row("0", "layer", "ok", 1e-7), row("2", "layer", "mismatch", 0.05))
    variables = tuple(row(n, "variable", s, e) for n, s, e in (("0.weight", "ok", 0.0), ("2.weight", "mismatch", 0.05)))
    report = report.GradientCheckReport(layers, variables, 0.5, 1e-8, "float64", 7, 3, 0.01, 10, False)
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with GradientWriter(tmp_path, model) as writer:
        writer.write_check(report, 12)
    ((step, layer, _),) = read_events(tmp_path, "check", "layer")
    ((_, variable, _),) = read_events(tmp_path, "check", "variable")
    status = metadata.CHECK_COLUMNS.index("status")
    assert step == 12 and layer.shape == (2, len(metadata.CHECK_COLUMNS))
    assert list(layer[:, status]) == [0.0, 2.0] and list(variable[:, status]) == [0.0, 2.0]
    assert layer[1, metadata.CHECK_COLUMNS.index("relative_error")] == pytest.approx(0.05)


def test_a_layer_unfrozen_after_the_first_write_is_named_in_a_warning(tmp_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model[0].requires_grad_(False)
    writer = GradientWriter(tmp_path, model, every_n_steps=2)
    x = torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say while the rows are all there is
        for step in range(2):
            model(x).sum().backward()
            writer.write(step)
    model[0].requires_grad_(True)  # gradual unfreezing
    model(x).sum().backward()
    writer.write(3)  # not written: nothing checked
    model(x).sum().backward()
    with pytest.warns(UserWarning, match=r"0\.weight, 0\.bias need a gradient but are not recorded") as caught:
        writer.write(4)
    assert caught[0].filename == __file__  # the user's line, through torch.compiler.disable
    writer.close()
    assert stats_content(tmp_path)["variable"]["rows"] == ["2.weight", "2.bias"]


def test_rows_named_by_an_index_show_their_class_in_the_tab_and_the_report(tmp_path, capsys):
    # nn.Sequential names its modules 0, 2, 4: the layout stores their class, the heatmap answer and the
    # findings show "2 (Linear)", and rows are still matched (and stored) by name.
    from conftest import get_json
    from conftest import make_app
    from conftest import wait_for_steps
    from tb_gradcheck import cli

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with GradientWriter(tmp_path / "seq", model, optimizer=optimizer) as writer:
        for step in range(12):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            writer.clip_grad_norm_(1e-4)  # binds at every step: a clipping finding naming the layers
            writer.write(step)
            optimizer.step()
    content = stats_content(tmp_path / "seq")
    assert content["layer"]["rows"] == ["0", "2", "4"]
    assert content["layer"]["module_classes"] == {"0": "Linear", "2": "Linear", "4": "Linear"}
    assert content["variable"]["module_classes"]["4.bias"] == "Linear"

    client, tb = make_app(tmp_path, "python")
    wait_for_steps(client, "seq", 12)
    heat = get_json(client, "/data/plugin/gradients/heatmap?run=seq&metric=grad_norm")
    assert heat["layers"] == ["0", "2", "4"]
    assert heat["labels"] == {"0": "0 (Linear)", "2": "2 (Linear)", "4": "4 (Linear)"}
    found = get_json(client, "/data/plugin/gradients/findings?run=seq")["findings"]
    clipping = next(f for f in found if f["kind"] == "clipping")
    assert set(clipping["layers"]) <= {"0", "2", "4"} and "(Linear)" in clipping["message"]

    assert cli.main(["report", str(tmp_path), "--fail-on", "never"]) == 0
    out = capsys.readouterr().out
    assert "(Linear) drove the norm over the bound" in out and "  - 4 (Linear): " in out


def test_a_model_with_named_modules_stores_no_module_classes(tmp_path):
    model = nn.Sequential()
    model.add_module("encoder", nn.Linear(4, 4))
    model.add_module("head", nn.Linear(4, 1))
    with GradientWriter(tmp_path, model) as writer:
        model(torch.randn(2, 4)).sum().backward()
        writer.write(0)
    content = stats_content(tmp_path)
    assert "module_classes" not in content["layer"] and "module_classes" not in content["variable"]


@pytest.mark.parametrize(
    "where, reason",
    [("/proc/tb_gradcheck_run", "cannot be created"), ("file/run", "cannot be created"), ("file", "is a file")],
    ids=["in /proc", "under a file", "a file"],
)
def test_a_logdir_that_cannot_hold_the_run_is_refused_when_the_writer_is_built(tmp_path, where, reason):
    # Not at the first optimizer step, from inside the optimizer's hook: here, in one sentence naming both.
    (tmp_path / "file").write_text("")
    path = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(
        ValueError, match=f"tb_gradcheck.torch.GradientWriter can write its run to. Received: '{path}': it {reason}"
    ):
        GradientWriter(path, nn.Linear(2, 2))
    writer = GradientWriter(tmp_path / "new" / "run", nn.Linear(2, 2))
    assert writer.log_dir == str(tmp_path / "new" / "run") and os.path.isdir(writer.log_dir)
    writer.close()
