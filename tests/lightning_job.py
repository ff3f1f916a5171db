"""A small Lightning fit with ``tb_gradcheck.lightning.GradientCallback`` and its own float64 record of each step.

    python tests/lightning_job.py ddp LOGDIR OUT   # 2 gloo processes (Lightning starts rank 1 from this command)

test_lightning.py imports ``fit`` and runs it in its own process; the DDP
run needs a script, since Lightning's DDP on CPUs starts every other rank
by running the same command again. Each rank saves its record to
``OUT/rank<r>.npz``.

The record is taken by the test side only, on the optimizer Lightning
steps: a step post-hook (after the step: ``.grad`` is what the step
applied, and AdamW does not change it) and a pre-hook (the weights before
the step: the closure Lightning runs inside the step changes no weight),
and the module's own ``on_before_optimizer_step`` (before clipping).
"""

import sys
import types

if __name__ == "__main__":
    # Lightning's logger (TensorBoard's SummaryWriter) imports TensorFlow where it is installed: 20 s per
    # process on a busy 2-core machine, three processes here. TensorBoard takes its TensorFlow stub, as
    # where TensorFlow is not installed, when this module imports.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

import lightning.pytorch as L  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import tb_gradcheck.lightning  # noqa: E402

SAMPLES = 16
BATCH = 2
ACCUMULATE = 2
CLIP = 0.05  # small enough to bind at every step of this net
EPOCHS = 2


class Net(L.LightningModule):
    """Modules registered out of forward order (the rows follow the forward pass: body, norm, head)."""

    def __init__(self, overflow_at=None):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(8, 3)
        self.body = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.overflow_at = overflow_at
        self.applied, self.before, self.update = {}, {}, {}
        self._weights = None

    def forward(self, x):
        return self.head(torch.tanh(self.norm(self.body(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=True)
        if self.trainer.global_step == self.overflow_at:
            loss = loss * 1e38  # times the GradScaler's 65536: Inf, and a step the scaler refuses
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)
        return optimizer

    def on_before_optimizer_step(self, optimizer):
        self.before[self.trainer.global_step] = _norms(p.grad for p in self.parameters())

    def _before_step(self, optimizer, args, kwargs):
        self._weights = [p.detach().double().clone() for p in self.parameters()]

    def _after_step(self, optimizer, args, kwargs):
        step = self.trainer.global_step
        self.applied[step] = _norms(p.grad for p in self.parameters())
        self.update[step] = _norms(p.detach().double() - w for p, w in zip(self.parameters(), self._weights))


def _norms(tensors):
    return np.array([np.linalg.norm(t.detach().double().cpu().numpy().ravel()) for t in tensors])


def data():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(SAMPLES, 4, generator=g) * 3, torch.randn(SAMPLES, 3, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


def fit(logdir, overflow_at=None, callback=None, **trainer_kwargs):
    """Fits ``Net`` with the callback and a TensorBoardLogger at ``logdir``; returns (net, callback, trainer)."""
    net = Net(overflow_at)
    callback = callback or tb_gradcheck.lightning.GradientCallback()
    options = dict(
        max_epochs=EPOCHS,
        accelerator="cpu",
        accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=CLIP,
        logger=L.loggers.TensorBoardLogger(str(logdir)),
        callbacks=[callback],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    options.update(trainer_kwargs)
    trainer = L.Trainer(**options)
    trainer.fit(net, data())
    return net, callback, trainer


def save(net, callback, path):
    steps = sorted(net.applied)
    np.savez(
        path,
        steps=np.array(steps),
        applied=np.stack([net.applied[s] for s in steps]),
        before=np.stack([net.before[s] for s in steps]),
        update=np.stack([net.update[s] for s in steps]),
        log_dir=np.array(str(callback.log_dir)),
    )


if __name__ == "__main__":
    mode, logdir, out = sys.argv[1:4]
    if mode != "ddp":
        raise SystemExit(f"Expected the mode ddp. Received: {mode!r}")
    torch.set_num_threads(1)
    net, callback, trainer = fit(logdir, strategy="ddp", devices=2)
    save(net, callback, f"{out}/rank{trainer.global_rank}.npz")
