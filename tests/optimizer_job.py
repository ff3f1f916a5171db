"""MirroredStrategy scenarios for test_optimizer.py, run in a subprocess (logical devices are set before TF starts).

    python tests/optimizer_job.py OUT

Prints one JSON line: for each scenario, the trainable weights before and
after every step (lists of nested lists), read by the test beside the logs.
"""

import json
import os
import sys

import numpy as np

STEPS = 3
CLIP = 0.05


def arrays(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)


def model_():
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="tanh", name="hidden"), keras.layers.Dense(1, name="out")],
        name="twin",
    )


def snapshot(variables):
    return [np.asarray(v.numpy(), np.float64).tolist() for v in variables]


def custom(strategy, logdir):
    """Each replica takes half of one global batch; clipped with tf.clip_by_global_norm, bracketed."""
    import keras
    import tensorflow as tf

    from tb_gradcheck.tensorflow.writer import GradientWriter

    x, y = arrays()
    with strategy.scope():
        model = model_()
        optimizer = keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)  # built lazily inside tf.function under a strategy, it fails
    writer = GradientWriter(logdir)
    variables = model.trainable_variables
    halves = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            x[ctx.replica_id_in_sync_group * 8 : (ctx.replica_id_in_sync_group + 1) * 8],
            y[ctx.replica_id_in_sync_group * 8 : (ctx.replica_id_in_sync_group + 1) * 8],
        )
    )

    def replica_step(batch, step):
        bx, by = batch
        with tf.GradientTape() as tape:
            # Half the global batch's mean: the replicas' gradients sum to the global one.
            loss = tf.reduce_sum(tf.square(model(bx) - by)) / 16.0
        grads = tape.gradient(loss, variables)
        clipped, _ = tf.clip_by_global_norm(grads, CLIP)
        with writer.applying(variables, step) as update:
            optimizer.apply_gradients(zip(clipped, variables))
        writer.write(clipped, variables, step, gradients_before_clip=grads, update=update)

    @tf.function
    def train_step(step):
        strategy.run(replica_step, args=(halves, step))

    out = {"before": [], "after": []}
    for s in range(1, STEPS + 1):
        out["before"].append(snapshot(variables))
        train_step(tf.constant(s, tf.int64))
        out["after"].append(snapshot(variables))
    writer.close()
    return out


def fit(strategy, logdir):
    import keras

    from tb_gradcheck.keras import GradientCallback

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            out["before"].append(snapshot(self.model.trainable_variables))

        def on_train_batch_end(self, batch, logs=None):
            out["after"].append(snapshot(self.model.trainable_variables))

    x, y = arrays()
    out = {"before": [], "after": []}
    with strategy.scope():
        model = model_()
        model.compile(optimizer=keras.optimizers.SGD(0.1, global_clipnorm=CLIP), loss="mse")
    model.fit(x, y, batch_size=16, epochs=STEPS, verbose=0, callbacks=[Recorder(), GradientCallback(logdir)])
    return out


def main(out):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {"custom": custom(strategy, os.path.join(out, "custom")), "fit": fit(strategy, os.path.join(out, "fit"))}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
