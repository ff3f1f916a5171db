"""The PyTorch writer's overhead against the bare step and against what PyTorch users log today.

Three models (a 20-layer MLP, a CNN with BatchNorm, a 6-block Transformer
encoder of width 256), each trained with a plain eager loop in the ways of
``benchmarks.torch_ways`` (bare, ``tb_gradcheck``, ``add_histogram``, the
per-parameter ``.item()`` loop, ``wandb.watch`` offline), every step and
every 10 steps, all timed in the same interleaved rounds. GPT-2 small and
ResNet-50 are ``benchmarks.torch_models`` (``--only torch_models``).

Figures are medians of interleaved rounds, as ratios to the bare step.
Targets (issue 27): every step, at or below the per-parameter ``.item()``
loop; every 10 steps, within 5% of the bare step on the CNN and the
Transformer. With ``activations=True`` (issue 44), every 10 steps within 2%
of the writer without it on the CPU models.
"""

import tempfile
import warnings

from benchmarks import torch_ways
from benchmarks.common import row

RECORDS = ("tb_gradcheck", "histogram", "norm_item", "wandb")
# activations=True, every 10 steps, against the writer without them (issue 44).
TARGET_ACTIVATIONS = 1.02
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
                label = f"torch {name} ({device.type})"
                bare, per_step, skipped_rows = torch_ways.time_model(
                    torch,
                    label,
                    model,
                    lambda module, x=x, y=y: torch.nn.functional.mse_loss(module(x), y),
                    device,
                    logdir,
                    shared,
                    [(record, every) for record in RECORDS for every in (1, 10)] + [("tb_gradcheck_act", 10)],
                    repeats,
                )
                rows += activation_rows(label, per_step, device)
                for way, seconds in sorted(per_step.items()):
                    if way == "tb_gradcheck_act_every10":
                        continue  # its row is against the writer without activations
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
                rows += skipped_rows
        finally:
            torch_ways.close_shared(shared)
    return rows


def activation_rows(label, per_step, device):
    """The row of ``activations=True`` every 10 steps against the writer without it (target on a CPU)."""
    if "tb_gradcheck_act_every10" not in per_step or "tb_gradcheck_every10" not in per_step:
        return []
    return [
        row(
            f"{label} tb_gradcheck activations=True every10 / tb_gradcheck every10",
            per_step["tb_gradcheck_every10"] * 1e3,
            per_step["tb_gradcheck_act_every10"] * 1e3,
            "ms",
            TARGET_ACTIVATIONS if device.type == "cpu" else None,
        )
    ]
