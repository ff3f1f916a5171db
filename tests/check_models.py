"""Small models for the gradient-check tests, each traced once and redrawn in place per seed.

A ``Case`` holds a Keras model, its inputs and targets in variables, and one
``tf.function`` loss over them. ``reseed(s)`` assigns new Glorot-uniform
weights, biases and data drawn from seed ``s``, so a 100-seed loop checks
100 different models and batches without a single retrace.
"""

import numpy as np
import tensorflow as tf


class ScaledGradient(tf.keras.layers.Layer):
    """A dense layer whose parameter gradients are ``factor`` times the true ones (1.0: correct).

    A ``tf.custom_gradient`` over the whole affine map returns the exact
    gradient with respect to the input and scaled ones for the kernel and
    the bias, so only this layer's own parameters get a wrong gradient: every
    other layer's stays right.
    """

    def __init__(self, units, factor=1.0, activation=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.factor = factor
        self.activation = tf.keras.activations.get(activation)

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units))
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

    def call(self, x):
        factor = self.factor

        @tf.custom_gradient
        def affine(x, w, b):
            def grad(dy):
                return (tf.matmul(dy, w, transpose_b=True), factor * tf.matmul(x, dy, transpose_a=True),
                        factor * tf.reduce_sum(dy, axis=0))

            return tf.matmul(x, w) + b, grad

        return self.activation(affine(x, tf.convert_to_tensor(self.kernel), tf.convert_to_tensor(self.bias)))


class Case:
    """A model, its data in variables and one traced loss; ``reseed`` redraws all of it in place."""

    def __init__(self, model, batch, loss="mse", bias_scale=0.1):
        self.model = model
        self.dtype = model.inputs[0].dtype
        self.bias_scale = bias_scale
        in_shape = (batch,) + tuple(model.inputs[0].shape[1:])
        out_shape = (batch,) + tuple(model.outputs[0].shape[1:])
        self.x = tf.Variable(tf.zeros(in_shape, self.dtype), trainable=False, name="x")
        if loss == "mse":
            self.y = tf.Variable(tf.zeros(out_shape, self.dtype), trainable=False, name="y")
            self.classes = None
            self.loss = tf.function(lambda: tf.reduce_mean(tf.square(self.model(self.x) - self.y)))
        else:
            self.y = tf.Variable(tf.zeros((batch,), tf.int32), trainable=False, name="y")
            self.classes = out_shape[-1]
            self.loss = tf.function(lambda: tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(self.y, self.model(self.x), from_logits=True)))

    @property
    def variables(self):
        return self.model.trainable_variables

    def reseed(self, seed):
        rng = np.random.default_rng(seed)
        for v in self.model.trainable_variables:
            shape = tuple(v.shape)
            if len(shape) == 1:
                value = rng.uniform(-self.bias_scale, self.bias_scale, shape) if self.bias_scale else np.zeros(shape)
            else:
                receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
                fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
                limit = np.sqrt(6.0 / (fan_in + fan_out))
                value = rng.uniform(-limit, limit, shape)
            v.assign(value.astype(self.dtype))
        self.x.assign(rng.normal(size=self.x.shape).astype(self.dtype))
        if self.classes:
            self.y.assign(rng.integers(0, self.classes, size=self.y.shape).astype(np.int32))
        else:
            self.y.assign(rng.normal(size=self.y.shape).astype(self.dtype))
        return self


def mlp(sizes, activation="tanh", dtype="float32", batch=16, wrong_layer=None, factor=1.03, bias_scale=0.1):
    """Dense layers ``sizes[0] -> ... -> sizes[-1]`` (linear output), MSE; layer ``wrong_layer`` scaled."""
    layers = [tf.keras.Input((sizes[0],), dtype=dtype)]
    for i, units in enumerate(sizes[1:]):
        act = None if i == len(sizes) - 2 else activation
        if i == wrong_layer:
            layers.append(ScaledGradient(units, factor=factor, activation=act, name=f"dense_{i}", dtype=dtype))
        else:
            layers.append(tf.keras.layers.Dense(units, activation=act, name=f"dense_{i}", dtype=dtype))
    return Case(tf.keras.Sequential(layers, name="mlp"), batch, bias_scale=bias_scale)


def cnn(dtype="float32", batch=8):
    """Two 3x3 tanh convolutions and a dense softmax head on 8x8x2 inputs, cross-entropy."""
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 2), dtype=dtype),
        tf.keras.layers.Conv2D(4, 3, activation="tanh", name="conv_0", dtype=dtype),
        tf.keras.layers.Conv2D(4, 3, activation="tanh", name="conv_1", dtype=dtype),
        tf.keras.layers.Flatten(dtype=dtype),
        tf.keras.layers.Dense(3, name="logits", dtype=dtype),
    ], name="cnn")
    return Case(model, batch, loss="xent")
