"""A JAX run and a TensorFlow run of the same weights and batches give the same rows, side by side in one logdir."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import tb_gradcheck.jax as tj
from conftest import get_json
from conftest import make_app
from conftest import read_events
from conftest import stats_content
from conftest import wait_for_steps
from tb_gradcheck.core import metadata

# Two frameworks' float32 forward and backward passes, and three SGD steps on
# each's own weights: float32 rounding in a different order, nothing more.
RTOL = 1e-5
STEPS = 3
LR = 0.05


def nest(paths, arrays):
    """A nested dict whose leaf at ``a/b/c`` is the array of that path: the Keras names become the pytree's."""
    tree = {}
    for path, array in zip(paths, arrays):
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jnp.asarray(array)
    return tree


def tensorflow_run(logdir, x, y):
    import tensorflow as tf

    import tb_gradcheck

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((5,)),
            tf.keras.layers.Dense(6, activation="relu"),
            tf.keras.layers.Dense(4, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    variables = model.trainable_variables
    start = [v.path for v in variables], [v.numpy() for v in variables]
    optimizer = tf.keras.optimizers.SGD(LR)
    with tb_gradcheck.GradientWriter(logdir) as writer:

        @tf.function
        def step(s):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, variables)
            writer.write(grads, variables, s)
            optimizer.apply_gradients(zip(grads, variables))

        for s in range(STEPS):
            step(tf.constant(s, tf.int64))
    return start


def jax_run(logdir, start, x, y):
    paths, arrays = start
    params = nest(paths, arrays)
    layers = [p.rsplit("/", 1)[0] for p in paths[::2]]  # kernel, bias per Dense layer
    tx = optax.chain(tj.monitor(), optax.sgd(LR))
    opt_state = tx.init(params)

    def forward(p):
        h = jnp.asarray(x)
        for i, name in enumerate(layers):
            node = p
            for part in name.split("/"):
                node = node[part]
            h = h @ node["kernel"] + node["bias"]
            h = jax.nn.relu(h) if i < len(layers) - 1 else h
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def step(params, opt_state):
        updates, opt_state = tx.update(jax.grad(forward)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    with tj.GradientWriter(logdir) as writer:
        for s in range(STEPS):
            params, opt_state = step(params, opt_state)
            writer.write(opt_state, s)


def by_row(run_dir, granularity):
    """``{(step, row name): stored row}``."""
    names = stats_content(run_dir)[granularity]["rows"]
    return {(s, n): v[0, i] for s, v, _ in read_events(run_dir, granularity=granularity) for i, n in enumerate(names)}


def test_jax_and_tensorflow_runs_of_the_same_weights_give_the_same_rows(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    start = tensorflow_run(tmp_path / "tensorflow", x, y)
    jax_run(tmp_path / "jax", start, x, y)
    tf_content, jax_content = stats_content(tmp_path / "tensorflow"), stats_content(tmp_path / "jax")
    assert jax_content["layer"]["rows"] == tf_content["layer"]["rows"]  # the same names, in the same depth order
    assert sorted(jax_content["variable"]["rows"]) == sorted(tf_content["variable"]["rows"])
    assert jax_content["columns"] == tf_content["columns"] == list(metadata.stored_columns(1))
    for granularity in ("layer", "variable"):
        tf_rows, jax_rows = by_row(tmp_path / "tensorflow", granularity), by_row(tmp_path / "jax", granularity)
        assert sorted(tf_rows) == sorted(jax_rows)
        for key, row in tf_rows.items():
            np.testing.assert_allclose(jax_rows[key], row, rtol=RTOL, atol=1e-7, err_msg=str(key))

    # One logdir, two runs: TensorBoard's own loader serves both, under the same layer names.
    client, _ = make_app(tmp_path, "python")
    wait_for_steps(client, "jax", STEPS)
    runs = {r["run"]: r for r in get_json(client, "/data/plugin/gradients/runs")["runs"]}
    assert runs["jax"]["granularities"]["layer"]["num_steps"] == STEPS
    heat = {
        run: get_json(client, f"/data/plugin/gradients/heatmap?run={run}&metric=grad_norm&granularity=layer")
        for run in ("jax", "tensorflow")
    }
    assert heat["jax"]["layers"] == heat["tensorflow"]["layers"] == runs["jax"]["granularities"]["layer"]["rows"]
    assert heat["jax"]["steps"] == heat["tensorflow"]["steps"] == list(range(STEPS))
    np.testing.assert_allclose(
        np.array(heat["jax"]["values"], float), np.array(heat["tensorflow"]["values"], float), rtol=RTOL
    )
