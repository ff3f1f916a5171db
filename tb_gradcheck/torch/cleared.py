"""Whether the gradients are cleared between optimizer steps, for the PyTorch writer: a forgotten ``zero_grad()``.

PyTorch adds each ``backward()`` into ``.grad``; a loop that never calls
``optimizer.zero_grad()`` applies, at every step, the sum of every gradient
so far. It trains badly rather than not at all, and the statistics cannot
tell it apart from a gradient that grows, so the writer, which sees the
steps, says it.

After each optimizer step ``Cleared.stepped`` notes the gradient of one
parameter that optimizer holds, the sentinel: the tensor object and its version counter (every
in-place change bumps it). A hook on that parameter runs at the next
``backward()`` before its gradient is added in. By then the gradient the
optimizer applied was cleared (``zero_grad()`` sets it to None, or zeroes
it in place: a new version); if it is still the same tensor at the same
version, nothing cleared it, and the new gradient is added to the applied
one. A user's own ``.grad = None`` or ``.grad.zero_()`` counts as cleared,
and so does anything else that changes it in place (a known miss, never a
false warning). Cost: a weak reference per optimizer step, one hook call
per ``backward()``; nothing is read from the device.
"""

import weakref

import torch


class Cleared:
    """Watches one parameter's gradient between an optimizer step and the next ``backward()``.

    Args:
      on_uncleared: Called once, with no arguments, at the first
        ``backward()`` that adds into a gradient the optimizer has applied.
    """

    def __init__(self, on_uncleared):
        self._on_uncleared = on_uncleared
        self._sentinel = None  # the watched parameter
        self._handle = None
        self._applied = None  # (weak reference to its applied gradient, that gradient's version), until backward
        self.found = False

    def stepped(self, params):
        """After an optimizer step: notes the applied gradient of the first of ``params`` that has one."""
        if self.found:
            self.detach()  # here, not inside the hook: the engine is running the hooks then
            return
        param = next((p for p in params if p.grad is not None), None)
        if param is None:
            return
        if param is not self._sentinel:
            self.detach()
            self._sentinel = param
            # Eager under a compiled step, as the optimizer's hooks (optimizer.Follower).
            self._handle = param.register_hook(torch.compiler.disable(self._before_accumulate))
        self._applied = (weakref.ref(param.grad), param.grad._version)

    def _before_accumulate(self, gradient):
        applied, self._applied = self._applied, None
        if applied is None or self.found:
            return None
        held = self._sentinel.grad
        if held is not None and held is applied[0]() and held._version == applied[1]:
            self.found = True
            self._on_uncleared()
        return None

    def detach(self):
        if self._handle is not None:
            self._handle.remove()
        self._handle = self._sentinel = None
