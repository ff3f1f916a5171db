"""``GradientWriter(activations=True)`` against float64 statistics of the same outputs, taken by the test's own hooks.

The test registers its own forward hooks on the row modules (after the
writer's), keeps float64 copies of what each returns in training mode at
every step, and computes each activation column from its definition
(``metadata.ACTIVATION_STAT_COLUMNS``); the writer's events are read back
with TensorBoard's own event file loader (``conftest.read_events``).
"""

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conftest import read_events
from conftest import stats_content
from reference_stats import activation_reference
from tb_gradcheck.core import metadata
from tb_gradcheck.torch import GradientWriter

# The writer sums squares in float32 (tree reductions, relative error ~ n * 2**-24 at worst for these few
# thousand elements, ~1e-7 in practice), then stores float32: 1e-5 is far above that and far below any
# real difference (a missed or doubled call moves act_nonfinite by a whole count, a wrong element set
# moves rms by percents).
RTOL = 1e-5
ACT = metadata.ACTIVATION_STAT_COLUMNS

torch.set_num_threads(1)


def mlp():
    model = nn.Sequential(
        nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8), nn.Sigmoid(), nn.Linear(8, 2)
    )
    with torch.no_grad():  # large enough weights that part of the Tanh and Sigmoid outputs saturate
        model[2].weight.mul_(8)
        model[4].weight.mul_(12)
    return model


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4)
        )
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.features(x)).mean(dim=(2, 3)))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        # A module-form ReLU, so the feed-forward's first Linear has a dead fraction.
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=nn.ReLU(), batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, tokens):
        return self.head(self.layer(self.embed(tokens)).mean(dim=1))


def _batch(name, g):
    if name == "mlp":
        return torch.randn(12, 6, generator=g)
    if name == "cnn":
        return torch.randn(4, 3, 6, 6, generator=g)
    return torch.randint(0, 20, (3, 5), generator=g)


MODELS = {"mlp": mlp, "cnn": CNN, "transformer": Transformer}
# Rows whose output goes straight into a ReLU module (dead fraction, unit axis) or a Tanh/Sigmoid module
# (saturation: the bound test); by the test's reading of each model, not by the writer's.
FEEDS_RELU = {"mlp": {"0": -1}, "cnn": {"features.1": 1}, "transformer": {"layer.linear1": -1}}
FEEDS_SQUASH = {"mlp": {"2": torch.tanh, "4": torch.sigmoid}, "cnn": {}, "transformer": {}}


class Twin:
    """The test's own forward hooks: float64 copies of each row module's training-mode outputs, per step."""

    def __init__(self, model, paths):
        self.calls = {}
        for path in paths:
            module = model.get_submodule(path)
            if isinstance(module, nn.MultiheadAttention):
                # Its output is its out_proj's, applied inside its functional forward: that row's output.
                module.register_forward_hook(self._hook(f"{path}.out_proj"))
            elif not path.endswith("out_proj"):
                module.register_forward_hook(self._hook(path))

    def _hook(self, path):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if module.training and torch._C._current_graph_task_id() == -1:
                self.calls.setdefault(path, []).append(out.detach().to(torch.float64).clone())

        return hook

    def stats(self, name, path):
        outs = self.calls.get(path)
        if not outs:
            return None
        flat = np.concatenate([o.numpy().ravel() for o in outs])
        units = squashed = None
        if path in FEEDS_RELU[name]:
            axis = FEEDS_RELU[name][path]
            units = np.concatenate([np.moveaxis(o.numpy(), axis, -1).reshape(-1, o.shape[axis]) for o in outs])
        f = FEEDS_SQUASH[name].get(path)
        if f is not None:
            squashed = np.concatenate([f(o).numpy().ravel() for o in outs])
        return activation_reference(flat, units, squashed, tanh=f is torch.tanh)


def _train(tmp_path, name, steps, every_n_steps=1, micro_batches=1, plant=None):
    torch.manual_seed(0)
    model = MODELS[name]()
    writer = GradientWriter(tmp_path, model, every_n_steps=every_n_steps, activations=True)
    paths = sorted({n.rsplit(".", 1)[0] for n, _ in model.named_parameters()})
    twin = Twin(model, paths)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    expected = {}
    for step in range(steps):
        twin.calls = {}
        optimizer.zero_grad()
        for _ in range(micro_batches):
            x = _batch(name, g)
            if plant is not None:
                x = plant(x)
            model(x).square().mean().backward()
        writer.write(step)
        optimizer.step()
        if step % every_n_steps == 0:
            expected[step] = {p: twin.stats(name, p) for p in paths}
    writer.close()
    return expected


def _stored(tmp_path):
    content = stats_content(tmp_path)
    columns = content["columns"]
    out = {}
    for step, array, _ in read_events(tmp_path, "stats", "layer"):
        out[step] = {n: dict(zip(columns, array[0, i])) for i, n in enumerate(content["layer"]["rows"])}
    return out, content


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("every_n_steps", [1, 3])
def test_activation_columns_equal_float64_statistics_of_the_same_outputs(tmp_path, name, every_n_steps):
    expected = _train(tmp_path, name, steps=7, every_n_steps=every_n_steps)
    stored, content = _stored(tmp_path)
    assert [c for c in content["columns"] if c.startswith("act_")] == list(ACT)
    written = [s for s in stored if s in expected]  # the partial window at close has no forward record
    assert written == sorted(expected) and len(written) == (7 if every_n_steps == 1 else 3)
    for step in written:
        for path, want in expected[step].items():
            got = stored[step][path]
            if want is None:  # MultiheadAttention's own row: its q, k, v projections stay inside its forward
                assert path.endswith("self_attn") and all(got[c] == -1.0 for c in ACT), (path, got)
                continue
            for c in ACT:
                np.testing.assert_allclose(got[c], want[c], rtol=RTOL, err_msg=f"{name} step {step} {path} {c}")
    # The columns mean something here: a dead fraction and a saturated fraction were measured where they apply.
    last = stored[written[-1]]
    assert all(last[p]["act_dead_fraction"] >= 0 for p in FEEDS_RELU[name])
    assert all(0 < last[p]["act_saturated_fraction"] < 1 for p in FEEDS_SQUASH[name])


def test_windowed_slabs_other_than_last_hold_no_activation_value(tmp_path):
    _train(tmp_path, "mlp", steps=4, every_n_steps=2)
    content = stats_content(tmp_path)
    at = [content["columns"].index(c) for c in ACT]
    for _, array, _ in read_events(tmp_path, "stats", "layer"):
        assert np.all(array[1:][:, :, at] == -1.0)
    for _, array, _ in read_events(tmp_path, "stats", "variable"):
        assert np.all(array[:, :, at] == -1.0)  # an output is a module's, not one parameter's


def test_gradient_accumulation_counts_every_micro_batch(tmp_path):
    expected = _train(tmp_path, "mlp", steps=2, micro_batches=3)
    stored, _ = _stored(tmp_path)
    for step in expected:
        for path, want in expected[step].items():
            for c in ACT:
                np.testing.assert_allclose(stored[step][path][c], want[c], rtol=RTOL, err_msg=f"{path} {c}")


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.block = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        if self.reentrant is None:
            return self.head(self.block(x))
        return self.head(checkpoint(self.block, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_layer_counts_once(tmp_path, reentrant):
    # An Inf in the input makes NaN/Inf outputs: a layer counted twice would store twice their number.
    def run(where, mode):
        torch.manual_seed(0)
        model = Checkpointed(mode)
        with GradientWriter(where, model, activations=True) as writer:
            x = torch.randn(8, 6)
            x[0, 0] = float("inf")
            model(x.requires_grad_(mode is True)).sum().backward()  # the reentrant form needs an input that does
            writer.write(0)
        return _stored(where)[0][0]

    plain, checkpointed = run(tmp_path / "plain", None), run(tmp_path / "checkpointed", reentrant)
    assert plain["block.0"]["act_nonfinite"] > 0
    for path in ("block.0", "block.2", "head"):
        for c in ("act_nonfinite", "act_dead_fraction"):
            assert checkpointed[path][c] == plain[path][c], (path, c)


def test_hooks_are_registered_once_and_idle_between_written_steps(tmp_path):
    torch.manual_seed(0)
    model = mlp()
    writer = GradientWriter(tmp_path, model, every_n_steps=4, activations=True)
    hooks = {name: len(m._forward_hooks) for name, m in model.named_modules()}
    recorder = writer._forward
    for step in range(8):
        model.zero_grad()
        model(torch.randn(4, 6)).sum().backward()
        # Steps 1..3 and 5..7 are not written: their forward passes recorded nothing.
        assert bool(recorder._calls) == (step % 4 == 0), step
        writer.write(step)
    assert {name: len(m._forward_hooks) for name, m in model.named_modules()} == hooks
    writer.close()
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_eval_passes_between_steps_are_not_counted(tmp_path):
    torch.manual_seed(0)
    model = mlp()
    with GradientWriter(tmp_path / "a", model, activations=True) as writer:
        x = torch.randn(8, 6)
        model(x).sum().backward()
        model.eval()
        with torch.no_grad():
            model(100 * torch.randn(8, 6))  # a validation pass: not part of the step
        model.train()
        writer.write(0)
    with_eval = _stored(tmp_path / "a")[0][0]
    torch.manual_seed(0)
    model = mlp()
    with GradientWriter(tmp_path / "b", model, activations=True) as writer:
        model(torch.randn(8, 6)).sum().backward()
        writer.write(0)
    without = _stored(tmp_path / "b")[0][0]
    for path in without:
        assert with_eval[path]["act_rms"] == without[path]["act_rms"], path


def test_writers_without_activations_store_no_activation_column(tmp_path):
    model = mlp()
    with GradientWriter(tmp_path, model) as writer:
        model(torch.randn(2, 6)).sum().backward()
        writer.write(0)
    assert not set(ACT) & set(stats_content(tmp_path)["columns"])
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_activations_must_be_a_bool(tmp_path):
    with pytest.raises(TypeError, match="Expected `activations` to be a bool. Received: 'yes'"):
        GradientWriter(tmp_path, mlp(), activations="yes")


def test_a_compiled_model_records_what_the_eager_one_does(tmp_path):
    # The hooks are registered by the writer before torch.compile first runs the model: the compiled graph
    # runs them (the armed flag is guarded: one graph armed, one not), and the numbers are the eager ones.
    def run(where, compiled):
        torch.manual_seed(0)
        model = mlp()
        with GradientWriter(where, model, every_n_steps=2, activations=True) as writer:
            forward = torch.compile(model) if compiled else model
            g = torch.Generator().manual_seed(1)
            for step in range(4):
                model.zero_grad()
                forward(torch.randn(12, 6, generator=g)).square().mean().backward()
                writer.write(step)
        return _stored(where)[0]

    eager, compiled = run(tmp_path / "eager", False), run(tmp_path / "compiled", True)
    assert sorted(compiled) == sorted(eager) == [0, 2, 3]  # 3: the partial window at close, no record
    for step in (0, 2):
        for path, want in eager[step].items():
            for c in ACT:
                np.testing.assert_allclose(compiled[step][path][c], want[c], rtol=RTOL, err_msg=f"{step} {path} {c}")
        assert eager[step]["2"]["act_saturated_fraction"] > 0 and eager[step]["0"]["act_dead_fraction"] >= 0


class _Cached(nn.Module):
    """A class of its own: no other test compiles it, so the graphs this test sees are its own."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(6, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)))


def test_a_graph_compiled_before_the_hooks_skips_them_and_the_writer_says_so(tmp_path):
    """Dynamo reuses a graph compiled for another instance of the class without guarding on hooks.

    The new model's hooks then never run and every act_* column is MISSING:
    the writer warns at the written step, and after ``torch._dynamo.reset()``
    the same run records them, without a word.
    """
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(1))

    def run(where):
        torch.manual_seed(0)
        model = _Cached()
        with GradientWriter(where, model, activations=True) as writer:
            torch.compile(model)(x).square().mean().backward()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                writer.write(0)
        stored = _stored(where)[0][0]
        return [str(w.message) for w in caught], [stored[p]["act_rms"] for p in ("inp", "out")]

    torch._dynamo.reset()
    try:
        torch.compile(_Cached())(x).square().mean().backward()  # compiled before any writer: no hooks
        caught, rms = run(tmp_path / "stale")
        assert rms == [-1.0, -1.0]  # the premise: the reused graph ran no hook
        assert len(caught) == 1 and "no layer's forward hook ran" in caught[0] and "_dynamo.reset()" in caught[0]
        torch._dynamo.reset()
        caught, rms = run(tmp_path / "fresh")
        assert caught == [] and all(r > 0 for r in rms)
    finally:
        torch._dynamo.reset()  # leave no graph of this test's to the next


def test_a_deep_copy_made_after_the_writer_is_not_recorded_as_the_model(tmp_path):
    """An EMA copy (``AveragedModel``, a deep copy) made after the writer carries its hooks: its calls are not counted.

    The copy runs in training mode on another batch each step (a BYOL
    target, ``swa_utils.update_bn``): counted as the model's own calls, its
    outputs moved ``act_rms`` from the model's 0.6 to 4.2 and its dead
    fraction to the copy's.
    """
    from torch.optim import swa_utils

    torch.manual_seed(0)
    model = mlp()
    writer = GradientWriter(str(tmp_path), model, activations=True)
    teacher = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))
    assert teacher.module[0]._forward_hooks  # the premise: the writer's hook went along with the copy
    seen = {}
    model[0].register_forward_hook(lambda m, a, out: seen.setdefault(m.training, []).append(out.detach().double()))
    x = torch.randn(32, 6)
    for step in range(3):
        seen.clear()
        model.zero_grad()
        model(x).square().mean().backward()
        with torch.no_grad():
            teacher(10 * x - 3)  # training mode, other outputs
        writer.write(step)
        teacher.update_parameters(model)
    writer.close()
    ((_, slabs, _),) = read_events(tmp_path, "stats", "layer")[-1:]
    content = stats_content(tmp_path)
    row = dict(zip(content["columns"], slabs[0, content["layer"]["rows"].index("0")]))
    (own,) = seen[True]
    want = activation_reference(own.numpy().ravel(), units=own.numpy())
    for column in ("act_rms", "act_max_abs", "act_dead_fraction"):
        np.testing.assert_allclose(row[column], want[column], rtol=RTOL, err_msg=column)
