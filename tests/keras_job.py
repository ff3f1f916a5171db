"""Keras 3 on the JAX or the PyTorch backend: model.fit with and without GradientCallback, in a process of its own.

``python keras_job.py BACKEND DIR`` (``keras_fits.runs`` starts it for
tests/jax/test_keras.py and tests/torch/test_keras.py): Keras picks its backend
once, at import, so each backend's fits run here, with TensorFlow blocked from
import, as where it is not installed: the callback's path on JAX and torch must
not need it. Reads ``DIR/start.npz`` (weights, data) and ``DIR/fits.json``
(``{name: fit config}``), and for each fit trains the model twice from the same
weights, with the callback (into ``DIR/<name>/train``) and without; then the
backend's refusals, a second fit that goes on from the first's steps, and on
torch (eager, where a Python loss runs at every step) fits that raise and a fit
with ``jit_compile=True``. Writes ``DIR/result.json``.
"""

import glob
import json
import os
import sys
import warnings

# The optimizer methods a GradientCallback may hold on any backend (the torch, JAX and TensorFlow hooks).
HOOKS = ("apply", "_clip_gradients", "_backend_update_step", "_all_reduce_sum_gradients")
# The model methods one may hold (the JAX callback's, to learn which variables the loss depends on).
MODEL_HOOKS = ("compute_loss_and_updates",)
# What each backend's callback refuses to follow, built from an SGD optimizer: a warning, no run written.
REFUSED = {
    # A LossScaleOptimizer applies its inner optimizer inside a lax.cond on JAX.
    "jax": {"loss_scale": {}},
    # On torch, a LossScaleOptimizer over gradient accumulation.
    "torch": {"loss_scale": {}, "optimizer_args": {"learning_rate": 0.05, "gradient_accumulation_steps": 2}},
}


class Raise(Exception):
    """The planted failure."""


def build(keras, widths, start=None, stop_gradient=False):
    """Dense + ReLU, LayerNormalization, Dense + ReLU, Dense on Keras' backend; ``start``'s weights if given.

    ``stop_gradient``: the first Dense's output passes ``keras.ops.stop_gradient``, so no gradient reaches it.
    """
    layers = [keras.Input((widths[0],))]
    for i, width in enumerate(widths[1:]):
        last = i == len(widths) - 2
        layers.append(keras.layers.Dense(width, activation=None if last else "relu", name=f"dense_{i}"))
        if i == 0 and stop_gradient:
            layers.append(keras.layers.Lambda(keras.ops.stop_gradient, name="stop"))
        if i == 0:
            layers.append(keras.layers.LayerNormalization(name="norm"))
    model = keras.Sequential(layers, name="mlp")
    if start is not None:
        model.set_weights([start[f"w{i}"] for i in range(len(model.weights))])
    return model


def fit(keras, start, config, log_dir=None, execution=True):
    """One fit of ``config`` from ``start``, with a GradientCallback into ``log_dir`` if given; returns the model.

    ``config``: ``widths``, ``optimizer`` (a ``keras.optimizers`` name) and
    ``optimizer_args``, ``callback`` (its arguments), ``batch_size``,
    ``epochs``; optionally ``stop_gradient`` (``build``), ``loss_scale`` (``LossScaleOptimizer`` arguments:
    the optimizer is wrapped in one), ``poison`` (rows of the targets made
    NaN), ``steps_per_execution`` and ``run_eagerly``. ``execution``: whether
    those last two apply (the TensorFlow side fits with Keras' defaults).
    """
    import tb_gradcheck.keras

    x, y = start["x"], start["y"]
    if "poison" in config:
        y = y.copy()
        y[config["poison"]] = float("nan")
    model = build(keras, config["widths"], start, config.get("stop_gradient", False))
    optimizer = getattr(keras.optimizers, config["optimizer"])(**config["optimizer_args"])
    if "loss_scale" in config:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, **config["loss_scale"])
    options = {k: config[k] for k in ("steps_per_execution", "run_eagerly") if k in config and execution}
    model.compile(optimizer, "mse", **options)
    callbacks = [] if log_dir is None else [tb_gradcheck.keras.GradientCallback(log_dir, **config.get("callback", {}))]
    model.fit(
        x, y, batch_size=config["batch_size"], epochs=config["epochs"], shuffle=False, verbose=0, callbacks=callbacks
    )
    return model


def _state(model):
    import numpy as np

    return [np.asarray(w) for w in model.get_weights()], [np.asarray(v.value) for v in model.optimizer.variables]


def _same(a, b):
    import numpy as np

    return all(
        len(x) == len(y) and all(np.array_equal(p, q, equal_nan=True) for p, q in zip(x, y)) for x, y in zip(a, b)
    )


def _hooked(model):
    """The optimizer (and model) methods a GradientCallback still holds."""
    return sorted(set(vars(model.optimizer)) & set(HOOKS) | set(vars(model)) & set(MODEL_HOOKS))


def _messages(caught):
    return [str(w.message) for w in caught if "GradientCallback" in str(w.message)]


def _raising_fits(keras, start, root, where):
    """A fit that raises at its third batch (``where``: in the step, or in another callback), then a clean fit.

    The same twice, with a GradientCallback (into ``root/raise_<where>``)
    and without; returns what the test checks.
    """
    import tb_gradcheck.keras

    armed = [False]

    def loss(y, p):
        if armed[0]:
            raise Raise("planted in the loss")
        return keras.ops.mean((y - p) ** 2)

    class Planted(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            armed[0] = where == "step" and batch == 2

        def on_train_batch_end(self, batch, logs=None):
            if where == "callback" and batch == 1:
                raise Raise("planted in a callback")

    out = {}
    for label, log_dir in (("with", os.path.join(root, f"raise_{where}")), ("without", None)):
        model = build(keras, [6, 12, 8, 1], start)
        model.compile(keras.optimizers.Adam(0.01), loss)
        callbacks = [Planted()] + ([] if log_dir is None else [tb_gradcheck.keras.GradientCallback(log_dir)])
        try:
            model.fit(start["x"], start["y"], batch_size=8, shuffle=False, verbose=0, callbacks=callbacks)
        except Raise:
            pass
        armed[0] = False
        if log_dir is not None:
            out["hooked_after_raise"] = _hooked(model)
        model.fit(start["x"], start["y"], batch_size=8, epochs=2, shuffle=False, verbose=0)
        out[label] = _state(model)
        if log_dir is not None:
            out["hooked_after_next_fit"] = _hooked(model)
            out["next_train_function"] = getattr(model.train_function, "__name__", None)
    return {
        "bit_identical": _same(out["with"], out["without"]),
        "hooked_after_raise": out["hooked_after_raise"],
        "hooked_after_next_fit": out["hooked_after_next_fit"],
        "next_train_function": out["next_train_function"],
    }


def _jit_fits(keras, start, root, widths):
    """``jit_compile=True`` on torch: the fit runs eagerly (a warning) and the setting is put back."""
    import tb_gradcheck.keras

    states, out = [], {}
    for log_dir in (os.path.join(root, "jit"), None):
        model = build(keras, widths, start)
        model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=log_dir is not None)
        callbacks = [] if log_dir is None else [tb_gradcheck.keras.GradientCallback(log_dir)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(start["x"], start["y"], batch_size=8, shuffle=False, verbose=0, callbacks=callbacks)
        states.append(_state(model))
        if log_dir is not None:
            out = {"warnings": _messages(caught), "jit_compile_after": bool(model.jit_compile)}
    out["same_as_eager"] = _same(*states)
    return out


def main(backend, root):
    import keras
    import numpy as np

    import tb_gradcheck.keras

    start = dict(np.load(os.path.join(root, "start.npz")))
    with open(os.path.join(root, "fits.json")) as f:
        fits = json.load(f)
    result = {"backend": keras.backend.backend()}
    for name, config in fits.items():
        callback = type(tb_gradcheck.keras.GradientCallback(os.path.join(root, name), **config["callback"]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = fit(keras, start, config, os.path.join(root, name))
        with_cb = _state(model)
        result[name] = {
            "bit_identical": _same(with_cb, _state(fit(keras, start, config))),
            "callback": f"{callback.__module__}.{callback.__name__}",
            "warnings": _messages(caught),
            "hooked": _hooked(model),
        }
    # A second fit of the same model and optimizer: its steps go on from the first's.
    every = fits["every"]
    model = fit(keras, start, every, os.path.join(root, "again"))
    callback = tb_gradcheck.keras.GradientCallback(os.path.join(root, "again"))
    model.fit(start["x"], start["y"], batch_size=8, shuffle=False, verbose=0, callbacks=[callback])
    try:
        tb_gradcheck.keras.GradientCallback(root, check_every_n_steps=1, check_data=(start["x"], start["y"]))
        result["check_arguments_refused"] = False
    except ValueError:
        result["check_arguments_refused"] = True
    refused = dict(every, callback={}, **REFUSED[backend])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(keras, start, refused, os.path.join(root, "refused"))
    result["refused_warnings"] = _messages(caught)
    # Made when the callback was built (as every writer's run directory), never written.
    result["refused_wrote"] = bool(glob.glob(os.path.join(root, "refused", "**", "events.*"), recursive=True))
    if backend == "torch":
        for where in ("step", "callback"):
            result[f"raise_{where}"] = _raising_fits(keras, start, root, where)
        result["jit"] = _jit_fits(keras, start, root, every["widths"])
    result["tensorflow_imported"] = any(
        v is not None for m, v in sys.modules.items() if m.split(".")[0] == "tensorflow"
    )
    with open(os.path.join(root, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    backend, root = sys.argv[1:]
    os.environ["KERAS_BACKEND"] = backend
    # As where TensorFlow is not installed: `import tensorflow` raises
    # ImportError and find_spec says absent (torch._dynamo looks for it).
    sys.modules["tensorflow"] = None
    main(backend, root)
