"""PyTorch runs written with the optimizer: units dead from initialisation, layers cut off, vanishing that stops learning, a head the optimizer leaves out.

Each is written by ``tb_gradcheck.torch.GradientWriter`` given the
optimizer, so the update columns, and the findings that read them
(``not_learning``), are there. Premises about units are measured on the
units' outputs (``silent``: a forward hook on the activation), over the
run's examples, not on what the writer saw. Rows are module paths
(``dense_1``), without the model's scope.
"""

import collections
import math
import warnings

import numpy as np
import torch
from torch import nn

from corpus.healthy import _batches
from corpus.healthy import _regression
from corpus.registry import Expect
from corpus.registry import head_tail
from corpus.registry import scenario
from tb_gradcheck.torch import GradientWriter

# Tiny models on a shared machine: one intra-op thread (as tests/torch does).
torch.set_num_threads(1)
JUMPS = (150, 220)
DEPTH = 16


def _mlp(widths, activation, he=True, features=16, out=1):
    """``dense_i`` / ``act_i`` blocks and an ``out`` layer; He's normal init and zero biases, or PyTorch's default."""
    layers = collections.OrderedDict()
    for i, width in enumerate(widths):
        layers[f"dense_{i}"] = nn.Linear(features if i == 0 else widths[i - 1], width)
        if he:
            nn.init.kaiming_normal_(layers[f"dense_{i}"].weight, nonlinearity="relu")
            nn.init.zeros_(layers[f"dense_{i}"].bias)
        layers[f"act_{i}"] = activation()
    layers["out"] = nn.Linear(widths[-1], out)
    return nn.Sequential(layers)


def silent(model, activation, x):
    """bool ``[units]``: the units whose output (``activation``'s, by a forward hook) is 0 on every example of ``x``."""
    seen = []
    hook = getattr(model, activation).register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    try:
        with torch.no_grad():
            model(torch.from_numpy(x))
    finally:
        hook.remove()
    return (seen[0] <= 0).all(dim=0).numpy()


def _fit(run_dir, model, batches, optimizer, before_step=None, clears_until=None, steps_until=None):
    """MSE training written with the optimizer; ``(losses, per-step gradient norms, writer warnings)``.

    ``before_step(step)`` runs before each step (a learning-rate change).
    ``clears_until``: the loop calls ``zero_grad()`` before this step only
    (None: at every step). ``steps_until``: the same for ``optimizer.step()``.
    """
    losses, norms = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with GradientWriter(run_dir, model, optimizer=optimizer) as writer:
            for step, (x, y) in enumerate(batches):
                if before_step is not None:
                    before_step(step)
                if clears_until is None or step < clears_until:
                    optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
                loss.backward()
                norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters())))
                writer.write(step)
                if steps_until is None or step < steps_until:
                    optimizer.step()
                losses.append(float(loss.detach()))
    said = [str(w.message) for w in caught if "tb_gradcheck" in str(w.message)]
    return np.array(losses), np.array(norms), said


@scenario(Expect("dead", ("dense_1",), severity="warning"))
def dead_from_init_bias(run_dir):
    """A 4-layer ReLU MLP whose second hidden layer's bias starts at -5 (a bias initialised wrong): three quarters of its units never fire from step 0 and never come back, while Adam trains the rest. At the latest writes the share without gradient is under the 90% a silent layer has, so a rule that only knew "silent" called it recovered; it is most of the layer, dead for good."""
    torch.manual_seed(3)
    x, y = _regression(3)
    model = _mlp([64] * 4, nn.ReLU)
    with torch.no_grad():
        model.dense_1.bias.fill_(-5.0)
    before = silent(model, "act_1", x)
    losses, _, _ = _fit(run_dir, model, _batches(x, y, 64, 300, 3), torch.optim.Adam(model.parameters(), 1e-3))
    after = silent(model, "act_1", x)
    first, last = head_tail(losses)
    numbers = {
        "silent_start": float(before.mean()),
        "silent_end": float(after.mean()),
        "silent_at_start_still_silent": float(after[before].mean()),
        "loss_first": first,
        "loss_last": last,
    }
    return numbers, [
        ("two thirds or more of dense_1 silent on every example at step 0", before.mean() >= 2 / 3),
        ("two thirds or more still silent at the end", after.mean() >= 2 / 3),
        ("nine in ten of the units silent at step 0 never came back", after[before].mean() >= 0.9),
    ]


@scenario(
    # The second jump may raise the gradient (about 1.8 orders here): true, so allowed.
    Expect("exploding", (), allowed=r"dense_\d|out"),
    Expect("dead", ("dense_1", "dense_2"), steps=(JUMPS[0], JUMPS[1] + 30), severity="warning"),
)
def dying_then_cut_off(run_dir):
    """A ReLU MLP trains at Adam 1e-3; its learning rate jumps fifty-fold at step 150, and most of dense_1's and dense_2's units die (Lu et al. 2019); at step 220 it jumps again, to 1, and every unit of dense_2 dies. From then on no gradient reaches the layers before dense_2: dense_1 is cut off, which is no recovery (its units are as dead as before), and dense_0, whose units are alive, is no dead layer at all."""
    torch.manual_seed(1)
    x, y = _regression(1)
    model = _mlp([64] * 3, nn.ReLU)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    shares = {}

    def jump(step):
        if step in JUMPS:
            for group in optimizer.param_groups:
                group["lr"] = 5e-2 if step == JUMPS[0] else 1.0
        if step == JUMPS[1]:  # before the second jump's step
            shares.update(
                {f"silent_dense_{i}_before_second": float(silent(model, f"act_{i}", x).mean()) for i in range(3)}
            )

    _fit(run_dir, model, _batches(x, y, 64, 300, 1), optimizer, jump)
    shares.update({f"silent_dense_{i}_end": float(silent(model, f"act_{i}", x).mean()) for i in range(3)})
    # No gradient reaches dense_0 at the end: every unit of a later layer is silent.
    model.zero_grad()
    nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    shares["dense_0_grad_norm_end"] = float(model.dense_0.weight.grad.norm())
    return shares, [
        (
            "half or more of dense_1 and dense_2 silent before the second jump, from a live start",
            min(shares["silent_dense_1_before_second"], shares["silent_dense_2_before_second"]) >= 0.5,
        ),
        ("dense_1 still mostly silent at the end (75% or more)", shares["silent_dense_1_end"] >= 0.75),
        ("every unit of dense_2 silent at the end", shares["silent_dense_2_end"] == 1),
        ("dense_0's units alive at the end (under 10% silent)", shares["silent_dense_0_end"] < 0.1),
        ("yet no gradient reaches dense_0 at the end", shares["dense_0_grad_norm_end"] == 0),
    ]


@scenario(
    Expect("vanishing", ("dense_0", "dense_1"), allowed=r"dense_\d+", severity="warning"),
    Expect("not_learning", (), allowed=r"dense_\d+", under="vanishing"),
)
def deep_sigmoid_default_init(run_dir):
    """A 16-layer sigmoid MLP at PyTorch's default Linear init (U[-1/sqrt(n), 1/sqrt(n)]) with SGD: the gradient shrinks by the sigmoid's slope (at most 1/4) times a small weight at every layer (Glorot & Bengio 2010), so the input side's gradient, and with it its update, is orders of magnitude below the output side's. The layers that do not learn do not learn because their gradient vanishes: one cause, one finding."""
    torch.manual_seed(20)
    x, y = _regression(20)
    model = _mlp([64] * DEPTH, nn.Sigmoid, he=False)
    _, _, _ = _fit(run_dir, model, _batches(x, y, 64, 200, 20), torch.optim.SGD(model.parameters(), 0.1))
    model.zero_grad()
    nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    first, last = model.dense_0.weight.grad.norm(), model.out.weight.grad.norm()
    orders = float(torch.log10(last / first))
    return {"output_over_input_orders": orders}, [("input layer 3+ orders below the output layer", orders >= 3.0)]


@scenario(Expect("not_learning", ("head",), severity="warning"))
def head_outside_optimizer(run_dir):
    """A head added after the optimizer was built from the backbone's parameters: it requires and gets a gradient at every step, but no parameter group holds it, so it never moves. The numbers cannot tell that from a group at learning rate 0 (an update of exactly 0 either way), but the writer, which sees the groups, warns at the first written step naming the head and stores it in the layout (``outside_optimizer``): the finding is a warning naming the head, not the "frozen by the optimizer" information."""
    torch.manual_seed(5)
    x, y = _regression(5)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    optimizer = torch.optim.Adam(backbone.parameters(), 1e-3)
    model = nn.Sequential(collections.OrderedDict(backbone=backbone, head=nn.Linear(64, 1)))
    start = model.head.weight.detach().clone()
    _, _, said = _fit(run_dir, model, _batches(x, y, 64, 100, 5), optimizer)
    model.zero_grad()
    nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    numbers = {
        "head_moved": float((model.head.weight.detach() - start).abs().max()),
        "head_grad_norm_end": float(model.head.weight.grad.norm()),
        "writer_warnings": said,
    }
    return numbers, [
        ("the head never moved", numbers["head_moved"] == 0),
        ("it gets a gradient", numbers["head_grad_norm_end"] > 0),
        ("the writer warned, naming it", any("head.weight" in w and "parameter group" in w for w in said)),
    ]


@scenario(
    Expect("not_learning", ("head",), severity="warning"),
    Expect("vanishing", ("dense_0", "dense_1", "dense_2"), severity="warning", under="not_learning"),
    # The body inflates its features to push the loss through a head that cannot move: the head's gradient
    # grows 4 orders and ends over 1e3 times the network's weights (the premise measures it), too large
    # by the explosion rule's measure. True, so allowed.
    Expect("exploding", (), allowed="head"),
)
def small_head_outside_optimizer(run_dir):
    """A new head initialised small (weights at 1e-4, as fine-tuning recipes start a head near zero) and left out of the optimizer, which was built from the backbone before the head was added. The head never moves, so it keeps its small weights, and the backward signal into the body passes through them: the body's gradient sits orders below the head's at every step, at one level across depth. That vanishing follows from the head not learning, and is attached to it: one cause, one finding."""
    torch.manual_seed(6)
    x, y = _regression(6)
    body = _mlp([64] * 3, nn.ReLU)
    del body.out  # replaced by the new head
    optimizer = torch.optim.Adam(body.parameters(), 1e-3)
    head = nn.Linear(64, 1)
    with torch.no_grad():
        head.weight.normal_(0.0, 1e-4)
        head.bias.zero_()
    body.add_module("head", head)
    start = head.weight.detach().clone()
    _, _, said = _fit(run_dir, body, _batches(x, y, 64, 200, 6), optimizer)
    body.zero_grad()
    nn.functional.mse_loss(body(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    orders = float(torch.log10(head.weight.grad.norm() / body.dense_0.weight.grad.norm()))
    grads = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in body.parameters()))
    weights = math.sqrt(sum(float(p.detach().norm()) ** 2 for p in body.parameters()))
    numbers = {"head_over_body_orders": orders, "network_grad_to_weight_end": grads / weights, "writer_warnings": said}
    return numbers, [
        ("the head never moved", bool(torch.equal(head.weight.detach(), start))),
        ("the body's gradient is 3+ orders below the head's", orders >= 3.0),
        ("the writer warned, naming the head", any("head.weight" in w and "parameter group" in w for w in said)),
    ]


STOPS_CLEARING = 60


@scenario(Expect("not_cleared", ("dense_0", "dense_1", "dense_2", "out"), steps=(STOPS_CLEARING, STOPS_CLEARING)))
def zero_grad_dropped(run_dir):
    """A tanh MLP trained with Adam whose loop stops calling optimizer.zero_grad() at step 60 (a refactor that moved it out of the loop): from then on each backward() adds into the gradient the optimizer already applied, so every step applies the sum of all gradients since. Adam's normalisation keeps it from diverging; it just trains on a stale, ever-longer sum, whose norm grows with every step."""
    torch.manual_seed(8)
    x, y = _regression(8)
    model = _mlp([64] * 3, nn.Tanh, he=False)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    _, norms, said = _fit(run_dir, model, _batches(x, y, 64, 200, 8), optimizer, clears_until=STOPS_CLEARING)
    model.zero_grad()
    nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    fresh = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
    numbers = {"applied_over_fresh_end": float(norms[-1] / fresh), "writer_warnings": said}
    return numbers, [
        # The sum of 140 steps' gradients, which partly cancel: about 5x a fresh one here.
        ("the gradient applied at the end is twice or more a fresh one", numbers["applied_over_fresh_end"] >= 2),
        ("the writer warned", any("nothing cleared them" in w for w in said)),
    ]


STOPS_STEPPING = 60


@scenario(Expect("not_learning", ("dense_0", "dense_1", "dense_2", "out"), steps=(STOPS_STEPPING, STOPS_STEPPING)))
def optimizer_step_dropped(run_dir):
    """A tanh MLP trained with Adam whose loop stops calling optimizer.step() at step 60 (a refactor that moved it under a condition that no longer holds): backward() still runs, so every gradient is real and of its usual size, and the weights never move again. Only the weights show it: each layer's stored norm is the same at every write from step 60 on."""
    torch.manual_seed(9)
    x, y = _regression(9)
    model = _mlp([64] * 3, nn.Tanh, he=False)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    kept = {}

    def before_step(step):
        if step == STOPS_STEPPING:
            kept.update({n: p.detach().clone() for n, p in model.named_parameters()})

    losses, norms, _ = _fit(
        run_dir, model, _batches(x, y, 64, 200, 9), optimizer, before_step, steps_until=STOPS_STEPPING
    )
    numbers = {
        "loss_before": float(np.mean(losses[STOPS_STEPPING - 10 : STOPS_STEPPING])),
        "loss_end": float(np.mean(losses[-10:])),
        "grad_norm_ratio_end_over_before": float(
            np.median(norms[-20:]) / np.median(norms[STOPS_STEPPING - 20 : STOPS_STEPPING])
        ),
    }
    return numbers, [
        ("no weight moved from step 60 on", all(torch.equal(kept[n], p) for n, p in model.named_parameters())),
        ("the loss was falling before step 60", numbers["loss_before"] < 0.9 * float(np.mean(losses[:10]))),
        ("the gradient kept its size (within 3x)", 1 / 3 <= numbers["grad_norm_ratio_end_over_before"] <= 3),
    ]
