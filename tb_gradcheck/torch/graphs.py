"""A step's norms and non-finite counts in one launch on a GPU: CUDA graphs keyed by the gradients' addresses.

Why. A step between writes computes two per-parameter columns
(``reductions.step_norms``): a dozen kernels, and the fused multi-tensor
norms make one host tensor per parameter besides. On a GPU such a step is
bound by the host's launches (5-10 us each), and a model of a few hundred
parameters spent a millisecond of host time per step on them. A CUDA graph
of that work replays it in one launch.

Why it is safe. A graph replays its kernels on the memory it was captured
with. The gradients are new tensors at each step under
``zero_grad(set_to_none=True)``, but in a steady loop the caching allocator
hands the same blocks back (and ``set_to_none=False`` or DDP's bucket views
keep them), so a graph is keyed by the present parameters and every
gradient's address (``data_ptr``). A gradient's shape and dtype are its
parameter's (PyTorch enforces both when it is set), so the same key means
the same elements at the same places: a replay reads this step's
gradients. Any other key runs eagerly. A graph is captured when one key
is seen at two consecutive steps, after that step's eager run (the warm-up
PyTorch asks for; the step keeps its eager values), on a side stream; it
writes its own output buffer, which is then copied to where the caller
wants the step (the window's history row, ``window.DeviceWindow.slot``).
Nothing in it reads the device back: the same kernels as the eager step.

The capture calls ``CUDAGraph.capture_begin`` / ``capture_end`` itself:
``torch.cuda.graph`` would also synchronise the device and empty the
allocator's cache, which is a wait and can move the next step's gradients.

Memory. The graph's temporaries (the gradients laid out flat and their
finite flags: about twice the gradients' bytes) stay reserved in its
memory pool while the writer lives; the graphs share one pool (they never
run at once, and their outputs live outside it). So graphs are used only
for gradients under ``MAX_BYTES`` in all: for a bigger model a step takes
long enough that a dozen launches are negligible against it. At most
``MAX_GRAPHS`` are captured per writer; other keys then run eagerly. If a
capture raises, none is tried again (eager from then on, silently).
"""

import torch

# Most gradient bytes in all for which steps are captured (the pool keeps about twice that).
MAX_BYTES = 64 << 20
# Graphs captured per writer (each key of addresses seen at two consecutive steps takes one).
MAX_GRAPHS = 4

_data_ptr = torch.Tensor.data_ptr


def key(where, tensors):
    """The key of a step: the present parameters' indices (one list per pattern) and every gradient's address."""
    return (id(where), tuple(map(_data_ptr, tensors)))


class StepGraphs:
    """The CUDA graphs of one writer's step, by key (the module docstring)."""

    def __init__(self):
        self._graphs = {}  # key -> (torch.cuda.CUDAGraph, its output buffer)
        self._last = None  # the previous step's key
        self._pool = None
        self._stream = None
        self.capturing = True
        self.replays = 0

    def run(self, key, tensors, fill, out):
        """``fill(out)``, the step's values written into ``out``: from this key's graph, or eagerly.

        Args:
          key: The step's ``key``.
          tensors: The gradients ``fill`` reads (dense, on ``out``'s GPU).
          fill: Writes the step's values into the tensor it is given, with no
            host synchronisation (it is what a graph captures).
          out: Where the step's values go.

        Returns:
          ``out``.
        """
        held = self._graphs.get(key)
        if held is not None:
            graph, static = held
            graph.replay()
            self.replays += 1
            return out.copy_(static)
        fill(out)
        if self.capturing and key == self._last:
            self._capture(key, tensors, fill, out)
        self._last = key
        return out

    def _capture(self, key, tensors, fill, out):
        if len(self._graphs) >= MAX_GRAPHS:
            self.capturing = False
            return
        if torch.cuda.get_sync_debug_mode():
            return  # asked to hear of every wait: capture later
        device = out.device
        size = sum(t.numel() * t.element_size() for t in tensors)
        if not tensors or size > MAX_BYTES or any(t.device != device or not t.is_contiguous() for t in tensors):
            self.capturing = False
            return
        with torch.cuda.device(device):
            static = torch.empty_like(out)
            graph = torch.cuda.CUDAGraph()
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            current = torch.cuda.current_stream()
            self._stream.wait_stream(current)
            try:
                with torch.cuda.stream(self._stream):
                    pool = () if self._pool is None else (self._pool,)
                    graph.capture_begin(*pool, capture_error_mode="thread_local")
                    try:
                        fill(static)
                    finally:
                        graph.capture_end()
            except Exception:  # a kernel that cannot be captured: eager from now on
                self.capturing = False
                return
            finally:
                current.wait_stream(self._stream)
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[key] = (graph, static)
