"""tb_gradcheck for PyTorch: the Gradients tab's statistics and the gradient check from a torch training loop.

Needs torch, tensorboard and numpy; never TensorFlow. What it stores is the
TensorFlow writer's format (``docs/stored_format.md``), so the plugin, the
tab, ``tb-gradcheck report`` and ``export`` read PyTorch runs as they read
TensorFlow's, and runs of both sit in one logdir.

    writer = tb_gradcheck.torch.GradientWriter("logs/run1", model, optimizer=optimizer)
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        writer.clip_grad_norm_(1.0)   # optional: clips, and records the norm before clipping
        writer.write(step)
        optimizer.step()
        if step % 200 == 0:  # batch_loss(model, batch) -> the loss of one fixed batch
            report = tb_gradcheck.torch.check_gradients(batch_loss, model, (x, y), seed=step)
            writer.write_check(report, step)
    writer.close()
"""

from tb_gradcheck.torch.writer import GradientWriter

_LAZY = {
    "check_gradients": ("tb_gradcheck.torch.check", "check_gradients"),
    "float64_twin": ("tb_gradcheck.torch.check", "float64_twin"),
    "GradientCheckReport": ("tb_gradcheck.check_report", "GradientCheckReport"),
}

__all__ = ["GradientWriter", *sorted(_LAZY)]


def __getattr__(name):
    # The check's modules are imported on first use.
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tb_gradcheck.torch' has no attribute {name!r}")
