"""What the gradient check asks of a framework: evaluate the loss and its gradient, write parameters; numpy only.

The check's algorithm (``algorithm``, ``probes``, ``locate``,
``verdict``) works on float64 numpy arrays and calls a framework only
through an ``Evaluator``. Each framework's ``evaluator`` module
(``tb_gradcheck.tensorflow.evaluator``, ``tb_gradcheck.torch.evaluator``,
``tb_gradcheck.jax.check``) subclasses it and fills in five methods; everything built on them (perturbing a row,
slopes a step away, the evaluation count) is written once, here.

The parameters are opaque handles (a ``tf.Variable``, a ``torch.nn.Parameter``)
that the check only passes back to the evaluator.
"""

import numpy as np

# Unit roundoff u = 2**-(mantissa bits + 1): the largest relative error of one rounding.
_UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
FLOATING = tuple(_UNIT_ROUNDOFF)


def unit_roundoff(dtype_name):
    """The unit roundoff of a floating dtype named ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"``."""
    return _UNIT_ROUNDOFF[dtype_name]


class Evaluator:
    """Evaluates the loss and its gradient at the parameters as they are, and writes parameters.

    Subclasses implement ``_forward``, ``_backward``, ``write``, ``saved64``
    and ``reset``, and own the snapshot of every parameter and piece of state
    the loss reads (restored by the framework's front in a ``finally``).

    Attributes:
      checked: The checked parameters (handles), in row order.
      evaluations: Loss evaluations so far (``loss`` and ``slope_at``).
      loss_dtype: Name of the loss dtype (``"float32"``...), known after the first ``loss``.
    """

    def __init__(self, checked):
        self.checked = list(checked)
        self.evaluations = 0
        self.loss_dtype = None

    # -- what a framework provides ------------------------------------------------

    def _forward(self):
        """``(loss as a Python float, its dtype name)``; any state the loss wrote is put back."""
        raise NotImplementedError

    def _backward(self):
        """The analytic gradient of each checked parameter as a numpy array (None where the loss ignores it)."""
        raise NotImplementedError

    def write(self, v, value):
        """Sets parameter ``v`` to the float64 array ``value`` rounded to ``v``'s dtype; returns what it holds now, as float64."""
        raise NotImplementedError

    def saved64(self, v):
        """``v``'s value before the check, as a float64 numpy array."""
        raise NotImplementedError

    def reset(self, v):
        """Puts ``v`` back to its value before the check, bit for bit."""
        raise NotImplementedError

    def dtype_name(self, v):
        """The name of ``v``'s dtype (one of FLOATING)."""
        raise NotImplementedError

    # -- built on those, once for every framework --------------------------------

    def unit(self, v):
        return unit_roundoff(self.dtype_name(v))

    def loss(self):
        """One loss evaluation as a Python float."""
        value, dtype = self._forward()
        self.evaluations += 1
        if self.loss_dtype is None:
            self.loss_dtype = dtype
        return value

    def gradients(self):
        """The analytic gradient of each checked parameter (numpy, or None where the loss ignores it)."""
        return self._backward()

    def perturb(self, variables, theta, direction, step):
        """Sets each variable to fl(theta + step * d); returns the applied perturbations (float64)."""
        return [self.write(v, t + step * d) - t for v, t, d in zip(variables, theta, direction)]

    def slope_at(self, variables, theta, direction, step):
        """The analytic derivative along ``direction`` with ``variables`` at fl(theta + step * d), then put back.

        The derivative is the gradient there dotted with the perturbation
        actually applied, over ``step``; counted as one evaluation.
        """
        applied = self.perturb(variables, theta, direction, step)
        try:
            grads = self.gradients()
        finally:
            for v in variables:
                self.reset(v)
        self.evaluations += 1
        by_id = {id(v): g for v, g in zip(self.checked, grads)}
        dots = [
            np.sum(np.asarray(by_id[id(v)], np.float64) * p)
            for v, p in zip(variables, applied)
            if by_id[id(v)] is not None
        ]
        return float(sum(dots)) / step
