"""The ways a PyTorch training loop records its gradients, timed against each other in one run.

A way is one eager loop (zero_grad, forward, backward, record,
``optimizer.step``) over its own copy of the model:

- ``bare``: nothing recorded;
- ``tb_gradcheck``: ``tb_gradcheck.torch.GradientWriter`` (with the
  optimizer, so the update columns too);
- ``tb_gradcheck_act``: the same with ``activations=True`` (forward hooks
  on every layer, their statistics at written steps);
- ``histogram``: ``SummaryWriter.add_histogram`` of every parameter's
  gradient (what ``torch.utils.tensorboard`` users write);
- ``norm_item``: one ``p.grad.norm().item()`` per parameter logged with
  ``add_scalar``;
- ``lightning``: Lightning's ``grad_norm(module, norm_type=2)`` (a norm per
  parameter and their total, gathered by ``torch.tensor`` of the norms),
  each value logged with ``add_scalar`` after ``.item()``: where
  ``self.log_dict(grad_norm(...))`` ends up with a ``TensorBoardLogger``;
- ``wandb``: ``watch(model, log="gradients", log_freq=N)`` in offline mode
  (no network, a temporary directory), when wandb is installed. Its
  ``watch`` logs through the one global run, so all its ways share one run
  (``wandb_run``), each watching its own model.

A timed call runs ``STEPS_PER_CALL`` steps and waits for the device, so a
way that writes every 10 steps writes exactly once per call.
"""

import copy
import os

from benchmarks.common import interleaved
from benchmarks.common import skipped

STEPS_PER_CALL = 10
RECORDS = ("bare", "tb_gradcheck", "tb_gradcheck_act", "histogram", "norm_item", "lightning", "wandb")

# Offline and quiet: nothing reaches the network, nothing is printed over the table.
WANDB_ENVIRON = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_CONSOLE": "off",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
}


class Skipped(Exception):
    """A way that cannot run here (its package is missing); the message says why."""


def wandb_run(shared, logdir):
    """The one offline wandb run of the benchmark (``wandb.watch`` logs through the global run).

    Raises:
      Skipped: wandb is not installed.
    """
    if "wandb" not in shared:
        try:
            import wandb
        except ImportError:
            shared["wandb"] = None
        else:
            for name, value in WANDB_ENVIRON.items():
                os.environ.setdefault(name, value)
            shared["wandb"] = wandb.init(mode="offline", dir=logdir, project="tb_gradcheck_benchmark")
    if shared["wandb"] is None:
        raise Skipped("wandb is not installed")
    return shared["wandb"]


def close_shared(shared):
    """Finishes the shared wandb run, if one was started."""
    if shared.get("wandb") is not None:
        shared["wandb"].finish()
        shared["wandb"] = None


def make_way(torch, record, every, model, loss_fn, device, logdir, shared, compile_model=False):
    """One way of training ``model``; returns ``(call, close)``.

    Args:
      torch: The torch module.
      record: One of ``RECORDS``.
      every: Record every this many steps.
      model: This way's own ``torch.nn.Module`` (it is trained and hooked).
      loss_fn: ``loss_fn(module)``: the step's loss through ``module`` (the
        compiled one under ``compile_model``).
      device: The ``torch.device`` the model is on.
      logdir: This way's directory.
      shared: Dict shared by every way of the run (the wandb run).
      compile_model: Bool, default False. Train through ``torch.compile(model)``.

    Raises:
      Skipped: The way cannot run here.
    """
    if record not in RECORDS:
        raise ValueError(f"Expected a record in {RECORDS}. Received: {record!r}")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    module = torch.compile(model) if compile_model else model
    writer = summary = run = grad_norm = None
    if record in ("tb_gradcheck", "tb_gradcheck_act"):
        from tb_gradcheck.torch import GradientWriter

        # Made before torch.compile traces the module: its hooks are in the compiled graph.
        writer = GradientWriter(
            logdir, model, every_n_steps=every, optimizer=optimizer, activations=record == "tb_gradcheck_act"
        )
    elif record in ("histogram", "norm_item", "lightning"):
        from torch.utils.tensorboard import SummaryWriter

        if record == "lightning":
            try:
                from lightning.pytorch.utilities import grad_norm
            except ImportError as e:
                raise Skipped(f"lightning is not installed ({e})") from None
        summary = SummaryWriter(logdir)
    elif record == "wandb":
        if compile_model:
            raise Skipped("wandb.watch's hooks under torch.compile are not measured")
        run = wandb_run(shared, os.path.dirname(os.path.dirname(logdir)))
        run.watch(model, log="gradients", log_freq=every)
    named = list(model.named_parameters())
    state = {"step": 0}

    def record_step(step, loss):
        if writer is not None:
            writer.write(step)
        elif run is not None:
            run.log({"loss": loss.detach()}, commit=True)  # its own step: the ways share the run
        elif summary is not None and step % every == 0:
            if record == "lightning":
                for tag, norm in grad_norm(model, norm_type=2).items():
                    summary.add_scalar(tag, norm.item(), step)
            else:
                for name, p in named:
                    if record == "histogram":
                        summary.add_histogram(name, p.grad, step)
                    else:
                        summary.add_scalar(f"grad_norm/{name}", p.grad.norm().item(), step)

    def call():
        for _ in range(STEPS_PER_CALL):
            step = state["step"]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(module)
            loss.backward()
            record_step(step, loss)
            optimizer.step()
            state["step"] = step + 1
        # What the next step's zero_grad would free: one way's gradients alive at a time.
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    def close():
        if writer is not None:
            writer.close()
        if summary is not None:
            summary.close()
        if run is not None:
            run.unwatch(model)

    return call, close


def way_name(record, every):
    return record if record == "bare" else f"{record}_every{every}"


def time_model(torch, label, model, loss_fn, device, logdir, shared, ways, repeats, warmup=2, compile_model=False):
    """Times ``ways`` of training ``model`` in interleaved rounds; returns rows as ratios to the bare step.

    Args:
      torch: The torch module.
      label: The rows' prefix (model, device).
      model: The model; each way trains a deep copy of it.
      loss_fn: ``loss_fn(module)``, as for ``make_way``.
      device: The ``torch.device`` the model is on.
      logdir: Directory under which each way writes its own.
      shared: As for ``make_way``.
      ways: ``[(record, every)]``; ``("bare", 1)`` is added first.
      repeats: Interleaved rounds.
      warmup: Calls of each way before timing (lazy modules, allocator,
        compilation, the first writes).
      compile_model: As for ``make_way``.

    Returns:
      ``(bare, per_step, skipped_rows)``: the bare step's seconds, ``{way:
      seconds per step}`` of the others (``way_name``), and a row
      (``benchmarks.common.skipped``) for each way that could not run.
    """
    calls, closers, rows = {}, [], []
    try:
        for record, every in [("bare", 1), *[w for w in ways if w[0] != "bare"]]:
            name = way_name(record, every)
            try:
                call, close = make_way(
                    torch,
                    record,
                    every,
                    copy.deepcopy(model),
                    loss_fn,
                    device,
                    os.path.join(logdir, label.replace(" ", "_"), name),
                    shared,
                    compile_model,
                )
            except Skipped as e:
                rows.append(skipped(f"{label} {name} / bare step", str(e)))
                continue
            closers.append(close)
            for _ in range(warmup):
                call()
            calls[name] = call
        timed = interleaved(calls, repeats, 1)
    finally:
        for close in closers:
            close()
    bare = timed.pop("bare") / STEPS_PER_CALL
    return bare, {k: v / STEPS_PER_CALL for k, v in timed.items()}, rows
