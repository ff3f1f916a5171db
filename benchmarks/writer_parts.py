"""Where the TensorFlow writer's time goes on the 20-layer MLP: each part timed by taking it out.

``python -m benchmarks --only writer_parts`` (about 4 minutes on 2 cores; run
only when named). Each variant is the writer with one function of its own
replaced while its train step is traced, all variants traced in one process
and timed interleaved against the bare step, so each row says what one part
costs. Some variants are not writers anyone should ship (the statistics taken
outside the cond at every step, say): they measure a part, nothing else.
``docs/benchmarks.md`` ("What is left every 10 steps") reads them.
"""

import contextlib
import os
import random
import statistics
import tempfile
import time
import warnings

import numpy as np

from benchmarks.common import interleaved
from benchmarks.common import row
from benchmarks.writer import BatchTimer
from benchmarks.writer import fit_models
from benchmarks.writer import mlp20

WIDTH, DEPTH, BATCH = 256, 20, 64


@contextlib.contextmanager
def _replaced(obj, name, value):
    """``obj.name = value`` while tracing, put back after."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _loop_steps(logdir):
    """``{variant: train()}``: custom-loop steps of the MLP, each traced and warmed."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter
    from tb_gradcheck.core import metadata
    from tb_gradcheck.tensorflow import recording
    from tb_gradcheck.tensorflow import statistics as stats

    keras = tf.keras
    tf.keras.utils.set_random_seed(0)
    model = mlp20()
    x = tf.random.normal((BATCH, WIDTH), seed=1)
    y = tf.random.normal((BATCH, WIDTH), seed=2)
    variables = model.trainable_variables
    optimizer = keras.optimizers.SGD(1e-4)
    optimizer.build(variables)
    compute, record_window = stats.compute, recording.Recording._record_window
    weight_norms = recording.Recording._weight_norms

    def outside(self, measured, gradients, step, writer, extra, guard):
        # The full statistics at the top level, handed to the write branch instead of computed in it.
        full = compute(gradients, self.rows, weights=False)
        with _replaced(stats, "compute", lambda *a, **k: full):
            return record_window(self, measured, gradients, step, writer, extra, guard)

    def no_statistics(gradients, rows, weights=True, onset=True, compiled=False, known=None):
        n = len(metadata.stored_columns(1)) + (len(metadata.ONSET_STAT_COLUMNS) if onset else 0)
        return tf.fill([len(rows.layer_names), n], -1.0), tf.fill([len(rows.variable_names), n], -1.0)

    def no_weights_cond(self, step, compiled=False, due=None):
        return weight_norms(self, step, compiled, due=False)

    # variant: (every_n_steps or None, the counter's step per call, patches)
    variants = {
        "bare": (None, 1, ()),
        "floor": ("floor", 1, ()),
        "between_writes": (1_000_000, 1, ()),
        "between_writes_no_weights_cond": (1_000_000, 1, ((recording.Recording, "_weight_norms", no_weights_cond),)),
        "write_step": (10, 10, ()),
        "write_step_statistics_outside": (10, 10, ((recording.Recording, "_record_window", outside),)),
        "write_step_no_statistics": (10, 10, ((stats, "compute", no_statistics),)),
        "every_10": (10, 1, ()),
        "every_step": (1, 1, ()),
    }
    steps = {}
    for name, (every, stride, patches) in variants.items():
        step = tf.Variable(0, dtype=tf.int64)
        writer = GradientWriter(os.path.join(logdir, name), every_n_steps=every) if isinstance(every, int) else None
        norms = tf.Variable(tf.zeros([len(variables)])) if every == "floor" else None

        @tf.function
        def train(writer=writer, norms=norms, step=step, stride=stride):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, variables)
            if writer is not None:
                writer.write(grads, variables, step)
            elif norms is not None:
                norms.assign(tf.stack([tf.nn.l2_loss(g) for g in grads]))
            optimizer.apply_gradients(zip(grads, variables))
            step.assign_add(stride)

        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(_replaced(*patch))
            for _ in range(3):  # traced with the patch; runs what was traced after it
                train()
        steps[name] = train
    return steps


def _fit_times(quick, logdir):
    """``{variant: per-batch median}`` of ``model.fit`` with the callback between writes, XLA off and on; runs in ``logdir``."""
    import tensorflow as tf

    from tb_gradcheck.keras import GradientCallback
    from tb_gradcheck.tensorflow import fit_hooks
    from tb_gradcheck.tensorflow import statistics as stats

    batches, rounds = (30, 3) if quick else (100, 10)
    x = np.random.default_rng(0).normal(size=(BATCH * batches, WIDTH)).astype(np.float32)
    y = np.random.default_rng(1).normal(size=(BATCH * batches, WIDTH)).astype(np.float32)
    attach = fit_hooks.Session._attach

    def no_bracket(self, obj, name, make):
        # The callback without its update bracket's hooks (it then records from the applied-gradients hook).
        if name not in (fit_hooks.UPDATE_HOOK, fit_hooks.CLIP_HOOK):
            attach(self, obj, name, make)

    def no_reductions(gradients, rows, compiled=False, counted=True):
        return tf.zeros([len(rows.layer_names), 3]), tf.zeros([len(rows.variable_names), 3])

    models = fit_models()
    # (XLA, callback, patches); the callback writes every 1,000,000 steps: no timed batch is a write step.
    variants = {
        "bare": (False, False, ()),
        "callback": (False, True, ()),
        "callback_no_bracket": (False, True, ((fit_hooks.Session, "_attach", no_bracket),)),
        "xla_bare": (True, False, ()),
        "xla_callback": (True, True, ()),
        "xla_callback_no_reductions": (True, True, ((stats, "quick", no_reductions),)),
    }
    samples = {k: [] for k in variants}
    order = list(variants)
    for r in range(rounds + 1):  # round 0 traces and compiles, dropped
        random.Random(r).shuffle(order)
        for name in order:
            jit, callback, patches = variants[name]
            timer = BatchTimer()
            callbacks = [timer.callback]
            if callback:
                callbacks.append(GradientCallback(os.path.join(logdir, f"{name}_{r}"), every_n_steps=1_000_000))
            with contextlib.ExitStack() as stack, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the window is longer than the fit, on purpose
                for patch in patches:
                    stack.enter_context(_replaced(*patch))
                models[jit].fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks)
            if r:
                samples[name].append(statistics.median(timer.times[5:]))
    return {k: statistics.median(v) for k, v in samples.items()}


def _compiled_reductions(quick):
    """``{form: microseconds per 256 x 256 tensor}`` of one reduction over 20 such tensors in an XLA-compiled call."""
    import tensorflow as tf

    from tb_gradcheck.tensorflow import full_sums

    tensors = [tf.Variable(tf.random.normal([WIDTH, WIDTH], seed=i)) for i in range(DEPTH)]
    flat = lambda g: tf.reshape(g, [-1])  # noqa: E731
    nonfinite = lambda g: full_sums.count(tf.logical_not(tf.math.is_finite(g)), True)  # noqa: E731
    forms = {
        "one element (the baseline)": lambda g: g[0, 0],
        "float64 sum of squares and non-finite count (a compiled write step's)": lambda g: (
            full_sums.sumsq64(g, True) + nonfinite(g)
        ),
        "float64 sum of squares alone (a compiled step's between writes)": lambda g: full_sums.sumsq64(g, True),
        "non-finite count alone": lambda g: tf.cast(nonfinite(g), tf.float32),
        "float32 sum of squares as a GEMV": lambda g: full_sums.total(tf.square(g), True),
        "float32 tensordot(g, g)": lambda g: tf.tensordot(flat(g), flat(g), 1),
    }
    calls = {}
    for name, form in forms.items():
        calls[name] = tf.function(
            lambda form=form: tf.stack([tf.cast(form(t), tf.float64) for t in tensors]), jit_compile=True
        )
        calls[name]()
    rounds = 10 if quick else 40
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(5):
                call()
            times[name].append((time.perf_counter() - start) / 5)
    # The 20th percentile: these calls are short, and the slow rounds are the machine's, not theirs.
    low = {name: float(np.percentile(t, 20)) for name, t in times.items()}
    base = low.pop("one element (the baseline)")
    return {name: (t - base) / DEPTH * 1e6 for name, t in low.items()}


def run(quick=False):
    rows = []
    with tempfile.TemporaryDirectory() as logdir:
        steps = _loop_steps(logdir)
        repeats, inner = (5, 5) if quick else (30, 10)
        times = interleaved(steps, repeats, inner)
        fit = _fit_times(quick, logdir)
    bare = times["bare"] * 1e3
    for name in steps:
        if name != "bare":
            rows.append(row(f"MLP custom loop, {name.replace('_', ' ')} vs bare", bare, times[name] * 1e3, "ms"))
    for name, base in (
        ("callback", "bare"),
        ("callback_no_bracket", "bare"),
        ("xla_callback", "xla_bare"),
        ("xla_callback_no_reductions", "xla_bare"),
    ):
        label = name.replace("_", " ")
        rows.append(row(f"MLP model.fit between writes, {label} vs bare", fit[base] * 1e3, fit[name] * 1e3, "ms"))
    reductions = _compiled_reductions(quick)
    between = reductions["float64 sum of squares alone (a compiled step's between writes)"]
    for name, us in reductions.items():
        rows.append(
            row(
                f"XLA on a CPU, per {WIDTH}x{WIDTH} tensor: {name} vs what a step between writes takes",
                between,
                us,
                "us",
            )
        )
    return rows
