"""Optimizer findings of PyTorch runs whose optimizer leaves layers out or moves them at different rates.

Every layer keeps ``requires_grad`` and gets its gradient; the optimizer's
parameter groups decide which layers move. TensorFlow is not imported here:
torch imported after it crashes on loading triton.
"""

import warnings

import pytest
import torch
from torch import nn

from tb_gradcheck.reader import queries
from tb_gradcheck.reader import store
from tb_gradcheck.torch import GradientWriter

# One intra-op thread: tiny models on a shared 2-core machine (as in tests/torch/test_findings.py).
torch.set_num_threads(1)


def train(logdir, model, optimizer, steps):
    """Trains ``model`` on ``tanh(x @ target)`` with fresh batches, written every step; ``(store, ctx, eid, run)``."""
    target = torch.randn(16, 4)
    with GradientWriter(logdir, model, optimizer=optimizer) as writer:
        for step in range(steps):
            x = torch.randn(64, 16)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), torch.tanh(x @ target)).backward()
            writer.write(step)
            optimizer.step()
    st, ctx, eid = store.local_store(logdir)
    return st, ctx, eid, next(iter(st.runs(ctx, eid)))


def torch_fit(logdir, groups, steps=60):
    """A PyTorch 16-64-64-64-4 tanh MLP (layers ``0``, ``2``, ``4``, ``6``) trained on ``groups(model)``; its findings.

    ``groups``: callable model -> ``torch.optim.Optimizer``. Every layer
    keeps ``requires_grad`` and gets its gradient; the optimizer decides
    which move, and by how much.
    """
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)
    )
    st, ctx, eid, run = train(logdir, model, groups(model), steps)
    return queries.findings(st, ctx, eid, run)


def test_a_layer_no_group_holds_is_a_warning_and_a_group_at_learning_rate_0_is_frozen_information(tmp_path):
    """Layer 2 in no param group, layer 4 in a group at learning rate 0: both a live gradient, an update of exactly 0.

    The numbers cannot tell them apart; the writer, which sees the groups,
    stores which rows no group holds, and the findings read it back.
    """

    def groups(m):
        return torch.optim.AdamW(
            [{"params": m[0].parameters()}, {"params": m[4].parameters(), "lr": 0.0}, {"params": m[6].parameters()}],
            lr=1e-3,
        )

    with pytest.warns(UserWarning, match=r"2\.weight, 2\.bias get a gradient but no parameter group"):
        found = torch_fit(tmp_path, groups)
    assert [(f.kind, f.severity) for f in found] == [("not_learning", "warning"), ("not_learning", "info")], [
        f.message for f in found
    ]
    unheld, frozen = found
    assert unheld.layers == ["2"]
    # One layer: the sentence is in the singular ("classifier gets a gradient ... holds it ... it never moves").
    assert unheld.message.startswith("\u20682 (Linear)\u2069 gets a gradient"), unheld.message
    assert "no parameter group of the optimizer holds it " in unheld.message and "it never moves" in unheld.message
    assert unheld.evidence["2"]["median_update_to_weight"] == 0 and unheld.evidence["2"]["median_grad_norm"] > 0
    assert frozen.layers == ["4"]
    assert "frozen by the optimizer" in frozen.message and "learning rate of 0" in frozen.message
    assert "float32" not in frozen.message + unheld.message
    assert frozen.evidence["4"]["median_update_to_weight"] == 0 and frozen.evidence["4"]["median_grad_norm"] > 0


def test_the_stored_layout_lists_the_rows_no_group_holds(tmp_path):
    """``outside_optimizer`` in both blocks of the layout (a layer, its parameters); a run whose groups hold all has none."""

    for name, groups, layers, variables in (
        ("left_out", lambda m: torch.optim.SGD(m[0].parameters(), lr=0.1), ["2"], ["2.bias", "2.weight"]),
        ("all_held", lambda m: torch.optim.SGD(m.parameters(), lr=0.1), [], []),
    ):
        model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the writer's own warning is tested above
            st, ctx, eid, run = train(tmp_path / name, model, groups(model), 3)
        index = st.run(ctx, eid, run)
        assert index.outside_optimizer("layer") == layers
        assert index.outside_optimizer("variable") == variables
        for layouts in index.series.values():
            for layout in layouts:
                if "layer" in layout.content:
                    assert ("outside_optimizer" in layout.content["layer"]) == bool(layers)


def test_a_trained_head_behind_a_frozen_backbone_is_not_a_slow_network(tmp_path):
    """The backbone at learning rate 0: three of four layers move 0, and the head's pace alone is the network's."""

    def groups(m):
        backbone = [p for i in (0, 2, 4) for p in m[i].parameters()]
        return torch.optim.SGD([{"params": backbone, "lr": 0.0}, {"params": m[6].parameters()}], lr=0.1)

    found = torch_fit(tmp_path, groups)
    assert not [f for f in found if f.severity != "info"], [f.message for f in found]
    assert "6" not in {name for f in found for name in f.layers}
    assert {f.kind: f for f in found}["not_learning"].layers == ["0", "2", "4"]


def test_a_layer_well_above_the_slow_pace_is_not_told_its_learning_rate_is_too_small(tmp_path):
    """The backbone at SGD 1e-5 (the network's pace under 1e-6), the head at 0.1: only the backbone is slow."""

    def groups(m):
        backbone = [p for i in (0, 2, 4) for p in m[i].parameters()]
        return torch.optim.SGD([{"params": backbone, "lr": 1e-5}, {"params": m[6].parameters(), "lr": 0.1}])

    stuck = {f.kind: f for f in torch_fit(tmp_path, groups)}["not_learning"]
    assert stuck.severity == "warning" and "6" not in stuck.layers
    assert any("the whole network" in e["reason"] for e in stuck.evidence.values())


class LayerScaled(nn.Module):
    """A residual MLP whose branch is scaled by a fixed 1e-7: the branch's gradient is 1e-7 of an unscaled one.

    A LayerScale (CaiT, ConvNeXt) starts at 1e-6 the same way, but Adam grows a
    trained scale by about its learning rate per step; a fixed scale keeps the
    branch's gradient under float32's half-ulp of its weights for the whole run.
    """

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 64)
        self.branch = nn.Linear(64, 64)
        self.register_buffer("gamma", torch.full((64,), 1e-7))
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        return self.head(h + self.gamma * torch.tanh(self.branch(h)))


def layer_scaled_fit(logdir, make_optimizer, steps=30):
    """``LayerScaled`` trained by ``make_optimizer(params)``; (its findings, the branch's grad_to_weight and update)."""
    torch.manual_seed(0)
    model = LayerScaled()
    st, ctx, eid, run = train(logdir, model, make_optimizer(model.parameters()), steps)
    matrix = queries.matrix(st, ctx, eid, st.run(ctx, eid, run), "stats", "layer")
    j = matrix.rows.index("branch")
    ratio = matrix.slab("grad_to_weight", "last")[0][:, j]
    update = matrix.slab("update_to_weight", "last")[0][:, j]
    return queries.findings(st, ctx, eid, run), ratio, update


def test_a_gradient_under_float32s_half_ulp_that_adam_still_moves_is_not_vanishing(tmp_path):
    found, ratio, update = layer_scaled_fit(tmp_path, lambda p: torch.optim.Adam(p, 1e-3))
    assert (ratio < 6e-8).all() and (update > 1e-5).all()  # the premise: a tiny gradient, weights that move
    assert not [f for f in found if f.kind == "vanishing"], [f.message for f in found]


def test_a_gradient_under_float32s_half_ulp_that_sgd_cannot_move_is_vanishing(tmp_path):
    found, ratio, update = layer_scaled_fit(tmp_path, lambda p: torch.optim.SGD(p, 0.1))
    assert (ratio < 6e-8).all() and (update < 1e-7).all()  # the premise: a tiny gradient, a tiny SGD step
    vanishing = {f.kind: f for f in found}["vanishing"]
    assert "branch" in vanishing.layers and "in float32" in vanishing.message


@pytest.mark.parametrize("every", [1, 5])
def test_gradients_a_loop_stops_clearing_are_an_error_from_that_step(tmp_path, every):
    """A loop that calls ``zero_grad()`` for 10 steps and then no more: an error from step 10 over every row.

    The writer saw it (``torch/cleared.py``) and marked the layouts from then
    on; the clean run's layouts carry no mark (their bytes are unchanged).
    """
    target = torch.randn(16, 4)
    for name, clears_until in (("clean", 40), ("stops", 10)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the writer's own warning: tests/torch/test_optimizer.py
            with GradientWriter(tmp_path / name, model, optimizer=optimizer, every_n_steps=every) as writer:
                for step in range(40):
                    if step < clears_until:
                        optimizer.zero_grad()
                    x = torch.randn(64, 16)
                    nn.functional.mse_loss(model(x), torch.tanh(x @ target)).backward()
                    writer.write(step)
                    optimizer.step()
        st, ctx, eid = store.local_store(str(tmp_path))
        found = {f.kind: f for f in queries.findings(st, ctx, eid, name)}
        layouts = [s.content for s in st.run(ctx, eid, name).layouts("stats", "layer")]
        if name == "clean":
            assert "not_cleared" not in found
            assert not any("gradients_not_cleared" in c for c in layouts)
            continue
        f = found["not_cleared"]
        assert f.severity == "error" and f.layers == ["0", "2", "4"]
        # Step 10's backward added into step 9's gradient: the first step written after it (windowed: the write of
        # steps 6-10) is the first marked; 39 is the last write (windowed: the partial window at close).
        assert f.steps == [10, 39]
        assert "Call optimizer.zero_grad() once per step, before backward()" in f.message


def test_a_layer_another_optimizer_moves_is_not_said_to_never_move(tmp_path):
    """A GAN in one writer that follows the generator's optimizer: the discriminator moves under its own.

    No group of the followed optimizer holds the discriminator, so the
    writer measures an update of 0 for it; its weights' norm, stored at
    every write, changes all the same. "They never move" would be false.
    """
    torch.manual_seed(0)
    gen, disc = (
        nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)),
        nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)),
    )
    both = nn.ModuleDict({"gen": gen, "disc": disc})
    opt_gen, opt_disc = torch.optim.Adam(gen.parameters(), 1e-3), torch.optim.Adam(disc.parameters(), 1e-3)
    bce = nn.BCEWithLogitsLoss()
    start = disc[0].weight.detach().clone()
    with pytest.warns(UserWarning, match=r"if another optimizer steps them \(a GAN's other network\)"):
        with GradientWriter(tmp_path, both, optimizer=opt_gen) as writer:
            for step in range(40):
                real, fake = torch.randn(32, 2) + 2.0, gen(torch.randn(32, 4))
                opt_disc.zero_grad()
                (bce(disc(real), torch.ones(32, 1)) + bce(disc(fake.detach()), torch.zeros(32, 1))).backward()
                opt_disc.step()
                opt_gen.zero_grad()
                bce(disc(fake), torch.ones(32, 1)).backward()  # also gives the discriminator a gradient
                writer.write(step)
                opt_gen.step()
    assert not torch.equal(disc[0].weight.detach(), start)  # the premise: the discriminator moved
    st, ctx, eid = store.local_store(tmp_path)
    found = queries.findings(st, ctx, eid, next(iter(st.runs(ctx, eid))))
    assert not [f for f in found if f.kind == "not_learning" and {"disc.0", "disc.2"} & set(f.layers)], [
        f.message for f in found
    ]


def test_a_layer_partly_outside_the_groups_is_still_named(tmp_path):
    """Layer 2's bias in no group, its weight in one: the layer's weights move, and it is named all the same."""

    def groups(m):
        held = [p for n, p in m.named_parameters() if n != "2.bias"]
        return torch.optim.AdamW(held, lr=1e-3)

    with pytest.warns(UserWarning, match=r"2\.bias gets a gradient but no parameter group"):
        found = torch_fit(tmp_path, groups)
    unheld = [f for f in found if f.kind == "not_learning" and f.severity == "warning"]
    assert [f.layers for f in unheld] == [["2"]], [f.message for f in found]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


@pytest.mark.parametrize("follow", [True, False], ids=["optimizer_followed", "no_optimizer"])
def test_a_loop_that_never_calls_optimizer_step_is_a_warning_that_no_weights_move(tmp_path, follow):
    """Gradients computed at every step, ``optimizer.step()`` left out: the gradients are healthy, the weights stay."""
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    target = torch.randn(16, 4)
    before = [p.detach().clone() for p in model.parameters()]
    with GradientWriter(tmp_path, model, optimizer=optimizer if follow else None) as writer:
        for step in range(30):
            x = torch.randn(64, 16)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), torch.tanh(x @ target)).backward()
            writer.write(step)  # and no optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # the premise: nothing moved
    st, ctx, eid = store.local_store(tmp_path)
    found = queries.findings(st, ctx, eid, next(iter(st.runs(ctx, eid))))
    (still,) = [f for f in found if f.severity != "info"]
    assert still.kind == "not_learning" and still.severity == "warning" and still.metric == "weight_norm"
    assert still.layers == ["0", "2", "4"] and still.steps == [0, 29]
    assert "No weights move" in still.message and "optimizer.step()" in still.message
    assert all(e["writes_unchanged"] == 30 and e["median_grad_norm"] > 0 for e in still.evidence.values())


def test_a_whole_network_at_learning_rate_0_is_a_warning_not_frozen_information(tmp_path):
    """Every group at learning rate 0: not an intended freeze of a part (that is information), nothing learns."""
    found = torch_fit(tmp_path, lambda m: torch.optim.SGD(m.parameters(), lr=0.0), steps=30)
    (still,) = found
    assert still.kind == "not_learning" and still.severity == "warning" and still.layers == ["0", "2", "4", "6"]
    assert "update of exactly 0" in still.message
    assert all(e["median_update_to_weight"] == 0 for e in still.evidence.values())


@pytest.mark.parametrize("make", [torch.optim.Adam, torch.optim.SGD], ids=["adam", "sgd"])
def test_a_loop_that_steps_gets_no_still_weights_warning(tmp_path, make):
    """The control: the same loop with optimizer.step(), Adam and SGD at 1e-3 (SGD slow, but moving)."""
    found = torch_fit(tmp_path, lambda m: make(m.parameters(), lr=1e-3), steps=30)
    assert not [f for f in found if f.kind == "not_learning"], [f.message for f in found]
