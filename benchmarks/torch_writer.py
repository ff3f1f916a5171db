"""The PyTorch writer's overhead against the bare step and against what PyTorch users log today.

Three models (a 20-layer MLP, a CNN with BatchNorm, a 6-block Transformer
encoder of width 256), each trained with a plain eager loop (zero_grad,
forward, backward, ``optimizer.step``) in several ways, all timed in the
same interleaved rounds:

- ``bare``: nothing recorded;
- ``tb_gradcheck``: ``tb_gradcheck.torch.GradientWriter`` (with the
  optimizer, so the update columns too);
- ``histogram``: ``SummaryWriter.add_histogram`` of every parameter's
  gradient (what ``torch.utils.tensorboard`` users write);
- ``norm_item``: one ``p.grad.norm().item()`` per parameter logged with
  ``add_scalar`` (Lightning's ``grad_norm`` style: a host read each);
- ``wandb``: ``watch(model, log="gradients", log_freq=N)`` in offline mode
  (no network: ``WANDB_MODE=offline``, a temporary directory), when wandb
  is installed. Its ``watch`` logs through the one global run, so both of
  its ways share one run (``_wandb_run``), each watching its own model.

Each way writes every step and every 10 steps. A timed call runs 10 steps
and waits for the device, so a window of 10 is exactly one write per call.
Figures are medians of interleaved rounds, as ratios to the bare step.
Targets (issue 27): every step, at or below the per-parameter ``.item()``
loop; every 10 steps, within 5% of the bare step on the CNN and the
Transformer.
"""

import os
import tempfile
import warnings

from benchmarks.common import interleaved
from benchmarks.common import row

STEPS_PER_CALL = 10
TARGET_EVERY10 = 1.05
TARGETED_EVERY10 = ("cnn_bn", "transformer6_w256")


def _models(torch, quick):
    nn = torch.nn
    width = 64 if quick else 256
    mlp = nn.Sequential(*[m for _ in range(20) for m in (nn.Linear(width, width), nn.ReLU())])
    channels = (32, 64, 64)
    cnn = nn.Sequential(
        nn.Conv2d(3, channels[0], 3, padding=1),
        nn.BatchNorm2d(channels[0]),
        nn.ReLU(),
        nn.Conv2d(channels[0], channels[1], 3, stride=2, padding=1),
        nn.BatchNorm2d(channels[1]),
        nn.ReLU(),
        nn.Conv2d(channels[1], channels[2], 3, stride=2, padding=1),
        nn.BatchNorm2d(channels[2]),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(channels[2], 10),
    )
    blocks = 2 if quick else 6
    layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, activation="gelu", batch_first=True)
    transformer = nn.Sequential(
        nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False), nn.Flatten(), nn.LazyLinear(10)
    )
    batch = 8 if quick else 64
    return [
        (f"mlp20_w{width}", mlp, (batch, width), (batch, width)),
        ("cnn_bn", cnn, (batch // 2, 3, 32, 32), (batch // 2, 10)),
        (f"transformer{blocks}_w{width}", transformer, (batch // 4, 64, width), (batch // 4, 10)),
    ]


# Offline and quiet: nothing reaches the network, nothing is printed over the table.
WANDB_ENVIRON = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_CONSOLE": "off",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
}


def _wandb_run(shared, logdir):
    """The one offline wandb run of the benchmark (``wandb.watch`` logs through the global run), or None."""
    if "wandb" not in shared:
        try:
            import wandb
        except ImportError:
            shared["wandb"] = None
            return None
        for name, value in WANDB_ENVIRON.items():
            os.environ.setdefault(name, value)
        shared["wandb"] = wandb.init(mode="offline", dir=logdir, project="tb_gradcheck_benchmark")
    return shared["wandb"]


def _ways(torch, name, model, x, y, device, logdir, shared):
    """``{way: (run 10 steps and wait, close)}`` for one model, each way with its own copy of the model."""
    import copy

    ways = {}
    for record in ("bare", "tb_gradcheck", "histogram", "norm_item", "wandb"):
        for every in (1, 10):
            if record == "bare" and every == 10:
                continue
            made = _make(torch, record, every, copy.deepcopy(model), x, y, device, os.path.join(logdir, name), shared)
            if made is not None:
                ways[record if record == "bare" else f"{record}_every{every}"] = made
    return ways


def _make(torch, record, every, model, x, y, device, logdir, shared):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    directory = os.path.join(logdir, f"{record}_{every}")
    writer = summary = run = None
    if record == "tb_gradcheck":
        from tb_gradcheck.torch import GradientWriter

        writer = GradientWriter(directory, model, every_n_steps=every, optimizer=optimizer)
    elif record in ("histogram", "norm_item"):
        from torch.utils.tensorboard import SummaryWriter

        summary = SummaryWriter(directory)
    elif record == "wandb":
        run = _wandb_run(shared, os.path.dirname(logdir))
        if run is None:
            return None
        run.watch(model, log="gradients", log_freq=every)
    named = [(n, p) for n, p in model.named_parameters()]
    state = {"step": 0}

    def one_step():
        step = state["step"]
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if writer is not None:
            writer.write(step)
        elif summary is not None and step % every == 0:
            for n, p in named:
                if record == "histogram":
                    summary.add_histogram(n, p.grad, step)
                else:
                    summary.add_scalar(f"grad_norm/{n}", p.grad.norm().item(), step)
        elif run is not None:
            run.log({"loss": loss.detach()}, commit=True)  # its own step: the ways share the run
        optimizer.step()
        state["step"] = step + 1

    def call():
        for _ in range(STEPS_PER_CALL):
            one_step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    def close():
        if writer is not None:
            writer.close()
        if summary is not None:
            summary.close()
        if run is not None:
            run.unwatch(model)

    for _ in range(2):  # warm up (lazy modules, allocator, first writes)
        call()
    return call, close


def run(quick=False):
    import torch

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    repeats = 3 if quick else 9
    rows = []
    shared = {}  # the wandb run
    with tempfile.TemporaryDirectory() as logdir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for name, model, x_shape, y_shape in _models(torch, quick):
                model = model.to(device)
                x = torch.randn(x_shape, device=device)
                y = torch.randn(y_shape, device=device)
                model(x)  # materialise lazy modules before the copies
                ways = _ways(torch, name, model, x, y, device, logdir, shared)
                timed = interleaved({k: v[0] for k, v in ways.items()}, repeats, 1)
                for _, close in ways.values():
                    close()
                bare = timed.pop("bare") / STEPS_PER_CALL
                per_step = {k: v / STEPS_PER_CALL for k, v in timed.items()}
                label = f"torch {name} ({device.type})"
                for way, seconds in sorted(per_step.items()):
                    target = None
                    if way == "tb_gradcheck_every10" and any(name.startswith(t) for t in TARGETED_EVERY10):
                        target = TARGET_EVERY10
                    rows.append(row(f"{label} {way} / bare step", bare * 1e3, seconds * 1e3, "ms", target))
                if "norm_item_every1" in per_step:
                    rows.append(
                        row(
                            f"{label} tb_gradcheck every step / per-parameter .item() loop every step",
                            per_step["norm_item_every1"] * 1e3,
                            per_step["tb_gradcheck_every1"] * 1e3,
                            "ms",
                            target=1.0,
                        )
                    )
        finally:
            if shared.get("wandb") is not None:
                shared["wandb"].finish()
    return rows
