"""Training scenarios for tensorflow/test_distributed.py, run under a strategy in a subprocess or single-device in the test.

    python tests/distribute_job.py mirrored OUT   # two logical CPUs, MirroredStrategy
    python tests/distribute_job.py worker OUT     # one MultiWorkerMirroredStrategy worker (TF_CONFIG)

Each prints one JSON line: the process id, the final weights of each
scenario and what the writer's state variables are. The same functions run in
the test process with the default strategy give the single-device reference:
the data of a global step is the same global batch whatever the strategy.
"""

import json
import os
import sys

import numpy as np

GLOBAL_BATCH = 8
STEPS = 6
LEARNING_RATE = 0.05


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 3)).astype(np.float32)
    y = rng.normal(size=(GLOBAL_BATCH * STEPS, 1)).astype(np.float32)
    tokens = rng.integers(0, 12, size=(GLOBAL_BATCH * STEPS, 4)).astype(np.int32)
    return x, y, tokens


def dense_model(activation="tanh"):
    import keras

    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation=activation, name="hidden"),
            keras.layers.Dense(1, name="out", dtype="float32"),
        ],
        name="net",
    )


def sparse_model():
    import keras

    keras.utils.set_random_seed(7)
    tokens = keras.Input((4,), dtype="int32")
    h = keras.layers.Flatten()(keras.layers.Embedding(12, 3, name="embed")(tokens))
    h = keras.layers.Dense(4, activation="tanh", name="hidden")(h)
    return keras.Model(tokens, keras.layers.Dense(1, name="out")(h), name="sparse")


def global_batches(strategy):
    """The same global batch at every step, split over workers and replicas in order."""
    import tensorflow as tf

    x, y, _ = arrays()

    def dataset_fn(context):
        per_replica = context.get_per_replica_batch_size(GLOBAL_BATCH)
        share = GLOBAL_BATCH // context.num_input_pipelines  # this worker's rows of each global batch
        first = context.input_pipeline_id * share
        rows = np.concatenate(
            [np.arange(k * GLOBAL_BATCH + first, k * GLOBAL_BATCH + first + share) for k in range(STEPS)]
        )
        return tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(per_replica)

    return strategy.distribute_datasets_from_function(dataset_fn)


def custom_loop(strategy, run_dir, mode, every_n_steps=1, in_scope=False):
    """A strategy.run loop, recorded by GradientWriter.write ("writer") or by GradientCallback ("callback").

    Returns:
      The final weights (lists), and the class names of the writer's state variables.
    """
    import contextlib

    import keras
    import tensorflow as tf

    from tb_gradcheck import GradientWriter
    from tb_gradcheck.keras import GradientCallback

    with strategy.scope():
        model = dense_model()
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        if mode == "callback":
            model.compile(optimizer=optimizer)
    writer = GradientWriter(run_dir, every_n_steps=every_n_steps) if mode == "writer" else None

    def step_fn(xb, yb):
        with tf.GradientTape() as tape:
            # Mean over the global batch: the replicas' gradients sum to its gradient.
            loss = tf.reduce_sum(tf.square(model(xb, training=True) - yb)) / GLOBAL_BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        if writer is not None:
            writer.write(grads, model.trainable_variables, optimizer.iterations + 1)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def train(iterator):
        strategy.run(step_fn, args=next(iterator))

    callbacks = None
    if mode == "callback":
        callbacks = keras.callbacks.CallbackList([GradientCallback(run_dir)], model=model)
        callbacks.on_train_begin()
    with strategy.scope() if in_scope else contextlib.nullcontext():
        iterator = iter(global_batches(strategy))
        for _ in range(STEPS):
            train(iterator)
    if callbacks is not None:
        callbacks.on_train_end()
        state = []
    else:
        writer.close()
        state = sorted({type(v).__name__ for v in [writer._events.writes, *writer._events.fresh.values()]})
    return [w.tolist() for w in model.get_weights()], state


def fit(strategy, run_dir, mixed=False):
    """model.fit with GradientCallback: the sparse model, or (mixed) mixed_float16 with one overflowing batch."""
    import keras

    from tb_gradcheck.keras import GradientCallback

    x, y, tokens = arrays()
    previous = keras.mixed_precision.global_policy()
    if mixed:
        keras.mixed_precision.set_global_policy("mixed_float16")
        x = x.copy()
        # Step 3, in the first replica's half. 3e4 is finite in float16 and a
        # linear hidden layer does not saturate, so the forward pass stays
        # finite and the scaled gradient overflows float16 on the way back.
        x[2 * GLOBAL_BATCH + 1] = 3e4
    try:
        with strategy.scope():
            model = dense_model(activation=None) if mixed else sparse_model()
            model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss="mse")
        inputs = x if mixed else tokens
        # Checks too (they run once tb_gradcheck.tensorflow.check exists; until then the
        # callback warns): the step bookkeeping must work on mirrored variables.
        callback = GradientCallback(
            run_dir, check_every_n_steps=3, check_data=(inputs[:GLOBAL_BATCH], y[:GLOBAL_BATCH])
        )
        model.fit(inputs, y, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0, callbacks=[callback])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return [w.tolist() for w in model.get_weights()]


def per_replica_error(strategy, run_dir):
    """The error write() gives for per-replica values passed outside strategy.run."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    v = tf.Variable([1.0], name="v")
    grads = strategy.experimental_distribute_values_from_function(lambda context: tf.ones([1]))
    with GradientWriter(run_dir) as writer:
        try:
            writer.write([grads], [v], 1)
        except TypeError as e:
            return str(e)
    return None


def main(kind, out):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    result = {"pid": os.getpid()}
    if kind == "mirrored":
        # Before anything initialises the devices: two logical CPUs, one per replica.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert strategy.num_replicas_in_sync == 2
        result["custom_scope"] = custom_loop(strategy, os.path.join(out, "custom_scope"), "writer", in_scope=True)
        result["custom_window"] = custom_loop(strategy, os.path.join(out, "custom_window"), "writer", every_n_steps=4)
        result["custom_callback"] = custom_loop(strategy, os.path.join(out, "custom_callback"), "callback")
        result["fit"] = fit(strategy, os.path.join(out, "fit"))
        result["fit_mixed"] = fit(strategy, os.path.join(out, "fit_mixed"), mixed=True)
        result["per_replica_error"] = per_replica_error(strategy, os.path.join(out, "per_replica"))
    elif kind == "worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        assert strategy.num_replicas_in_sync == 2
        result["chief"] = bool(strategy.extended.should_save_summary)
        result["writer"] = custom_loop(strategy, os.path.join(out, "writer"), "writer")
        result["callback"] = custom_loop(strategy, os.path.join(out, "callback"), "callback")
    else:
        raise SystemExit(f"unknown job {kind!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
