"""Optimizer steps given a closure: run the closure before the step's hooks, so a writer sees its gradients first.

A trainer that calls ``optimizer.step(closure)`` (Lightning does) runs the
backward pass inside the step: the optimizer's step pre-hooks, where
``GradientWriter(optimizer=...)`` copies the weights of a written step, run
before the gradients exist. ``ClosureFirst`` is a step pre-hook, registered
before the writer's, that calls the closure itself and hands the step a
closure that returns the same result: backward (and whatever the trainer
does after it: unscaling, clipping, the writer's ``write``) then happens
before the writer's pre-hook, and the step applies exactly those gradients.

That is the step's own order for an optimizer that calls its closure once,
first, under ``torch.enable_grad()``: every ``torch.optim`` optimizer but
``LBFGS``. An optimizer that calls it again (LBFGS, sharpness-aware
wrappers) would get a stale loss, so ``calls_closure_once`` decides, and for
any other optimizer the writer does not follow the step.
"""

import torch


def calls_closure_once(optimizer):
    """Whether ``optimizer.step(closure)`` calls ``closure`` exactly once, before it changes anything.

    True for the optimizers of ``torch.optim`` (their own classes, not
    subclasses that may step differently), except ``LBFGS``.
    """
    cls = type(optimizer)
    return cls.__module__.startswith("torch.optim.") and cls is not torch.optim.LBFGS


class ClosureFirst:
    """A step pre-hook on ``optimizer`` that runs a step's closure before the hooks registered after it.

    Register it before the writer's hooks (create it before the
    ``GradientWriter``); ``remove`` detaches it.

    Args:
      optimizer: A ``torch.optim.Optimizer`` for which ``calls_closure_once``.
    """

    def __init__(self, optimizer):
        if not calls_closure_once(optimizer):
            raise ValueError(
                "Expected an optimizer that calls its closure once (a torch.optim optimizer other than LBFGS). "
                f"Received: {type(optimizer).__qualname__}"
            )
        self._handle = optimizer.register_step_pre_hook(self._before)

    def remove(self):
        self._handle.remove()

    @staticmethod
    def _before(optimizer, args, kwargs):
        # ``args`` are the step's own: (optimizer, closure?); the closure may come by keyword.
        if "closure" in kwargs:
            closure = kwargs["closure"]
        else:
            closure = args[1] if len(args) > 1 else None
        if closure is None:
            return None
        with torch.enable_grad():  # as the step would run it
            result = closure()

        def done():
            return result

        if "closure" in kwargs:
            return args, dict(kwargs, closure=done)
        return (args[0], done, *args[2:]), kwargs
