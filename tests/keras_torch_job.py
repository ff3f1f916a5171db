"""Keras 3 on the PyTorch backend: model.fit with and without GradientCallback (run by torch/test_torch_keras.py in its own process).

``python keras_torch_job.py DIR``: reads ``DIR/start.npz`` (weights, data)
and ``DIR/fits.json`` (``{name: fit config}``, as ``keras_jax_job.fit``
takes them), and for each fit trains the model twice from the same
weights, with the callback (into ``DIR/<name>/train``) and without; then
fits that raise, with ``jit_compile=True`` and with a LossScaleOptimizer.
Writes ``DIR/result.json``. TensorFlow is blocked from import here: the
callback's path on torch must not need it.
"""

import json
import os
import sys
import warnings


class Raise(Exception):
    """The planted failure."""


def job_fit(keras, start, config, log_dir=None):
    """``keras_jax_job.fit``'s fit of ``config`` (test_torch_keras.py runs it on TensorFlow), with two more keys.

    ``config["poison"]``: rows of the targets made NaN. ``config["loss_scale"]``:
    ``LossScaleOptimizer`` arguments; the optimizer is wrapped in one.
    """
    from keras_jax_job import build

    import tb_gradcheck.keras

    x, y = start["x"], start["y"]
    if "poison" in config:
        y = y.copy()
        y[config["poison"]] = float("nan")
    model = build(keras, config["widths"], start)
    optimizer = getattr(keras.optimizers, config["optimizer"])(**config["optimizer_args"])
    if "loss_scale" in config:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, **config["loss_scale"])
    model.compile(optimizer, "mse")
    callbacks = [] if log_dir is None else [tb_gradcheck.keras.GradientCallback(log_dir, **config["callback"])]
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
    """The optimizer methods a GradientCallback still holds."""
    from tb_gradcheck.torch import keras as torch_keras

    hooks = (torch_keras.APPLY_HOOK, torch_keras.CLIP_HOOK, torch_keras.UPDATE_HOOK)
    return sorted(set(vars(model.optimizer)) & set(hooks))


def _raising_fits(keras, start, root, where):
    """A fit that raises at its third batch (``where``: in the step, or in another callback), then a clean fit.

    The same twice, with a GradientCallback (into ``root/raise_<where>``)
    and without; returns what the test checks.
    """
    from keras_jax_job import build

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


def _messages(caught):
    return [str(w.message) for w in caught if "GradientCallback" in str(w.message)]


def main(root):
    import keras
    import numpy as np
    from keras_jax_job import build

    import tb_gradcheck.keras

    fit = job_fit
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
        without = _state(fit(keras, start, config))
        result[name] = {
            "bit_identical": _same(with_cb, without),
            "callback": f"{callback.__module__}.{callback.__name__}",
            "warnings": _messages(caught),
            "hooked": _hooked(model),
        }
    # A second fit of the same model and optimizer: its steps go on from the first's.
    model = fit(keras, start, fits["every"], os.path.join(root, "again"))
    callback = tb_gradcheck.keras.GradientCallback(os.path.join(root, "again"))
    model.fit(start["x"], start["y"], batch_size=8, shuffle=False, verbose=0, callbacks=[callback])
    for where in ("step", "callback"):
        result[f"raise_{where}"] = _raising_fits(keras, start, root, where)
    try:
        tb_gradcheck.keras.GradientCallback(root, check_every_n_steps=1, check_data=(start["x"], start["y"]))
        result["check_arguments_refused"] = False
    except ValueError:
        result["check_arguments_refused"] = True
    # jit_compile=True: run eagerly for the fit (a warning), the setting put back.
    states = []
    for log_dir in (os.path.join(root, "jit"), None):
        model = build(keras, fits["every"]["widths"], start)
        model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=log_dir is not None)
        callbacks = [] if log_dir is None else [tb_gradcheck.keras.GradientCallback(log_dir)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(start["x"], start["y"], batch_size=8, shuffle=False, verbose=0, callbacks=callbacks)
        states.append(_state(model))
        if log_dir is not None:
            result["jit"] = {"warnings": _messages(caught), "jit_compile_after": bool(model.jit_compile)}
    result["jit"]["same_as_eager"] = _same(*states)
    # A LossScaleOptimizer over gradient accumulation: a warning, a fit like any other, and no run written.
    model = build(keras, fits["every"]["widths"], start)
    inner = keras.optimizers.SGD(0.05, gradient_accumulation_steps=2)
    model.compile(keras.optimizers.LossScaleOptimizer(inner), "mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback = tb_gradcheck.keras.GradientCallback(os.path.join(root, "loss_scale"))
        model.fit(start["x"], start["y"], batch_size=8, verbose=0, callbacks=[callback])
    result["loss_scale_warning"] = _messages(caught)
    result["loss_scale_wrote"] = os.path.exists(os.path.join(root, "loss_scale"))
    result["tensorflow_imported"] = any(
        v is not None for m, v in sys.modules.items() if m.split(".")[0] == "tensorflow"
    )
    with open(os.path.join(root, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = "torch"
    # As where TensorFlow is not installed: `import tensorflow` raises
    # ImportError and find_spec says absent (torch._dynamo looks for it).
    sys.modules["tensorflow"] = None
    main(sys.argv[1])
