"""Keras variables as rows on every backend: the layer that owns a variable, and the depthwise kernels' unit axis.

Imports Keras, not its backend: the TensorFlow writer's rows and the JAX and
torch callbacks' rows come out the same.
"""

import keras

from tb_gradcheck.core import validate


def owner(variable, name):
    """The layer row of a Keras variable: the parent of its ``path`` (``seq/dense/kernel`` -> ``seq/dense``).

    A variable without a Keras ``path`` (a plain ``tf.Variable``), or one
    whose name has no parent, is a layer of its own.
    """
    if isinstance(getattr(variable, "path", None), str) and "/" in name:
        return name.rsplit("/", 1)[0]
    return name


def unit_axes(model):
    """``{variable path: 2}`` for the depthwise kernels of a Keras model (``tb_gradcheck.tensorflow.units`` says why).

    Every other variable's units follow from its shape. Walks every layer
    the model tracks (Keras' ``_flatten_layers``, as ``activations.Taps``
    does): a custom ``Layer``'s sub-layers and a wrapper's
    (``TimeDistributed``, ``Bidirectional``) included, which a walk through
    ``layers`` attributes misses.
    """
    depthwise = tuple(
        getattr(keras.layers, name)
        for name in ("DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D")
        if hasattr(keras.layers, name)
    )
    out = {}
    flatten = getattr(model, "_flatten_layers", None)
    for layer in flatten(include_self=True) if callable(flatten) else [model]:
        if isinstance(layer, keras.layers.EinsumDense):
            out.update(_einsum_unit_axes(layer))
        if isinstance(layer, depthwise):
            # `is None`, not `or`: a Keras Variable refuses to be a boolean (SeparableConv's depthwise_kernel).
            kernel = getattr(layer, "depthwise_kernel", None)
            if kernel is None:
                kernel = getattr(layer, "kernel", None)
            if kernel is not None:
                out[validate.variable_name(kernel)] = 2
    return out


def _einsum_unit_axes(layer):
    """An ``EinsumDense``'s variables whose units span several axes: ``{path: axes}``.

    Its outputs are every output axis its kernel carries, not the last one
    alone: a ``MultiHeadAttention`` query projection ``abc,cde->abde`` has a
    kernel ``[dim, heads, key_dim]`` and a bias ``[heads, key_dim]``, whose
    units are the ``heads * key_dim`` (head, dimension) pairs. The kernel's
    unit axes are its trailing letters found in the output; the bias holds
    output axes only.
    """
    out = {}
    inputs, output = layer.equation.split("->")
    kernel = getattr(layer, "_kernel", None)
    if kernel is not None and "," in inputs:
        axes = 0
        for letter in reversed(inputs.split(",")[1]):
            if letter not in output:
                break
            axes += 1
        if axes > 1:
            out[validate.variable_name(kernel)] = axes
    bias = getattr(layer, "bias", None)
    if bias is not None and len(bias.shape) > 1:
        out[validate.variable_name(bias)] = len(bias.shape)
    return out
