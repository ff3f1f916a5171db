"""Vanishing or wrong, in PyTorch: a 10 -> 256 ReLU -> 1 network, gradient statistics and checks side by side.

Writes three runs under --logdir with ``tb_gradcheck.torch.GradientWriter``
(per-layer statistics every step, the optimizer's update too) and, every
--check-every steps, a per-parameter gradient check
(``tb_gradcheck.torch.check_gradients``):

- ``he_init``: He-initialised weights. Healthy: norms of order one, checks ok.
- ``small_init``: weights drawn with standard deviation 1e-3. Each layer's
  gradient is proportional to the other layer's weights, so the norms are
  orders of magnitude below the healthy run's: vanishing gradients. The
  check does not call them wrong, because they are not.
- ``wrong_gradient``: the output layer is a ``torch.autograd.Function``
  whose hand-written backward returns its weight gradient 5% too large (a
  planted bug). The norms look as healthy as ``he_init``'s; the check marks
  ``output.weight`` (and its layer) as a mismatch at every check.

Then open the runs in TensorBoard's Gradients tab:

    python examples/torch_vanishing_or_wrong.py --logdir logs/torch_vanishing_or_wrong
    tensorboard --logdir logs/torch_vanishing_or_wrong

and compare the ``grad_norm`` heatmap (vanishing) with ``check_error`` (wrong).
"""

import argparse
import os

import numpy as np
import torch

RUNS = ("he_init", "small_init", "wrong_gradient")


class WrongLinear(torch.autograd.Function):
    """``x @ w.T + b`` whose backward gets the weight gradient 5% wrong: a hand-written backward with a bug."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, 1.05 * grad.T @ x, grad.sum(dim=0)


class Output(torch.nn.Linear):
    """The output layer; ``wrong=True`` runs it through ``WrongLinear``."""

    def __init__(self, inputs, wrong):
        super().__init__(inputs, 1)
        self.wrong = wrong

    def forward(self, x):
        return WrongLinear.apply(x, self.weight, self.bias) if self.wrong else super().forward(x)


class Net(torch.nn.Module):
    def __init__(self, hidden, wrong):
        super().__init__()
        self.hidden = torch.nn.Linear(10, hidden)
        self.output = Output(hidden, wrong)

    def forward(self, x):
        return self.output(torch.relu(self.hidden(x)))


def build(run, hidden, seed):
    torch.manual_seed(seed)
    model = Net(hidden, wrong=run == "wrong_gradient")
    with torch.no_grad():
        for layer in (model.hidden, model.output):
            std = 1e-3 if run == "small_init" else (2.0 / layer.in_features) ** 0.5
            layer.weight.normal_(0.0, std)
            layer.bias.zero_()
    return model


def loss_fn(model, batch):
    x, y = batch
    return torch.mean((model(x) - y) ** 2)


def train(run, logdir, args):
    """Trains one run with SGD: statistics every step, a per-parameter check every --check-every steps."""
    import tb_gradcheck.torch

    rng = np.random.default_rng(args.seed)
    data_x = torch.from_numpy(rng.normal(size=(1024, 10)).astype(np.float32))
    data_y = torch.from_numpy(rng.normal(size=(1024, 1)).astype(np.float32))
    model = build(run, args.hidden, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    report = None
    with tb_gradcheck.torch.GradientWriter(logdir, model, optimizer=optimizer) as writer:
        for step in range(args.steps):
            start = (step * args.batch) % len(data_x)
            batch = (data_x[start : start + args.batch], data_y[start : start + args.batch])
            optimizer.zero_grad()
            loss_fn(model, batch).backward()
            writer.write(step)
            optimizer.step()
            if args.check_every and step % args.check_every == 0:
                report = tb_gradcheck.torch.check_gradients(
                    loss_fn, model, batch, dtype="float64", seed=step, granularity="variable"
                )
                writer.write_check(report, step)
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, help="parent directory of the runs")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--check-every", type=int, default=25, help="steps between checks; 0: none (default 25)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden ReLU units (default 256)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which runs to write")
    parser.add_argument("--seed", type=int, default=0, help="seed for data and weights (default 0)")
    args = parser.parse_args(argv)
    for run in args.runs:
        report = train(run, os.path.join(args.logdir, run), args)
        if report is not None:
            print(f"== {run}: last check ==")
            print(report)
    print(f"Wrote {len(args.runs)} runs to {args.logdir}: tensorboard --logdir {args.logdir}, Gradients tab")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
