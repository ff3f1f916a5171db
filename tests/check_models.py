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
                return (
                    tf.matmul(dy, w, transpose_b=True),
                    factor * tf.matmul(x, dy, transpose_a=True),
                    factor * tf.reduce_sum(dy, axis=0),
                )

            return tf.matmul(x, w) + b, grad

        return self.activation(affine(x, tf.convert_to_tensor(self.kernel), tf.convert_to_tensor(self.bias)))


class PositionBias(tf.keras.layers.Layer):
    """Adds a bias of its own to every position and channel (a flat vector, so ``Case.reseed`` draws it as a bias)."""

    def build(self, input_shape):
        self.shape = tuple(input_shape[1:])
        self.bias = self.add_weight(name="bias", shape=(int(np.prod(self.shape)),), initializer="zeros")

    def call(self, x):
        return x + tf.reshape(tf.cast(self.bias, x.dtype), self.shape)


class Case:
    """A model, its data in variables and one traced loss; ``reseed`` redraws all of it in place."""

    def __init__(
        self, model, batch, loss="mse", bias_scale=0.1, loss_scale=1.0, vocab=None, train_steps=0, zero_rows=0
    ):
        """``loss_scale`` multiplies the loss; ``vocab`` draws integer inputs below it; ``train_steps`` SGD steps
        (learning rate 0.1) run after every reseed, so the check sees a trained model; the first ``zero_rows``
        inputs of the batch are zeros (padding)."""
        self.model = model
        self.settings = dict(
            batch=batch,
            loss=loss,
            bias_scale=bias_scale,
            loss_scale=loss_scale,
            vocab=vocab,
            train_steps=train_steps,
            zero_rows=zero_rows,
        )
        self.zero_rows = zero_rows
        self.dtype = tf.as_dtype(model.outputs[0].dtype)
        self.in_dtype = tf.as_dtype(model.inputs[0].dtype)
        self.bias_scale = bias_scale
        self.vocab = vocab
        self.train_steps = train_steps
        in_shape = (batch,) + tuple(model.inputs[0].shape[1:])
        out_shape = (batch,) + tuple(model.outputs[0].shape[1:])
        self.x = tf.Variable(tf.zeros(in_shape, self.in_dtype), trainable=False, name="x")
        scale = tf.constant(loss_scale, self.dtype)
        if loss == "mse":
            self.y = tf.Variable(tf.zeros(out_shape, self.dtype), trainable=False, name="y")
            self.classes = None
            self.loss = tf.function(lambda: scale * tf.reduce_mean(tf.square(self.model(self.x) - self.y)))
        else:
            self.y = tf.Variable(tf.zeros((batch,), tf.int32), trainable=False, name="y")
            self.classes = out_shape[-1]
            self.loss = tf.function(
                lambda: (
                    scale
                    * tf.reduce_mean(
                        tf.keras.losses.sparse_categorical_crossentropy(self.y, self.model(self.x), from_logits=True)
                    )
                )
            )

    @property
    def variables(self):
        return self.model.trainable_variables

    def float64(self):
        """The same case on ``float64_twin(model)``: ``reseed(s)`` draws the same values, unrounded."""
        from tb_gradcheck.tensorflow.float64_twin import float64_twin

        settings = dict(self.settings)
        return Case(float64_twin(self.model), settings.pop("batch"), **settings)

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
            v.assign(value.astype(v.dtype))
        if self.vocab:
            self.x.assign(rng.integers(0, self.vocab, size=self.x.shape).astype(self.in_dtype.as_numpy_dtype))
        else:
            x = rng.normal(size=self.x.shape)
            x[: self.zero_rows] = 0.0
            self.x.assign(x.astype(self.in_dtype.as_numpy_dtype))
        if self.classes:
            self.y.assign(rng.integers(0, self.classes, size=self.y.shape).astype(np.int32))
        else:
            self.y.assign(rng.normal(size=self.y.shape).astype(self.dtype.as_numpy_dtype))
        for _ in range(self.train_steps):
            with tf.GradientTape() as tape:
                loss = self.loss()
            for v, g in zip(self.variables, tape.gradient(loss, self.variables)):
                if g is not None:
                    v.assign_sub(tf.cast(0.1, v.dtype) * tf.convert_to_tensor(g))
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
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 2), dtype=dtype),
            tf.keras.layers.Conv2D(4, 3, activation="tanh", name="conv_0", dtype=dtype),
            tf.keras.layers.Conv2D(4, 3, activation="tanh", name="conv_1", dtype=dtype),
            tf.keras.layers.Flatten(dtype=dtype),
            tf.keras.layers.Dense(3, name="logits", dtype=dtype),
        ],
        name="cnn",
    )
    return Case(model, batch, loss="xent")


# -- planted bugs ---------------------------------------------------------------------------
#
# Each kind below is a Dense-like layer (or an op inside one) whose forward
# pass is right and whose custom gradient is wrong in one specific way. The
# layer keeps the exact gradient with respect to its input, so the bug stays
# in this layer's own parameters (or, for the activation and normalisation
# kinds, in what flows back through them). ``planted(kind)`` builds a Case.


def _kernel_bug(kind, element=(0, 0)):
    """``grad -> wrong grad`` for the kernel gradient of a planted kind (None: the kernel gradient is right)."""
    i, j = element
    if kind == "scale":
        return lambda g: 1.03 * g
    if kind == "sign":
        return lambda g: -g
    if kind == "transpose":
        return lambda g: tf.transpose(g)
    if kind == "element":
        # One element wrong by 100% of itself (doubled).
        return lambda g: tf.tensor_scatter_nd_add(g, [[i, j]], [g[i, j]])
    if kind == "row":
        # One input's row of the kernel gradient lost (zero).
        return lambda g: tf.concat([g[:i], tf.zeros_like(g[i : i + 1]), g[i + 1 :]], axis=0)
    if kind == "column":
        # One unit's column doubled.
        return lambda g: g + tf.one_hot(j, tf.shape(g)[1], dtype=g.dtype)[None, :] * g[:, j : j + 1]
    return None


class PlantedDense(tf.keras.layers.Layer):
    """A dense layer with a planted gradient bug ``kind`` (see _kernel_bug; ``"bias_mean"``: bias gradient
    averaged over the batch instead of summed; ``"stop_gradient"``: half the units' kernel columns behind a
    ``tf.stop_gradient``; None: correct)."""

    def __init__(self, units, kind=None, activation=None, element=(0, 0), **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.kind = kind
        self.element = tuple(element)
        self.activation = tf.keras.activations.get(activation)

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units))
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")

    def call(self, x):
        kind = self.kind
        w, b = tf.convert_to_tensor(self.kernel), tf.convert_to_tensor(self.bias)
        if kind == "stop_gradient":
            # A gate whose second half is cut from the gradient: the forward
            # pass reads all of w, the backward pass only its first half.
            half = self.units // 2
            w = tf.concat([w[:, :half], tf.stop_gradient(w[:, half:])], axis=1)
            return self.activation(tf.matmul(x, w) + b)
        kernel_bug = _kernel_bug(kind, self.element)

        @tf.custom_gradient
        def affine(x, w, b):
            def grad(dy):
                dw = tf.matmul(x, dy, transpose_a=True)
                db = tf.reduce_mean(dy, axis=0) if kind == "bias_mean" else tf.reduce_sum(dy, axis=0)
                return tf.matmul(dy, w, transpose_b=True), kernel_bug(dw) if kernel_bug else dw, db

            return tf.matmul(x, w) + b, grad

        return self.activation(affine(x, w, b))


class BrokenLeakyReLU(tf.keras.layers.Layer):
    """Leaky ReLU whose backward pass uses the wrong negative slope: wrong only where inputs are negative."""

    def __init__(self, alpha=0.2, wrong_alpha=0.1, **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha
        self.wrong_alpha = wrong_alpha

    def call(self, x):
        alpha, wrong_alpha = self.alpha, self.wrong_alpha

        @tf.custom_gradient
        def act(x):
            def grad(dy):
                return dy * tf.where(x > 0, tf.ones_like(x), wrong_alpha * tf.ones_like(x))

            return tf.where(x > 0, x, alpha * x), grad

        return act(x)


class PlantedLayerNorm(tf.keras.layers.Layer):
    """Layer normalisation with learned scale and shift, and a hand-written backward pass.

    ``wrong=True`` drops the term of the input gradient that comes through
    the mean and the variance (treating them as constants), a classic bug;
    the scale and shift gradients stay right, so it shows in the layers below.
    """

    def __init__(self, wrong=False, epsilon=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.wrong = wrong
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x):
        wrong, eps = self.wrong, self.epsilon

        @tf.custom_gradient
        def norm(x, gamma, beta):
            mean = tf.reduce_mean(x, axis=-1, keepdims=True)
            inv = tf.math.rsqrt(tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True) + eps)
            xhat = (x - mean) * inv

            def grad(dy):
                dxhat = dy * gamma
                if wrong:
                    dx = dxhat * inv
                else:
                    dx = inv * (
                        dxhat
                        - tf.reduce_mean(dxhat, axis=-1, keepdims=True)
                        - xhat * tf.reduce_mean(dxhat * xhat, axis=-1, keepdims=True)
                    )
                return dx, tf.reduce_sum(dy * xhat, axis=0), tf.reduce_sum(dy, axis=0)

            return xhat * gamma + beta, grad

        return norm(x, tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta))


class PlantedAttention(tf.keras.layers.Layer):
    """Single-head softmax self-attention over a sequence, with a hand-written softmax backward pass.

    ``wrong=True`` drops the ``- sum(p * dp)`` term of the softmax Jacobian.
    """

    def __init__(self, dim, wrong=False, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        self.wrong = wrong

    def build(self, input_shape):
        self.wq = self.add_weight(name="query", shape=(input_shape[-1], self.dim))
        self.wk = self.add_weight(name="key", shape=(input_shape[-1], self.dim))
        self.wv = self.add_weight(name="value", shape=(input_shape[-1], self.dim))

    def call(self, x):
        wrong = self.wrong

        @tf.custom_gradient
        def softmax(s):
            p = tf.nn.softmax(s, axis=-1)

            def grad(dp):
                if wrong:
                    return p * dp
                return p * (dp - tf.reduce_sum(p * dp, axis=-1, keepdims=True))

            return p, grad

        q, k, v = (tf.matmul(x, tf.convert_to_tensor(w)) for w in (self.wq, self.wk, self.wv))
        scores = tf.matmul(q, k, transpose_b=True) / float(self.dim) ** 0.5
        return tf.matmul(softmax(scores), v)


def planted(kind, width=16, dtype="float32", batch=16, seed_element=None):
    """A 8 -> width -> width -> 1 tanh MLP (or the kind's own model) whose layer ``dense_1`` carries bug ``kind``.

    Kinds: scale, sign, transpose, element, row, column, bias_mean,
    stop_gradient (in ``dense_1``); leaky_relu (a broken activation after
    ``dense_0``, so ``dense_0``'s gradient is wrong); layer_norm and
    attention (the layers below the broken op get wrong gradients:
    ``dense_0``, and ``embed`` with the attention's own query and key).
    Returns ``(case, names of the layers whose gradient is wrong)``: every other layer's is right.
    """
    inputs = tf.keras.Input((8,), dtype=dtype)
    if kind == "attention":
        seq = tf.keras.Input((6, 4), dtype=dtype)
        h = tf.keras.layers.Dense(8, name="embed", dtype=dtype)(seq)
        h = PlantedAttention(8, wrong=True, name="attention", dtype=dtype)(h)
        out = tf.keras.layers.Dense(1, name="head", dtype=dtype)(tf.keras.layers.Flatten(dtype=dtype)(h))
        # The softmax sits above the query and key projections: they get the wrong gradient too.
        return Case(tf.keras.Model(seq, out, name="attn"), batch), ("embed", "attention")
    if kind == "layer_norm":
        h = tf.keras.layers.Dense(width, name="dense_0", dtype=dtype)(inputs)
        h = PlantedLayerNorm(wrong=True, name="norm", dtype=dtype)(h)
        out = tf.keras.layers.Dense(1, name="head", dtype=dtype)(tf.keras.layers.Activation("tanh", dtype=dtype)(h))
        return Case(tf.keras.Model(inputs, out, name="ln"), batch), ("dense_0",)
    if kind == "leaky_relu":
        h = tf.keras.layers.Dense(width, name="dense_0", dtype=dtype)(inputs)
        h = BrokenLeakyReLU(name="leaky", dtype=dtype)(h)
        out = tf.keras.layers.Dense(1, name="head", dtype=dtype)(h)
        return Case(tf.keras.Model(inputs, out, name="leaky"), batch), ("dense_0",)
    element = seed_element or (1, 2)
    h = tf.keras.layers.Dense(width, activation="tanh", name="dense_0", dtype=dtype)(inputs)
    h = PlantedDense(width, kind=kind, activation="tanh", element=element, name="dense_1", dtype=dtype)(h)
    out = tf.keras.layers.Dense(1, name="head", dtype=dtype)(h)
    return Case(tf.keras.Model(inputs, out, name="planted"), batch), ("dense_1",)


PLANTED_KINDS = (
    "scale",
    "sign",
    "transpose",
    "element",
    "row",
    "column",
    "bias_mean",
    "stop_gradient",
    "leaky_relu",
    "layer_norm",
    "attention",
)


# -- correct models that must never mismatch ------------------------------------------------


def clean(kind, dtype="float32", batch=16):
    """A correct model of one of CLEAN_KINDS, with the kinks, zeros and scales that make checks hard."""
    if kind in ("relu", "relu_trained"):
        model = mlp((10, 32, 32, 1), activation="relu", dtype=dtype, batch=batch).model
        return Case(model, batch, bias_scale=0.0, train_steps=20 if kind == "relu_trained" else 0)
    if kind == "max_pool":
        model = tf.keras.Sequential(
            [
                tf.keras.Input((8, 8, 2), dtype=dtype),
                tf.keras.layers.Conv2D(4, 3, activation="relu", name="conv", dtype=dtype),
                tf.keras.layers.MaxPooling2D(2, dtype=dtype),
                tf.keras.layers.Flatten(dtype=dtype),
                tf.keras.layers.Dense(3, name="logits", dtype=dtype),
            ],
            name="pool",
        )
        return Case(model, batch, loss="xent")
    if kind == "relu_padded":
        # Keras' zero biases and zero-padded rows: three quarters of the
        # batch puts every ReLU input exactly at its kink.
        model = mlp((10, 32, 32, 1), activation="relu", dtype=dtype, batch=batch).model
        return Case(model, batch, bias_scale=0.0, zero_rows=3 * batch // 4)
    if kind == "max_pool_ties":
        # Every pooling window holds four copies of one value: a four-way tie.
        model = tf.keras.Sequential(
            [
                tf.keras.Input((4, 4, 2), dtype=dtype),
                tf.keras.layers.UpSampling2D(2, dtype=dtype),
                PositionBias(name="position_bias", dtype=dtype),
                tf.keras.layers.MaxPooling2D(2, dtype=dtype),
                tf.keras.layers.Flatten(dtype=dtype),
                tf.keras.layers.Dense(3, name="logits", dtype=dtype),
            ],
            name="ties",
        )
        return Case(model, batch, loss="xent", bias_scale=0.0)
    if kind == "abs_maximum":
        inputs = tf.keras.Input((8,), dtype=dtype)
        h = tf.keras.layers.Dense(16, name="dense_0", dtype=dtype)(inputs)
        h = tf.keras.layers.Lambda(lambda t: tf.abs(t) + tf.maximum(t, 0.1 * t), name="abs_max", dtype=dtype)(h)
        out = tf.keras.layers.Dense(1, name="head", dtype=dtype)(h)
        return Case(tf.keras.Model(inputs, out, name="absmax"), batch)
    if kind == "batch_norm":
        model = tf.keras.Sequential(
            [
                tf.keras.Input((8,), dtype=dtype),
                tf.keras.layers.Dense(16, activation="tanh", name="dense_0", dtype=dtype),
                tf.keras.layers.BatchNormalization(name="bn", dtype=dtype),  # inference mode: moving statistics
                tf.keras.layers.Dense(1, name="head", dtype=dtype),
            ],
            name="bn_net",
        )
        return Case(model, batch)
    if kind == "float16":
        return mlp((8, 16, 16, 1), dtype="float16", batch=batch)
    if kind == "embedding":
        model = tf.keras.Sequential(
            [
                tf.keras.Input((5,), dtype="int32"),
                tf.keras.layers.Embedding(50, 8, name="embed", dtype=dtype),
                tf.keras.layers.Flatten(dtype=dtype),
                tf.keras.layers.Dense(1, name="head", dtype=dtype),
            ],
            name="emb",
        )
        return Case(model, batch, vocab=50)
    if kind in ("loss_1e-8", "loss_1e6"):
        case = mlp((8, 16, 16, 1), dtype=dtype, batch=batch)
        return Case(case.model, batch, loss_scale=1e-8 if kind == "loss_1e-8" else 1e6)
    raise ValueError(f"Expected one of {CLEAN_KINDS}. Received: {kind!r}")


CLEAN_KINDS = (
    "relu",
    "relu_trained",
    "max_pool",
    "relu_padded",
    "max_pool_ties",
    "abs_maximum",
    "batch_norm",
    "float16",
    "embedding",
    "loss_1e-8",
    "loss_1e6",
)
