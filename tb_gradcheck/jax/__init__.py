"""tb_gradcheck for JAX: the Gradients tab for optax training, from inside ``jit``.

``monitor`` is an optax transformation that takes per-layer gradient
statistics inside the jitted step and keeps them in its optax state;
``GradientWriter`` writes them at the written steps. Imports JAX and optax,
never TensorFlow or PyTorch.

    tx = optax.chain(tb_gradcheck.jax.monitor(every_n_steps=10), optax.adamw(1e-3))
    writer = tb_gradcheck.jax.GradientWriter("logs/run1")
    for step, batch in enumerate(batches):
        params, opt_state = train_step(params, opt_state, batch)
        writer.write(opt_state, step)
"""

from tb_gradcheck.jax.check import check_gradients
from tb_gradcheck.jax.layout import depth_order
from tb_gradcheck.jax.transform import MonitorState
from tb_gradcheck.jax.transform import monitor
from tb_gradcheck.jax.writer import GradientWriter

__all__ = ["GradientWriter", "MonitorState", "check_gradients", "depth_order", "monitor"]
