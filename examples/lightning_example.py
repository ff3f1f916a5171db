"""Lightning: the Gradients tab beside Lightning's own scalars, from ``tb_gradcheck.lightning.GradientCallback``.

A six-layer tanh MLP fits ``y = sin(3 x)`` with gradient accumulation and
clipping. The callback writes, at every optimizer step, the gradient the
optimizer applied (accumulated, unscaled, clipped), the norm before
Lightning clipped it and the update each layer received, into the
TensorBoardLogger's own run (``LOGDIR/lightning_logs/version_N``), where
``self.log`` puts the loss:

    python examples/lightning_example.py --logdir logs/lightning
    tensorboard --logdir logs/lightning

The clip (``gradient_clip_val=0.5``) binds at most steps:
``grad_norm_before_clip`` above ``grad_norm``, and ``tb-gradcheck report
LOGDIR`` names the layer that drove the norm over the bound.
``--precision bf16-mixed`` trains under autocast. ``--check-every N``
checks the analytic gradient against numeric ones every N steps on one
fixed batch, from inside the fit (``GradientCheck``), and writes the check
into the same run (``callback.writer.write_check``): the ``check_error``
heatmap.
"""

import argparse
import math

import lightning.pytorch as L
import torch
from torch import nn

import tb_gradcheck.lightning
import tb_gradcheck.torch


class Regressor(L.LightningModule):
    def __init__(self, depth=6, width=32, lr=3e-3):
        super().__init__()
        layers = [nn.Linear(1, width), nn.Tanh()]
        for _ in range(depth - 2):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class GradientCheck(L.Callback):
    """Every ``every`` optimizer steps, a gradient check on one fixed batch, written into the gradients' run."""

    def __init__(self, gradients, batch, every):
        self.gradients, self.batch, self.every = gradients, batch, every

    def on_before_optimizer_step(self, trainer, module, optimizer):
        step = trainer.global_step  # the step this step's gradient rows are written at
        if step % self.every == 0:
            report = tb_gradcheck.torch.check_gradients(
                lambda net, batch: nn.functional.mse_loss(net(batch[0]), batch[1]),
                module.net,
                self.batch,
                dtype="float64",
                seed=step,
            )
            self.gradients.writer.write_check(report, step)


def data(samples, batch, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(samples, 1, generator=g) * 2 * math.pi - math.pi
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.sin(3 * x)), batch_size=batch)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, help="the TensorBoardLogger's directory")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of 16 optimizer steps (default 20)")
    parser.add_argument("--precision", default="32-true", help="Lightning's precision (default 32-true)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data and weights (default 0)")
    parser.add_argument("--check-every", type=int, default=0, help="gradient check every N steps (default 0: none)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    callback = tb_gradcheck.lightning.GradientCallback()
    loader = data(512, 16, args.seed)
    checks = [GradientCheck(callback, next(iter(loader)), args.check_every)] if args.check_every else []
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        precision=args.precision,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=L.loggers.TensorBoardLogger(args.logdir),
        callbacks=[callback, *checks],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader)
    print(f"Wrote {trainer.global_step} steps to {callback.log_dir}: tensorboard --logdir {args.logdir}, Gradients tab")


if __name__ == "__main__":
    main()
