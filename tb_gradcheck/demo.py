"""The demo: two real training runs that show vanishing gradients and their cure, in TensorFlow or PyTorch.

``sigmoid``: a deep sigmoid MLP with small random initial weights. Each sigmoid
layer scales the backward signal by about sigmoid'(x) * |W| ~ 0.25 * 0.8, so
after ten layers the input-side gradients are some seven orders of magnitude
below the output side's: the textbook vanishing-gradient picture. Its finding
is a *vanishing* warning on the input-side layers (dense_0 first): each is
three or more orders below the layers after it, as is every layer before it,
and the first ones are too small against their weights to move them in
float32. A warning, not an error: the net still trains, slowly, from the
output side.

``relu_he``: the same network with ReLU and He initialisation, whose variance
scaling keeps the backward signal at one scale through depth. It gets no
finding, at any number of steps: its gradients are largest at the start and
fall as it converges, and a fall is never "exploding" (each step is compared
with the layer's own recent past, not with the converged end of the run).
"""

import os

import numpy as np

DEPTH = 10
WIDTH = 64
FEATURES = 32
BATCH = 64


FRAMEWORKS = ("tensorflow", "torch")


def framework():
    """The framework the demo trains with when not told: TensorFlow if it is installed, else PyTorch."""
    import importlib.util

    return "tensorflow" if importlib.util.find_spec("tensorflow") is not None else "torch"


def write_runs(logdir, steps=1000, seed=0, framework="tensorflow"):
    """Trains both runs with a custom loop and writes them under ``logdir``.

    Args:
      logdir: Parent directory; runs go to ``logdir/sigmoid`` and ``logdir/relu_he``.
      steps: Int, training steps per run.
      seed: Int, seed for data and initial weights.
      framework: ``"tensorflow"`` (default) or ``"torch"``: the same two
        networks, data and optimizer, written by that framework's writer.

    Returns:
      The list of run directories written.
    """
    if framework == "torch":
        return _write_torch_runs(logdir, steps, seed)
    import tensorflow as tf

    from tb_gradcheck.tensorflow.writer import GradientWriter

    x, y = _data(seed)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=seed).repeat().batch(BATCH)

    configs = {
        "sigmoid": ("sigmoid", tf.keras.initializers.RandomNormal(stddev=0.1, seed=seed)),
        "relu_he": ("relu", tf.keras.initializers.HeNormal(seed=seed)),
    }
    written = []
    for name, (activation, init) in configs.items():
        model = _mlp(activation, init)
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
        loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
        run_dir = os.path.join(logdir, name)
        with GradientWriter(run_dir) as writer:

            @tf.function
            def train_step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                writer.write(grads, model.trainable_variables, optimizer.iterations)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            for xb, yb in dataset.take(steps):
                train_step(xb, yb)
        written.append(run_dir)
    return written


def _mlp(activation, init):
    import tensorflow as tf

    layers = [tf.keras.Input((FEATURES,))]
    for i in range(DEPTH):
        layers.append(tf.keras.layers.Dense(WIDTH, activation=activation, kernel_initializer=init, name=f"dense_{i}"))
    layers.append(tf.keras.layers.Dense(1, kernel_initializer=init, name="logits"))
    return tf.keras.Sequential(layers, name="mlp")


def _data(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2048, FEATURES)).astype(np.float32)
    true_w = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    return x, (x @ true_w > 0).astype(np.float32)


def _write_torch_runs(logdir, steps, seed):
    """The same two runs in PyTorch, written by ``tb_gradcheck.torch.GradientWriter``."""
    import collections

    import torch

    from tb_gradcheck.torch import GradientWriter

    x, y = _data(seed)
    written = []
    for name in ("sigmoid", "relu_he"):
        torch.manual_seed(seed)
        layers = collections.OrderedDict()
        for i in range(DEPTH):
            dense = torch.nn.Linear(FEATURES if i == 0 else WIDTH, WIDTH)
            if name == "sigmoid":
                torch.nn.init.normal_(dense.weight, std=0.1)
            else:
                torch.nn.init.kaiming_normal_(dense.weight, nonlinearity="relu")
            torch.nn.init.zeros_(dense.bias)
            layers[f"dense_{i}"] = dense
            layers[f"act_{i}"] = torch.nn.Sigmoid() if name == "sigmoid" else torch.nn.ReLU()
        layers["logits"] = torch.nn.Linear(WIDTH, 1)
        model = torch.nn.Sequential(layers)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        rng = np.random.default_rng(seed)
        run_dir = os.path.join(logdir, name)
        with GradientWriter(run_dir, model, optimizer=optimizer) as writer:
            for step in range(steps):
                batch = rng.integers(0, len(x), BATCH)
                optimizer.zero_grad()
                loss_fn(model(torch.from_numpy(x[batch])), torch.from_numpy(y[batch])).backward()
                writer.write(step)
                optimizer.step()
        written.append(run_dir)
    return written
