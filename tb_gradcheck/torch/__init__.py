"""tb_gradcheck for PyTorch: ``GradientWriter`` writes the Gradients tab's statistics from a torch training loop.

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
    writer.close()
"""

from tb_gradcheck.torch.writer import GradientWriter

__all__ = ["GradientWriter"]


def __getattr__(name):
    # The gradient check lives in tb_gradcheck.torch.check (imported on first use).
    import importlib

    try:
        check = importlib.import_module("tb_gradcheck.torch.check")
    except ModuleNotFoundError as e:
        if e.name != "tb_gradcheck.torch.check":
            raise
        check = None
    if check is not None and hasattr(check, name):
        return getattr(check, name)
    raise AttributeError(f"module 'tb_gradcheck.torch' has no attribute {name!r}")
