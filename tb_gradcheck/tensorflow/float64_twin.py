"""float64_twin: a float64 copy of a Keras model holding the same weights, for gradient checks in float64.

A float32 check resolves a directional derivative to ~0.3% (its error bar is
~14 sqrt(u), u = 6e-8), so errors confined to a small part of a wide layer,
which move the derivative along any probed direction by less than that, are
out of its reach. The same check in float64 (u = 1.1e-16) resolves ~1e-7:
checking a float64 twin of the model catches them at the default cost. The
twin checks the model's function (same architecture, same weights), not the
float32 rounding of it, which is what a gradient check is about.
"""

import numpy as np

from tb_gradcheck.check.float32_gap import FLOAT32_TOLERANCE
from tb_gradcheck.check.float32_gap import own_gap


def float64_twin(model):
    """A float64 clone of a Keras model, holding the model's weights (cast to float64).

    Every layer is rebuilt from its config with ``dtype="float64"`` (custom
    layers need ``get_config``, as for ``keras.models.clone_model``); if the
    model is compiled, the twin is compiled with the same loss, in float64
    (``twin.compute_loss`` then returns a float64 loss). The twin is
    independent of the model: call ``sync_twin(model, twin)`` to copy the
    model's current weights again before each check.

    Example:

        twin = tb_gradcheck.keras.float64_twin(model)
        x64, y64 = tf.cast(x, tf.float64), tf.cast(y, tf.float64)

        @tf.function
        def loss_fn():
            return tf.reduce_mean(tf.square(twin(x64, training=False) - y64))

        tb_gradcheck.keras.sync_twin(model, twin)   # before every check
        report = tb_gradcheck.check_gradients(loss_fn, twin.trainable_variables)

    Args:
      model: A Sequential or functional ``keras.Model``.

    Returns:
      The twin, a ``keras.Model``.

    Raises:
      TypeError: ``model`` is not a Keras model, or is one that
        ``keras.models.clone_model`` cannot clone (a subclassed model).
      ValueError: The clone's weights do not line up with the model's.
    """
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model. Received: {type(model).__name__}")
    if not getattr(model, "inputs", None):
        raise TypeError(
            "Expected a Sequential or functional Keras model with known inputs (a subclassed model cannot be "
            f"cloned layer by layer). Received: {type(model).__name__} without `inputs`"
        )
    floatx = keras.config.floatx()
    # Keras loss objects take their dtype from floatx when they are built, at
    # the first compute_loss: building them under float64 (on a one-sample
    # batch of zeros) keeps the loss in float64 instead of casting the twin's
    # output back to float32, which would quantise it to float32 steps.
    keras.config.set_floatx("float64")
    try:
        inputs = [keras.Input(batch_shape=tuple(i.shape), dtype=_float64(i.dtype), name=_name(i)) for i in model.inputs]
        try:
            twin = keras.models.clone_model(
                model, input_tensors=inputs if len(inputs) > 1 else inputs[0], clone_function=_float64_layer
            )
        except (TypeError, ValueError, NotImplementedError) as e:
            raise TypeError(
                f"Expected a model keras.models.clone_model can rebuild from layer configs. Received: "
                f"{type(model).__name__} ({type(e).__name__}: {e})"
            ) from e
        loss = getattr(model, "loss", None)
        if loss is not None:
            twin.compile(loss=loss)
            _build_loss(twin)
    finally:
        keras.config.set_floatx(floatx)
    sync_twin(model, twin)
    return twin


def _build_loss(twin):
    inputs = [np.zeros((1,) + tuple(d or 1 for d in i.shape[1:]), _numpy_dtype(i.dtype)) for i in twin.inputs]
    inputs = inputs if len(inputs) > 1 else inputs[0]
    y_pred = twin(inputs, training=False)
    twin.compute_loss(x=inputs, y=y_pred, y_pred=y_pred, training=False)


def _numpy_dtype(dtype):
    return np.dtype(getattr(dtype, "name", str(dtype)))


def sync_twin(model, twin):
    """Copies ``model``'s current weights into ``twin`` (cast to the twin's dtype), position by position.

    Raises:
      ValueError: The two do not have the same weights (count or shapes).
    """
    source, target = model.weights, twin.weights
    if len(source) != len(target) or any(tuple(s.shape) != tuple(t.shape) for s, t in zip(source, target)):
        raise ValueError(
            "Expected a twin with the model's weights, in the same order and shapes. Received: "
            f"{len(source)} weights in the model, {len(target)} in the twin"
        )
    for s, t in zip(source, target):
        t.assign(np.asarray(s.numpy()).astype(t.dtype))


def _float64_layer(layer):
    import keras

    if isinstance(layer, keras.layers.Lambda):
        # The same Python function, not a deserialised copy (Keras refuses
        # to deserialise lambdas, and nothing is loaded from disk here).
        return keras.layers.Lambda(layer.function, arguments=layer.arguments, name=layer.name, dtype="float64")
    config = layer.get_config()
    if "dtype" in config:
        config["dtype"] = "float64"
    return layer.__class__.from_config(config)


def _float64(dtype):
    name = getattr(dtype, "name", str(dtype))
    return "float64" if "float" in name else dtype


def _name(tensor):
    name = getattr(tensor, "name", None)
    return name.split(":")[0] if isinstance(name, str) else None


def float32_gap(report, loss_fn, variables, twin_loss_fn, twin_variables, tolerance=FLOAT32_TOLERANCE):
    """``report`` (the twin's check) with each row's float32 gradient held against the twin's float64 one.

    Args:
      report: The ``GradientCheckReport`` of ``check_gradients(twin_loss_fn, twin_variables)``.
      loss_fn: The model's loss in its own precision, reading ``variables``;
        any state it writes is put back (as ``check_gradients`` does).
      variables: The model's variables, position by position the twin's.
      twin_loss_fn: The twin's loss, as checked.
      twin_variables: The twin's variables, as checked.
      tolerance: The relative gap ||g - g64|| / ||g64|| above which a row
        is a mismatch.

    Returns:
      The report (``own_gap``'s: unchanged but for a note when the two
      losses differ by more than float32 rounding), with every row that the
      twin's check did not already convict and whose gradient is more than ``tolerance`` off the float64
      one, or not finite where that one is, made a mismatch; its reason
      says so, its ``analytic`` and ``numeric`` are the two gradients along
      the float64 one and its ``relative_error`` the gap.

    Raises:
      ValueError: The two variable lists do not match in count and shapes.
    """
    variables, twin_variables = list(variables), list(twin_variables)
    if len(variables) != len(twin_variables) or any(
        tuple(a.shape) != tuple(b.shape) for a, b in zip(variables, twin_variables)
    ):
        raise ValueError(
            "Expected the model's variables and the twin's, in the same order and shapes. Received: "
            f"{len(variables)} and {len(twin_variables)} variables"
        )
    from tb_gradcheck.tensorflow.evaluator import Evaluator
    from tb_gradcheck.tensorflow.evaluator import tf_variable
    from tb_gradcheck.tensorflow.variables import Rows

    twin = _gradients(twin_loss_fn, twin_variables)
    evaluator = Evaluator(loss_fn, [tf_variable(v) for v in variables])
    try:
        return own_gap(report, evaluator, twin, Rows(twin_variables), tolerance)
    finally:
        evaluator.restore_all()


def _gradients(loss_fn, variables):
    from tb_gradcheck.tensorflow.evaluator import Evaluator
    from tb_gradcheck.tensorflow.evaluator import tf_variable

    evaluator = Evaluator(loss_fn, [tf_variable(v) for v in variables])
    try:
        return [None if g is None else np.asarray(g, np.float64) for g in evaluator.gradients()]
    finally:
        evaluator.restore_all()
