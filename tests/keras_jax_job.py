"""Keras 3 on the JAX backend: model.fit with and without GradientCallback (run by test_jax_keras.py in its own process).

``python keras_jax_job.py DIR``: reads ``DIR/start.npz`` (weights, data) and
``DIR/fits.json`` (``{name: fit config}``), and for each fit trains the model
twice from the same weights, with the callback (into ``DIR/<name>/train``)
and without, and writes ``DIR/result.json``: whether the weights and
optimizer variables of the two fits are bit-identical, and whether
TensorFlow was imported. TensorFlow is blocked from import here: the
callback's path on JAX must not need it.
"""

import json
import os
import sys
import warnings


class NoTensorFlow:
    """A meta-path finder that makes ``import tensorflow`` fail, as where it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError(f"{name} is blocked in this process")
        return None


def build(keras, widths, start=None):
    """Dense + ReLU, LayerNormalization, Dense + ReLU, Dense on Keras' backend; ``start``'s weights if given.

    test_jax_keras.py builds the same model on TensorFlow from here.
    """
    layers = [keras.Input((widths[0],))]
    for i, width in enumerate(widths[1:]):
        last = i == len(widths) - 2
        layers.append(keras.layers.Dense(width, activation=None if last else "relu", name=f"dense_{i}"))
        if i == 0:
            layers.append(keras.layers.LayerNormalization(name="norm"))
    model = keras.Sequential(layers, name="mlp")
    if start is not None:
        model.set_weights([start[f"w{i}"] for i in range(len(model.weights))])
    return model


def fit(keras, start, config, log_dir=None, execution=True):
    """One fit of ``config`` from ``start``, with a GradientCallback into ``log_dir`` if given; returns the model.

    ``execution``: whether the config's ``steps_per_execution`` and
    ``run_eagerly`` apply (they are the JAX side's; the TensorFlow side fits
    with Keras' defaults).
    """
    import tb_gradcheck.keras

    model = build(keras, config["widths"], start)
    optimizer = getattr(keras.optimizers, config["optimizer"])(**config["optimizer_args"])
    options = {
        "steps_per_execution": config.get("steps_per_execution", 1),
        "run_eagerly": config.get("run_eagerly", False),
    }
    model.compile(optimizer, "mse", **(options if execution else {}))
    callbacks = [] if log_dir is None else [tb_gradcheck.keras.GradientCallback(log_dir, **config["callback"])]
    model.fit(
        start["x"], start["y"], batch_size=config["batch_size"], epochs=config["epochs"], shuffle=False, verbose=0,
        callbacks=callbacks,
    )  # fmt: skip
    return model


def _state(model):
    return [np.asarray(w) for w in model.get_weights()], [np.asarray(v.value) for v in model.optimizer.variables]


def main(root):
    start = np.load(os.path.join(root, "start.npz"))
    with open(os.path.join(root, "fits.json")) as f:
        fits = json.load(f)
    result = {"backend": keras.backend.backend()}
    for name, config in fits.items():
        callback = type(tb_gradcheck.keras.GradientCallback(os.path.join(root, name), **config["callback"]))
        with_cb = _state(fit(keras, start, config, os.path.join(root, name)))
        without = _state(fit(keras, start, config))
        same = all(
            len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b)) for a, b in zip(with_cb, without)
        )
        result[name] = {"bit_identical": bool(same), "callback": f"{callback.__module__}.{callback.__name__}"}
    try:
        tb_gradcheck.keras.GradientCallback(root, check_every_n_steps=1, check_data=(start["x"], start["y"]))
        result["check_arguments_refused"] = False
    except ValueError:
        result["check_arguments_refused"] = True
    # A LossScaleOptimizer: a warning, a fit like any other, and no run written.
    model = build(keras, fits["every"]["widths"], start)
    model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05)), "mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback = tb_gradcheck.keras.GradientCallback(os.path.join(root, "loss_scale"))
        model.fit(start["x"], start["y"], batch_size=8, verbose=0, callbacks=[callback])
    result["loss_scale_warning"] = [str(w.message) for w in caught if "GradientCallback" in str(w.message)]
    result["loss_scale_wrote"] = os.path.exists(os.path.join(root, "loss_scale"))
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    with open(os.path.join(root, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = "jax"
    sys.meta_path.insert(0, NoTensorFlow())
    import keras
    import numpy as np

    import tb_gradcheck

    main(sys.argv[1])
