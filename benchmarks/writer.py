"""Writer overhead and storage against what users would write instead.

Three reference models, each trained with a compiled custom step in five
ways: bare; tb_gradcheck's GradientWriter; per-variable
``tf.summary.histogram`` of the gradients (what Keras' TensorBoard callback
used to do); hand-written per-layer ``tf.summary.scalar`` of the gradient norm.
Each way writes every step and every 10 steps. Figures are medians of
interleaved rounds, as ratios to the bare step timed in the same rounds.
"""

import os
import tempfile

import numpy as np

from benchmarks.common import interleaved, row

TARGET_EVERY_STEP = 1.03
TARGET_EVERY_10 = 1.01
TARGET_STORAGE = 1 / 20


def _models(quick):
    import tensorflow as tf

    keras = tf.keras
    mlp = keras.Sequential(
        [keras.Input((256,))] + [keras.layers.Dense(256, activation="relu") for _ in range(20)], name="mlp20"
    )
    cnn = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(64, 3, strides=2, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(64, 3, strides=2, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ],
        name="cnn_bn",
    )
    out = [("mlp20_w256_b64", mlp, (64, 256), (64, 256)), ("cnn_bn_b32", cnn, (32, 32, 32, 3), (32, 10))]
    if not quick:
        app = keras.applications.MobileNetV2(input_shape=(96, 96, 3), weights=None, classes=10)
        out.append(("mobilenetv2_96_b16", app, (16, 96, 96, 3), (16, 10)))
    return out


def _steps(model, x_shape, y_shape, logdir):
    """``{way: (step_fn, event_dir)}`` for one model; every step_fn is compiled and warmed."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    x = tf.random.normal(x_shape, seed=1)
    y = tf.random.normal(y_shape, seed=2)
    variables = model.trainable_variables
    optimizer = tf.keras.optimizers.SGD(1e-4)
    optimizer.build(variables)
    layers = {}
    for i, v in enumerate(variables):
        layers.setdefault(v.path.rsplit("/", 1)[0], []).append(i)

    def make(record, every):
        step = tf.Variable(0, dtype=tf.int64)
        directory = os.path.join(logdir, f"{record}_{every}")
        summary_writer = tf.summary.create_file_writer(directory) if record in ("histogram", "scalar") else None
        writer = GradientWriter(directory, every_n_steps=every) if record == "tb_gradcheck" else None

        @tf.function
        def train():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
            grads = tape.gradient(loss, variables)
            if writer is not None:
                writer.write(grads, variables, step)
            elif summary_writer is not None:
                with summary_writer.as_default(step=step), tf.summary.record_if(step % every == 0):
                    if record == "histogram":
                        for g, v in zip(grads, variables):
                            tf.summary.histogram(v.path, g)
                    else:
                        for name, idx in layers.items():
                            tf.summary.scalar(name, tf.linalg.global_norm([grads[i] for i in idx]))
            optimizer.apply_gradients(zip(grads, variables))
            step.assign_add(1)

        for _ in range(5):
            train()

        def close():
            if writer is not None:
                writer.close()
            if summary_writer is not None:
                summary_writer.close()

        return train, directory, close, step

    ways = {"bare": make(None, 1)}
    for every in (1, 10):
        for record in ("tb_gradcheck", "histogram", "scalar"):
            ways[f"{record}_every{every}"] = make(record, every)
    return ways


def _event_bytes(directory):
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if "tfevents" in f)


def run(quick=False):
    """Measures overhead and storage; returns result rows (see benchmarks.common.row)."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    rows = []
    repeats, inner = (5, 10) if quick else (15, 20)
    for name, model, x_shape, y_shape in _models(quick):
        with tempfile.TemporaryDirectory() as logdir:
            ways = _steps(model, x_shape, y_shape, logdir)
            times = interleaved({k: w[0] for k, w in ways.items()}, repeats, inner)
            bare = times["bare"]
            for every, target in ((1, TARGET_EVERY_STEP), (10, TARGET_EVERY_10)):
                for record in ("tb_gradcheck", "histogram", "scalar"):
                    key = f"{record}_every{every}"
                    rows.append(row(f"step time, {name}, {record}, every {every}", bare * 1e3, times[key] * 1e3,
                                    "ms", target if record == "tb_gradcheck" else None))
            for _, _, close, _ in ways.values():
                close()
            per_step = {}
            for record in ("tb_gradcheck", "histogram", "scalar"):
                directory, step = ways[f"{record}_every1"][1], ways[f"{record}_every1"][3]
                per_step[record] = _event_bytes(directory) / int(step.numpy())
            hist = per_step["histogram"]
            rows.append(row(f"bytes per written step, {name}, tb_gradcheck vs histograms", hist,
                            per_step["tb_gradcheck"], "B", TARGET_STORAGE))
            rows.append(row(f"bytes per written step, {name}, scalars vs histograms", hist, per_step["scalar"], "B"))
    return rows


if __name__ == "__main__":
    from benchmarks.__main__ import print_table

    print_table(run())
