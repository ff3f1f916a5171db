"""tb_gradcheck for PyTorch: per-layer gradient statistics and the gradient check for ``torch.nn.Module``s.

``GradientWriter`` writes the Gradients tab's statistics from a torch
training loop; ``check_gradients`` checks a model's gradient per layer.
Both need torch, tensorboard and numpy, never TensorFlow. What the writer
stores is the TensorFlow writer's format (``docs/stored_format.md``), so
the plugin, the tab, ``tb-gradcheck report`` and ``export`` read PyTorch
runs as they read TensorFlow's, and runs of both sit in one logdir:

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

Imported lazily, like the package itself: ``import tb_gradcheck.torch`` does
not import torch until one of these is used.
"""

from tb_gradcheck.core import lazy

_LAZY = {
    "GradientWriter": ("tb_gradcheck.torch.writer", "GradientWriter"),
    "check_gradients": ("tb_gradcheck.torch.check", "check_gradients"),
    "float64_twin": ("tb_gradcheck.torch.check", "float64_twin"),
    "GradientCheckReport": ("tb_gradcheck.check.report", "GradientCheckReport"),
}

__all__ = sorted(_LAZY)


__getattr__ = lazy.getattr_for(__name__, _LAZY)
