"""The scenario registry and the training helpers the scenarios share."""

import contextlib
import dataclasses
import re

import numpy as np

SCENARIOS = {}


@dataclasses.dataclass(frozen=True)
class Expect:
    """A finding a scenario must get.

    Attributes:
      kind: The finding kind.
      layers: Layer names that must be named.
      allowed: A regular expression of further layer names that may be
        named too (e.g. the other input-side layers of a vanishing net), or "".
      steps: ``(lo, hi)``: each named layer's first flagged step must lie in it.
      at: Name of a premise number (e.g. ``"first_nonfinite_step"``): the
        required layers' first flagged step must be exactly that step, the
        allowed layers' no earlier.
      before: Name of a premise number: the first flagged step must be at
        or before it (the explosion before the first NaN).
      severity: ``"error"``, ``"warning"``, ``"info"`` (shown, no problem:
        the scenario is healthy) or None (error or warning).
      under: A finding kind, or "": the claim must be attached as a
        consequence to a finding of that kind (one cause, one finding);
        listed on its own it is a false alarm.
    """

    kind: str
    layers: tuple
    allowed: str = ""
    steps: tuple = (0, 10**9)
    at: str = ""
    before: str = ""
    severity: str = None
    under: str = ""

    def covers(self, layer, first_step, numbers):
        required = layer in self.layers
        if not (required or (self.allowed and re.fullmatch(self.allowed, layer))):
            return False
        lo, hi = self.steps
        if self.at:
            lo = numbers[self.at]
            hi = lo if required else hi
        if self.before:
            hi = min(hi, numbers[self.before])
        return lo <= first_step <= hi


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    train: callable  # run_dir -> (numbers, [(claim, holds)])
    expect: tuple
    doc: str

    @property
    def healthy(self):
        """No problem expected: no expectation, or information only."""
        return all(e.severity == "info" for e in self.expect)


def scenario(*expect):
    """Registers a training function as a scenario with these expectations (none: healthy).

    The function trains under TensorFlow's op determinism (``deterministic``):
    the same seed gives the same run on this machine every time, so a
    premise that holds once holds on every try here. Another machine's
    kernels (thread count, vector width, oneDNN) still change the last bits,
    which is why every premise is about what the scenario is, with margin,
    not about the numbers of one run.
    """

    def register(fn):
        def train(run_dir):
            with deterministic():
                return fn(run_dir)

        SCENARIOS[fn.__name__] = Scenario(fn.__name__, train, tuple(expect), fn.__doc__ or "")
        return fn

    return register


@contextlib.contextmanager
def deterministic():
    """TensorFlow's op determinism for the block, then back to what it was (it is process-wide)."""
    import tensorflow as tf
    from tensorflow.python.framework import config

    was = config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was:
            config.disable_op_determinism()


def silent_units(model, layer, x):
    """bool ``[units]``: the units of a ReLU ``layer`` that are zero on every example of ``x`` (a forward pass)."""
    import tensorflow as tf

    probe = tf.keras.Model(model.inputs[0], model.get_layer(layer).output)
    return (probe(x).numpy() <= 0).all(axis=0)


def custom_loop(run_dir, model, loss_fn, batches, optimizer, every_n_steps=1, scale=None, after_step=None):
    """Trains with a ``tf.function`` step that writes every gradient through ``GradientWriter``.

    Args:
      run_dir: The run directory.
      model: A built Keras model.
      loss_fn: ``(y, prediction) -> scalar``.
      batches: Iterable of ``(x, y)``.
      optimizer: A Keras optimizer.
      every_n_steps: The writer's window.
      scale: Optional ``{step: factor}`` multiplying the loss at that step
        (a corrupted batch); the log sees the scaled gradient.
      after_step: Optional callable ``step -> None`` run after each step (a
        measurement in the middle of training).

    Returns:
      ``(losses [S], gradient norms [S, V] per trainable variable (-1: no
      gradient; a norm may overflow to Inf from finite elements), the first
      step with a NaN or Inf gradient element or None)``, computed from the
      same tensors the writer saw.
    """
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    variables = model.trainable_variables
    scale = scale or {}
    losses, norms, finite = [], [], []
    with GradientWriter(run_dir, every_n_steps=every_n_steps) as writer:

        @tf.function
        def step(x, y, factor):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True)) * factor
            grads = tape.gradient(loss, variables)
            writer.write(grads, variables, optimizer.iterations)
            optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
            # -1: no gradient (a head the loss does not use).
            present = [g for g in grads if g is not None]
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present])
            return loss, tf.stack([tf.norm(g) if g is not None else tf.constant(-1.0) for g in grads]), finite

        for i, (x, y) in enumerate(batches):
            loss, n, ok = step(x, y, tf.constant(scale.get(i, 1.0), tf.float32))
            losses.append(float(loss))
            norms.append(n.numpy())
            finite.append(bool(ok))
            if after_step is not None:
                after_step(i)
    bad = ~np.array(finite)
    return np.array(losses), np.array(norms, np.float64), (int(np.argmax(bad)) if bad.any() else None)


def fell(losses, factor):
    """Mean loss over the last tenth is at most ``factor`` times the mean over the first tenth."""
    tenth = max(1, len(losses) // 10)
    return float(np.mean(losses[-tenth:])) <= factor * float(np.mean(losses[:tenth]))


def head_tail(losses):
    tenth = max(1, len(losses) // 10)
    return float(np.mean(losses[:tenth])), float(np.mean(losses[-tenth:]))
