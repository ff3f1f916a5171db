"""A step's reductions in one launch on a GPU: CUDA graphs keyed by the gradients' addresses.

Why. A step between writes computes two per-parameter columns
(``reductions.step_norms``): a handful of multi-tensor kernels whatever the
number of parameters, and their Python (grouping the tensors, one host
tensor per parameter from the fused norm). On a GPU such a step is bound
by the host's launches (5-10 us each); a CUDA graph of that work replays it
in one launch. A written step's other reductions
(``reductions.extras`` and the weight norms) are a second kind of graph,
keyed by the weights' addresses too.

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

Memory. The graphs' temporaries (a written step's copy of |g|: about the
gradients' bytes) stay reserved in their memory pool while the writer lives; the graphs share one pool (they never
run at once, and their outputs live outside it). So graphs are used only
for gradients under ``MAX_BYTES`` in all: for a bigger model a step takes
long enough that a dozen launches are negligible against it. At most
``MAX_GRAPHS`` are captured per writer; other keys then run eagerly. If a
capture raises, none is tried again (eager from then on, silently).
"""

import functools

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
        self._graphs = {}  # (kind, key) -> (torch.cuda.CUDAGraph, its outputs)
        self._last = {}  # kind -> the key of its previous call
        self._stopped = set()  # kinds no longer captured
        self._pool = None  # one memory pool for every graph: they never run at once
        self._stream = None
        self.capturing = True  # False: no more captures of any kind
        self.replays = 0

    def run(self, key, tensors, fill, out):
        """``fill(out)``, the step's values written into ``out``: from this key's graph, or eagerly.

        Args:
          key: The step's ``key``.
          tensors: The tensors ``fill`` reads (dense, on ``out``'s GPU).
          fill: Writes the step's values into the tensor it is given and
            returns it, with no host synchronisation (it is what a graph
            captures).
          out: Where the step's values go.

        Returns:
          ``out``.
        """
        make = functools.partial(_fill_new, fill, out)
        static = self.outputs("step", key, tensors, make)
        if static is None:
            return fill(out)
        return out.copy_(static)

    def outputs(self, kind, key, tensors, compute):
        """The outputs of this key's graph, replayed; None when there is none (the caller runs eagerly).

        A graph's outputs are the same tensors at every replay: their
        values hold until the next replay of that graph, and the caller
        reads or copies them before (the writer sends a written step's
        values before it computes the next step).

        Args:
          kind: What is computed (``"step"``, ``"written"``): each kind has
            its own graphs, at most ``MAX_GRAPHS``.
          key: The call's ``key`` (for its kind).
          tensors: The tensors ``compute`` reads (dense, on one GPU).
          compute: Returns the step's values (a tensor or a dict of them)
            with no host synchronisation; captured once ``key`` is seen at
            two consecutive calls.
        """
        held = self._graphs.get((kind, key))
        if held is not None:
            graph, static = held
            graph.replay()
            self.replays += 1
            return static
        if self.capturing and kind not in self._stopped and key == self._last.get(kind):
            self._capture(kind, key, tensors, compute)
        self._last[kind] = key
        return None

    def _capture(self, kind, key, tensors, compute):
        if sum(k == kind for k, _ in self._graphs) >= MAX_GRAPHS:
            self._stopped.add(kind)
            return
        if torch.cuda.get_sync_debug_mode():
            return  # asked to hear of every wait: capture later
        device = tensors[0].device if tensors else None
        size = sum(t.numel() * t.element_size() for t in tensors)
        if device is None or size > MAX_BYTES or any(t.device != device or not t.is_contiguous() for t in tensors):
            self._stopped.add(kind)
            return
        with torch.cuda.device(device):
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
                        static = compute()
                    finally:
                        graph.capture_end()
            except Exception:  # a kernel that cannot be captured: this kind eager from now on
                self._stopped.add(kind)
                return
            finally:
                current.wait_stream(self._stream)
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[kind, key] = (graph, static)


def _fill_new(fill, like):
    return fill(torch.empty(like.shape, dtype=like.dtype, device=like.device))
