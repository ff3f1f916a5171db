"""The PyTorch writer on real models: GPT-2 small and ResNet-50, against the bare step and what users log today.

``python -m benchmarks --only torch_models``. GPT-2 small is
``transformers.GPT2LMHeadModel(GPT2Config())`` (124 M parameters, built
from its config: nothing is downloaded); ResNet-50 is ``resnet.resnet50``
(25.6 M, torchvision's layout; timm needs torchvision, which is not
installed here). Each is trained with SGD in the ways of
``benchmarks.torch_ways``: bare, ``tb_gradcheck`` every step and every 10,
the per-parameter ``.item()`` loop, Lightning's ``grad_norm`` logged with
``add_scalar``, ``add_histogram`` per parameter, ``wandb.watch`` offline.
Figures are medians of interleaved rounds, as ratios to the bare step of
the same rounds.

Sizes: ``small`` (the default without CUDA; GPT-2 at 1 x 64 tokens,
ResNet-50 at 2 x 3 x 64 x 64: a step is a fraction of a second to seconds
on a CPU) or ``train`` (the default with CUDA; GPT-2 at 8 x 512 tokens,
ResNet-50 at 64 x 3 x 224 x 224, under bfloat16 autocast on CUDA).
``--quick`` shrinks GPT-2 to 2 blocks of width 128 and ResNet-50's input to
32 x 32 (a smoke run). Environment variables (``python -m benchmarks
--models/--size/--compile/--threads`` set them):

- ``TB_GRADCHECK_BENCH_MODELS``: comma-separated, of ``gpt2``, ``resnet50``;
- ``TB_GRADCHECK_BENCH_SIZE``: ``small`` or ``train``;
- ``TB_GRADCHECK_BENCH_COMPILE``: ``0`` (eager), ``1`` (``torch.compile``
  only) or ``both`` (the default with CUDA; ``0`` without);
- ``TB_GRADCHECK_BENCH_ROUNDS``: interleaved rounds (3 small, 5 train);
- ``TB_GRADCHECK_BENCH_THREADS``: ``torch.set_num_threads`` (on a shared,
  loaded CPU one thread is several times faster than two whose OpenMP
  workers wait on each other).
"""

import os
import tempfile
import warnings

from benchmarks import torch_ways
from benchmarks.common import row
from benchmarks.common import skipped

MODELS = ("gpt2", "resnet50")
SIZES = ("small", "train")
# At training sizes every way every step and every 10. At size small (a CPU,
# where a GPT-2 step takes seconds) the loops' and Lightning's every 10 are
# left out (a tenth of their every-step cost) and add_histogram is every 10
# only (on a CPU a GPT-2 step's histograms take several times the step).
WAYS_SMALL = [
    ("tb_gradcheck", 1),
    ("tb_gradcheck", 10),
    ("norm_item", 1),
    ("lightning", 1),
    ("histogram", 10),
    ("wandb", 1),
    ("wandb", 10),
]
WAYS_TRAIN = [(record, every) for record in torch_ways.RECORDS[1:] for every in (1, 10)]
HISTOGRAM_SKIPPED = "at size small (every 10 measured; --size train measures it)"
# Only the ways whose cost torch.compile changes: the others' recording is eager either way.
COMPILED_WAYS = [("tb_gradcheck", 1), ("tb_gradcheck", 10), ("norm_item", 1), ("lightning", 1)]


def config(cuda):
    """The run's settings from the environment (the module docstring); raises ValueError on a bad value."""
    models = [m.strip() for m in os.environ.get("TB_GRADCHECK_BENCH_MODELS", ",".join(MODELS)).split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"Expected TB_GRADCHECK_BENCH_MODELS of {MODELS}. Received: {unknown}")
    size = os.environ.get("TB_GRADCHECK_BENCH_SIZE", "train" if cuda else "small")
    if size not in SIZES:
        raise ValueError(f"Expected TB_GRADCHECK_BENCH_SIZE in {SIZES}. Received: {size!r}")
    compiled = os.environ.get("TB_GRADCHECK_BENCH_COMPILE", "both" if cuda else "0")
    modes = {"0": [False], "1": [True], "both": [False, True]}
    if compiled not in modes:
        raise ValueError(f"Expected TB_GRADCHECK_BENCH_COMPILE in {sorted(modes)}. Received: {compiled!r}")
    rounds = int(os.environ.get("TB_GRADCHECK_BENCH_ROUNDS", "5" if size == "train" else "3"))
    threads = os.environ.get("TB_GRADCHECK_BENCH_THREADS")
    return models, size, modes[compiled], rounds, int(threads) if threads else None


def _gpt2(torch, size, quick, device):
    """``(name, model, loss_fn)`` of GPT-2 small (or a 2-block one with ``quick``), language-model loss."""
    import transformers

    transformers.logging.set_verbosity_error()
    if quick:
        cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
        batch, tokens = 1, 32
    else:
        cfg = transformers.GPT2Config()  # GPT-2 small: 12 blocks, width 768, 50,257 tokens, 124 M parameters
        batch, tokens = (8, 512) if size == "train" else (1, 64)
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    ids = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device)

    def loss_fn(module):
        with _autocast(torch, device):
            return module(input_ids=ids, labels=ids).loss

    n = sum(p.numel() for p in model.parameters())
    return f"gpt2_{cfg.n_layer}x{cfg.n_embd}_{n / 1e6:.0f}M_b{batch}x{tokens}", model, loss_fn


def _resnet50(torch, size, quick, device):
    """``(name, model, loss_fn)`` of ResNet-50 on random images, cross-entropy over 1,000 classes."""
    from benchmarks.resnet import resnet50  # imports torch: not at the top, jax_models reads this module's config

    batch, side = (2, 32) if quick else ((64, 224) if size == "train" else (2, 64))
    model = resnet50().to(device)
    x = torch.randn(batch, 3, side, side, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)

    def loss_fn(module):
        with _autocast(torch, device):
            return torch.nn.functional.cross_entropy(module(x), y)

    return f"resnet50_b{batch}x{side}", model, loss_fn


def _autocast(torch, device):
    """bfloat16 autocast on CUDA (how these models train there); nothing on a CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def run(quick=False):
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    models, size, modes, rounds, threads = config(cuda)
    if quick:
        rounds = 2
    if threads:
        torch.set_num_threads(threads)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # One compiled copy per way: more than Dynamo's default of 8 entries per code object.
    torch._dynamo.config.cache_size_limit = 64
    builders = {"gpt2": _gpt2, "resnet50": _resnet50}
    ways = WAYS_TRAIN if size == "train" else WAYS_SMALL
    rows = []
    shared = {}  # the wandb run
    with tempfile.TemporaryDirectory() as logdir, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for model_name in models:
                torch.manual_seed(0)
                name, model, loss_fn = builders[model_name](torch, size, quick, device)
                for compiled in modes:
                    where = device.type + (f", {torch.get_num_threads()} threads" if not cuda else "")
                    label = f"torch {name} ({where}{', compiled' if compiled else ''})"
                    bare, per_step, skipped_rows = torch_ways.time_model(
                        torch,
                        label,
                        model,
                        loss_fn,
                        device,
                        logdir,
                        shared,
                        COMPILED_WAYS if compiled else ways,
                        rounds,
                        warmup=2 if compiled else 1,  # a call is 10 steps: the first write and the window's
                        compile_model=compiled,
                    )
                    for way, seconds in sorted(per_step.items()):
                        rows.append(row(f"{label} {way} / bare step", bare * 1e3, seconds * 1e3, "ms"))
                    if "norm_item_every1" in per_step and "tb_gradcheck_every1" in per_step:
                        rows.append(
                            row(
                                f"{label} tb_gradcheck every step / per-parameter .item() loop every step",
                                per_step["norm_item_every1"] * 1e3,
                                per_step["tb_gradcheck_every1"] * 1e3,
                                "ms",
                            )
                        )
                    rows += skipped_rows
                    if not compiled and size != "train":
                        rows.append(skipped(f"{label} histogram_every1 / bare step", HISTOGRAM_SKIPPED))
                del model, loss_fn
        finally:
            torch_ways.close_shared(shared)
    return rows
