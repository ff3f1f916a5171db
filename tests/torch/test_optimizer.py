"""The PyTorch writer's optimizer view: the norm before clipping, the update each layer received, AMP's loss scale.

Twins: PyTorch's own ``clip_grad_norm_`` on a copy of the model; the update
and the unscaled gradients computed by the test in float64 from snapshots
it takes itself.
"""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import read_events
from conftest import stats_content
from tb_gradcheck.torch import GradientWriter

RTOL = 1e-6  # float32 storage of float64 statistics
MISSING = -1.0
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# One intra-op thread: these models are tiny, and on a shared 2-core machine PyTorch's thread pool made
# each step tens of times slower than one thread.
torch.set_num_threads(1)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


def _columns(run_dir, granularity="variable"):
    """``{step: {column: [A, R] array}}`` of the run's stats."""
    content = stats_content(run_dir)
    out = {}
    for step, array, _ in read_events(run_dir, "stats", granularity):
        out[step] = {c: array[:, :, i] for i, c in enumerate(content["columns"])}
    return out


def _norms(tensors):
    return np.array([np.linalg.norm(t.detach().double().cpu().numpy().ravel()) for t in tensors])


def test_clip_grad_norm_clips_as_pytorch_does_and_records_the_norms_before(tmp_path):
    model, twin = _mlp(), _mlp()
    writer = GradientWriter(tmp_path, model, every_n_steps=2)
    x = torch.randn(16, 4) * 10
    expected = {}
    for step in range(4):
        for m in (model, twin):
            m.zero_grad()
            m(x * (step + 1)).pow(2).sum().backward()
        before = _norms([p.grad for p in model.parameters()])
        total = writer.clip_grad_norm_(1.0)
        twin_total = nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        torch.testing.assert_close(total, twin_total, rtol=1e-6, atol=0)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)
        expected[step] = (before, _norms([p.grad for p in model.parameters()]))
        writer.write(step)
    writer.close()
    stored = _columns(tmp_path)
    assert sorted(stored) == [0, 2, 3]  # 3: the partial window at close
    for step in (0, 2):
        before, after = expected[step]
        np.testing.assert_allclose(stored[step]["grad_norm_before_clip"][0], before, rtol=RTOL)
        np.testing.assert_allclose(stored[step]["grad_norm"][0], after, rtol=RTOL)
        assert (stored[step]["grad_norm_before_clip"][1:] == MISSING).all()  # taken at the write step only
    assert before.sum() > 10 * after.sum()  # the clip bound
    assert (stored[3]["grad_norm_before_clip"] == MISSING).all()
    layer = _columns(tmp_path, "layer")[2]["grad_norm_before_clip"][0]
    np.testing.assert_allclose(layer, np.sqrt(expected[2][0][0::2] ** 2 + expected[2][0][1::2] ** 2), rtol=RTOL)


@pytest.mark.parametrize(
    "make",
    [lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)],
)
@pytest.mark.parametrize("device", DEVICES)
def test_update_norm_is_the_change_the_optimizer_step_made_at_written_steps(tmp_path, make, device):
    model = _mlp().to(device)
    optimizer = make(model.parameters())
    writer = GradientWriter(tmp_path, model, every_n_steps=3, optimizer=optimizer)
    expected = {}
    for step in range(7):
        optimizer.zero_grad()
        model(torch.randn(8, 4, device=device)).pow(2).mean().backward()
        writer.write(step)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        expected[step] = (_norms([p.detach() - b for p, b in zip(model.parameters(), before)]), _norms(before))
    writer.close()
    stored = _columns(tmp_path)
    assert sorted(stored) == [0, 3, 6]
    for step in (0, 3, 6):
        update, weight = expected[step]
        np.testing.assert_allclose(stored[step]["update_norm"][0], update, rtol=RTOL)
        np.testing.assert_allclose(stored[step]["update_to_weight"][0], update / weight, rtol=RTOL)
        np.testing.assert_allclose(stored[step]["weight_norm"][0], weight, rtol=RTOL)  # before the update
        assert (stored[step]["update_norm"][1:] == MISSING).all()


def test_writing_after_the_optimizer_step_warns_and_records_no_update(tmp_path):
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = GradientWriter(tmp_path, model, optimizer=optimizer)
    with pytest.warns(UserWarning, match="before optimizer.step"):
        for step in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
            writer.write(step)
    writer.close()
    stored = _columns(tmp_path)
    assert sorted(stored) == [0, 1, 2]
    assert all((stored[s]["update_norm"] == MISSING).all() for s in stored)


OVERFLOW = {2, 5, 6}  # steps whose scaled loss overflows: the scaler refuses them


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unscale", [True, False], ids=["unscale_called", "scaled_gradients"])
def test_grad_scaler_steps_are_unscaled_and_refused_steps_counted(tmp_path, unscale, device):
    model = _mlp().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=3)
    writer = GradientWriter(tmp_path, model, every_n_steps=2, optimizer=optimizer, scaler=scaler)
    expected = {}
    refused = 0
    for step in range(9):
        optimizer.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16 if device == "cpu" else torch.float16):
            loss = model(torch.randn(8, 4, device=device)).float().pow(2).mean()
        if step in OVERFLOW:
            loss = loss * 3e38  # scaled, it overflows to Inf: the gradients are non-finite
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        unscaled = [p.grad.double() / scale for p in model.parameters()]
        if unscale:
            scaler.unscale_(optimizer)
        writer.write(step)
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        refused += step in OVERFLOW
        moved = _norms([p.detach() - b for p, b in zip(model.parameters(), before)])
        expected[step] = (_norms(unscaled), scale, refused, moved)
    writer.close()
    stored = _columns(tmp_path)
    assert sorted(stored) == [0, 2, 4, 6, 8]
    counted = 0
    for step in sorted(stored):
        norms, scale, refused_so_far, moved = expected[step]
        got = stored[step]
        assert got["loss_scale"][0][0] == scale and (got["loss_scale"][0] == scale).all()
        assert got["refused_steps"][0][0] == refused_so_far - counted
        counted = refused_so_far
        np.testing.assert_allclose(got["grad_norm"][0], norms, rtol=RTOL)
        np.testing.assert_allclose(got["update_norm"][0], moved, rtol=RTOL, atol=1e-30)
        if step in OVERFLOW:
            assert (got["update_norm"][0] == 0).all() and not np.isfinite(got["grad_norm"][0]).any()
    assert expected[8][1] < 2.0**10  # the scaler halved its scale at the refused steps


def test_optimizer_hooks_copy_nothing_between_writes(tmp_path, monkeypatch):
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = GradientWriter(tmp_path, model, every_n_steps=4, optimizer=optimizer)
    copies = []
    original = torch._foreach_copy_

    def counting(buffers, tensors):  # the hook's one fused copy of the weights (on a CPU, into kept buffers)
        copies.append(len(tensors))
        return original(buffers, tensors)

    monkeypatch.setattr(torch, "_foreach_copy_", counting)
    for step in range(1, 4):  # no write step among them
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        writer.write(step)
        optimizer.step()
    assert copies == []
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    writer.write(4)
    optimizer.step()
    assert copies == [len(list(model.parameters()))]  # the snapshot of the written step
    monkeypatch.undo()
    writer.close()
    assert stats_content(tmp_path)["columns"][-2:] == ["update_norm", "update_to_weight"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_update_of_half_precision_weights_is_their_exact_change(tmp_path, dtype):
    # Two bfloat16 weights' difference rounded to bfloat16 is off by up to 1e-2 of it; in float32 it is exact.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(dtype)
    x, y = torch.randn(64, 16, dtype=dtype), torch.randint(0, 4, (64,))
    optimizer = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9)
    writer = GradientWriter(tmp_path, model, optimizer=optimizer)
    moved = []
    for step in range(4):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x).float(), y).backward()
        writer.write(step)
        before = [p.detach().double().clone() for p in model.parameters()]
        optimizer.step()
        moved.append([float((p.detach().double() - b).norm()) for p, b in zip(model.parameters(), before)])
    writer.close()
    content = stats_content(tmp_path)
    column = content["columns"].index("update_norm")
    rows = [content["variable"]["rows"].index(n) for n, _ in model.named_parameters()]
    for (_, array, _), want in zip(read_events(tmp_path, "stats", "variable"), moved):
        np.testing.assert_allclose(array[0, rows, column], want, rtol=1e-6)


def _clears(optimizer, model, how):
    if how == "optimizer.zero_grad()":
        optimizer.zero_grad()
    elif how == "zero_grad(set_to_none=False)":
        optimizer.zero_grad(set_to_none=False)
    elif how == "model.zero_grad()":
        model.zero_grad()
    elif how == ".grad = None":
        for p in model.parameters():
            p.grad = None


@pytest.mark.parametrize(
    "how", ["optimizer.zero_grad()", "zero_grad(set_to_none=False)", "model.zero_grad()", ".grad = None", "never"]
)
def test_gradients_never_cleared_are_warned_once_and_recorded_as_the_sum(tmp_path, how):
    """A loop without ``zero_grad()`` applies the sum of every gradient so far; the writer says so at once.

    Every way of clearing counts, also around two micro-batches accumulated
    per step (their sum is the step's gradient, not a mistake); the
    recorded gradient is what the optimizer applies either way.
    """
    import warnings

    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    writer = GradientWriter(tmp_path, model, optimizer=optimizer)
    torch.manual_seed(1)
    batches = [(torch.randn(4, 4), torch.randn(4, 2)) for _ in range(8)]
    applied = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            _clears(optimizer, model, how)
            for x, y in batches[2 * step : 2 * step + 2]:
                nn.functional.mse_loss(model(x), y).backward()
            applied.append(np.sqrt(sum(p.grad.double().square().sum().item() for p in model.parameters())))
            writer.write(step)
            optimizer.step()
        writer.close()
    said = [str(w.message) for w in caught if "nothing cleared them" in str(w.message)]
    assert len(said) == (1 if how == "never" else 0), said
    if how == "never":
        assert "Expected optimizer.zero_grad() (or model.zero_grad()) once per step, before backward()" in said[0]
    stored = _columns(tmp_path)
    recorded = [np.sqrt(np.square(stored[s]["grad_norm"][0].astype(np.float64)).sum()) for s in range(4)]
    np.testing.assert_allclose(recorded, applied, rtol=RTOL)
