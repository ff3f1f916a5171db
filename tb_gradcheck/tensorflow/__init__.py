"""tb_gradcheck for TensorFlow: the writer, its Keras callback and the gradient check's TensorFlow evaluator.

The public names are ``tb_gradcheck.GradientWriter``, ``tb_gradcheck.check_gradients`` and
``tb_gradcheck.keras.GradientCallback``. Importing this package imports nothing: each module
imports TensorFlow itself.
"""
