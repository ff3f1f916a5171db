"""``GradientWriter`` for PyTorch: per-layer statistics of each parameter's ``.grad``, for the Gradients tab.

It stores exactly what the TensorFlow writer stores (``docs/stored_format.md``,
through ``eventlog``), from the statistics' one definition (``rowstats``):
a PyTorch run and a TensorFlow run sit in one logdir and compare row by row.

Cost. The host never waits for the device. A step that is not written
(``every_n_steps > 1``) reduces the window's norms and non-finite flags on
the gradients' device in a fixed number of multi-tensor operators
(``step``, ``reductions.step_norms``; on a GPU one CUDA graph replay:
``graphs``) and reads nothing back. A written step computes every
statistic on the device and starts one copy of them to pinned host memory;
its rows and event are made once the copy is there, at a later call, or
at ``flush`` / ``close`` (``host``).

Where each piece lives: rows and units (``modules``), a step's
reductions (``step``, ``reductions``), a step in one launch (``graphs``), the copy to
the host and the written step's rows (``host``), what the optimizer did
(``optimizer``), several processes (``distributed``).
"""

import numbers

import torch

from tb_gradcheck.check.report import stored_checks
from tb_gradcheck.core import at_exit
from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import run_directory
from tb_gradcheck.core import validate
from tb_gradcheck.torch import activations as forward
from tb_gradcheck.torch import distributed
from tb_gradcheck.torch import host
from tb_gradcheck.torch import modules
from tb_gradcheck.torch import optimizer as optim  # the one alias: `optimizer` is the constructor's argument
from tb_gradcheck.torch import step

F64 = torch.float64


def _eager(method):
    """Runs ``method`` eagerly when a ``torch.compile``d training step calls it.

    Dynamo would otherwise trace into the writer's host side (NumPy, event
    files) and fail; disabled, the compiled step breaks its graph around
    the call, which is what a host-side logger needs: the gradients it reads
    are real tensors by then.
    """
    return torch.compiler.disable(method)


class GradientWriter:
    """Writes per-layer gradient statistics of a PyTorch model for the Gradients tab.

    Example:

        writer = tb_gradcheck.torch.GradientWriter("logs/run1", model)
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            writer.write(step)           # reads each parameter's .grad
            optimizer.step()
        writer.close()

    Create it before the model's first forward pass: its rows are the
    model's modules in the order they first run (``modules``). Call
    ``write`` once per optimizer step (after the last backward pass of
    gradient accumulation), before ``optimizer.step()`` and before the
    gradients are zeroed. Parameters without a gradient at a step have
    empty rows there.

    Args:
      logdir: Directory of the run (TensorBoard shows one run per
        directory), made if missing and checked here; where it goes is
        logged once (``core.run_directory``). Exactly one of ``logdir`` and ``writer``.
      model: The ``torch.nn.Module`` (or its ``DistributedDataParallel``,
        FSDP or ``torch.compile`` wrapper). Its parameters that require a
        gradient are the rows.
      writer: An open ``torch.utils.tensorboard.SummaryWriter`` to write
        through instead of ``logdir``; it stays yours (``close`` flushes it).
      every_n_steps: Int, default 1. Write every step, or every N steps
        (steps that are multiples of N), each write holding the last, mean,
        max, min and sum of the norm and NaN/Inf count over the steps since
        the previous write; max |g|, zeros, dead units and weights are
        taken at the write step.
      phase: Int, default 0: write the steps ``phase`` past a multiple of N
        (Lightning's callback passes N - 1: Lightning logs at N-1, 2N-1, ...).
      optimizer: Optional ``torch.optim.Optimizer`` that steps these
        parameters: records ``update_norm`` and ``update_to_weight`` at
        written steps, from its step hooks (``optimizer``).
      scaler: Optional ``torch.amp.GradScaler``: statistics of the unscaled
        gradients (also when ``scaler.unscale_`` was not called), the loss
        scale and the steps it refused.
      activations: Bool, default False: also statistics of each layer's
        forward output at written steps (``tb_gradcheck.torch.activations``),
        from forward hooks registered here: make the writer before ``torch.compile``.
    """

    def __init__(
        self,
        logdir=None,
        model=None,
        *,
        writer=None,
        every_n_steps=1,
        phase=0,
        optimizer=None,
        scaler=None,
        activations=False,
    ):
        validate.exactly_one(logdir=logdir, writer=writer)
        validate.instance(model, "model", torch.nn.Module, "a torch.nn.Module")
        self.every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        if validate.non_negative_int(phase, "phase") >= self.every_n_steps:
            raise ValueError(f"Expected `phase` below `every_n_steps` ({self.every_n_steps}). Received: {phase!r}")
        if optimizer is not None:
            validate.instance(optimizer, "optimizer", torch.optim.Optimizer, "a torch.optim.Optimizer")
        if scaler is not None and not hasattr(scaler, "is_enabled"):
            raise TypeError(f"Expected `scaler` to be a torch.amp.GradScaler. Received: {type(scaler).__name__}")
        sink = None
        if writer is not None:
            sink = getattr(writer, "file_writer", None)
            if sink is None or not hasattr(sink, "add_event"):
                raise TypeError(
                    "Expected `writer` to be an open torch.utils.tensorboard.SummaryWriter. "
                    f"Received: {type(writer).__name__}"
                )
        self._phase = int(phase)
        self._model = modules.unwrap(model)
        self._group = distributed.Group(self._model)
        if scaler is not None and self._group.sharded:
            raise ValueError(
                "Expected no `scaler` with sharded (FSDP2 / DTensor) parameters: the steps it refuses are not "
                "counted across shards yet. Received: a GradScaler and DTensor parameters"
            )
        self._forward = forward.recorder(self._model, self._group, activations)
        if logdir is not None and self._group.writes:
            logdir = run_directory.prepare(logdir, "logdir", "tb_gradcheck.torch.GradientWriter")
            run_directory.announce(logdir)
        # The run directory (the SummaryWriter's when writing through one).
        self.log_dir = logdir if writer is None else getattr(writer, "log_dir", None)
        self._log = eventlog.EventLog(logdir, sink=sink)
        self._order = modules.Order(self._model)
        self._rows = None  # modules.Parameters, at the first write
        self._reduce = step.StepReductions(self._group)
        self._graphs = self._reduce.graphs
        self._contents = {}  # layout key -> stats content
        self._last_key = None
        self._window = None  # the steps since the last write (every_n_steps > 1)
        self._flights = host.Flights(self._write_step)  # written steps on their way to the host
        self._columns = {}  # clipped or not -> the optimizer columns
        self._dense = None  # (False,) * parameters: no gradient is sparse
        # What the optimizer's hooks and clip share with this writer (optim.Link): the pending written step,
        # the rows no parameter group holds, the norms before clipping.
        self._link = optim.Link(self._group, self._reduce.constants, self._emit)
        self._follower = None if optimizer is None else optim.Follower(self._link, optimizer)
        self._scale = None if scaler is None else optim.ScaleReader(scaler, optimizer)
        self._unrecorded_warned = False
        at_exit.opened(self)

    # -- the training loop's calls ----------------------------------------------

    @_eager
    def write(self, step):
        """Records this step's gradients (each parameter's ``.grad``); every N steps writes them.

        Args:
          step: The training step, a Python int (or 0-d integer tensor) in 0..2**63-1.

        Raises:
          TypeError: ``step`` is not an integer.
          ValueError: A negative step, or a closed writer.
        """
        self._check_open("write")
        step = _step(step)
        self._link.called = True
        self._emit()
        before_clip = self._link.take_before_clip()
        if not self._group.computes:
            return
        rows = self._structure()
        present, where, tensors, sparse, coalesced = self._reduce.gather(rows.params, self._dense)
        key = (present, sparse, self._optimizer_columns(before_clip))
        self._last_key = key
        due = step % self.every_n_steps == self._phase
        device = tensors[0].device if tensors else self._group.local(rows.params[0]).device
        if self.every_n_steps > 1 and self._window is None:
            self._window = self._group.window(rows.structure, self._reduce.constants)
        n = len(rows.params)
        columns = self._reduce.norms(n, tensors, where, device, coalesced is None, self._window)  # [2, V]: norms, flags
        scale = None if self._scale is None else self._scale.read(device)
        if scale is not None:
            # The statistics of the gradients the optimizer applies: unscaled.
            columns[0].mul_(scale.inverse)
            self._scale.count(columns[1])
        if self._window is not None:
            self._window.add(present, step)
        next_due = (step + 1) % self.every_n_steps == self._phase
        outputs = self._forward.at_write(due, next_due, rows, device)  # {} or {"act": ...}
        if not due:
            return
        self._warn_unrecorded()
        pack = host.Pack()
        reduced = self._reduce.written(rows, tensors, where, device, coalesced)
        if scale is not None and "max_abs" in reduced:
            reduced["max_abs"] = reduced["max_abs"] * scale.inverse
        weight = reduced.pop("weight")
        reduced.update(outputs)
        for name, value in reduced.items():
            pack.add(name, value)
        pack.add("norm", columns[0])
        pack.add("weight", weight)
        steps = self._window.take(pack) if self._window is not None else None
        if before_clip is not None:
            pack.add("before_clip", before_clip)
        if scale is not None:
            pack.add("loss_scale", scale.value)
            pack.add("refused", self._scale.since_last_write())
        self._link.pending = host.Pending(step, key, pack, steps, where)
        if self._follower is not None and self._follower.expects_step():
            return  # written by the optimizer's step hook, with the update it made
        self._emit()

    @_eager
    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        """``torch.nn.utils.clip_grad_norm_`` over the model's parameters, recording the norms before clipping.

        One pass: the per-parameter norms that decide the clip are the ones
        recorded as ``grad_norm_before_clip`` at the next ``write``, with no
        host synchronisation. Call it where you would call PyTorch's, before
        ``write``.

        Args:
          max_norm: The largest total norm the gradients are clipped to.
          norm_type: The norm of the total (2.0 by default; the recorded
            per-parameter norms are always L2).
          error_if_nonfinite: As PyTorch's: raise if the total norm is NaN
            or Inf (this reads it on the host).
          foreach: As PyTorch's.

        Returns:
          The total norm of the gradients before clipping, a tensor.
        """
        self._check_open("clip_grad_norm_")
        self._structure()
        return optim.clip(self._link, float(max_norm), float(norm_type), error_if_nonfinite, foreach)

    @_eager
    def record_norm_before_clip(self):
        """Records each parameter's gradient norm now as the next ``write``'s ``grad_norm_before_clip``.

        For clipping done elsewhere (a trainer's): call it before that clip. The gradients are not changed.
        """
        self._check_open("record_norm_before_clip")
        self._structure()
        optim.keep_norms_before_clip(self._link)

    @_eager
    def write_check(self, report, step):
        """Records a gradient check report for the tab's ``check_error`` heatmap.

        Args:
          report: A ``tb_gradcheck.check.report.GradientCheckReport``.
          step: The training step.
        """
        self._check_open("write_check")
        stored = stored_checks(report)
        step = _step(step)
        if not self._group.writes:
            return
        for content, matrix in stored:
            self._log.tensor(content, matrix, step)

    @_eager
    def flush(self):
        """Writes a written step still waiting for its optimizer step, and flushes the event file."""
        if not self.closed:
            self._emit()
            self._flights.arrive(wait=len(self._flights))
            self._log.flush()

    @_eager
    def close(self):
        """Writes what is pending (and a partial window), flushes, and closes the file if this writer made it.

        Safe to call twice; ``write`` after ``close`` raises ValueError.
        """
        if self.closed:
            return
        try:
            self._emit()
            self._flights.arrive(wait=len(self._flights))
            if self._window is not None and self._window.steps and self._group.computes:
                self._write_partial_window()
        finally:
            self._link.closed = True
            at_exit.closed(self)
            if self._follower is not None:
                self._follower.detach()
            self._forward.remove()
            self._log.close()

    @property
    def closed(self):
        """Whether ``close`` has run."""
        return self._link.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- internals -----------------------------------------------------------------

    def _check_open(self, what):
        if self.closed:
            raise ValueError(f"Cannot {what}: this GradientWriter is closed. Create a new one to keep writing.")

    def _structure(self):
        if self._rows is None:
            self._rows = modules.parameters(self._model, self._order.freeze())
            if not self._rows.params:
                raise ValueError("Expected a model with parameters that require a gradient. Received: none")
            self._group.check(self._rows)
            self._dense = (False,) * len(self._rows.params)
            self._link.rows = self._rows
        return self._rows

    def _warn_unrecorded(self):
        """Warns once, at a written step, of parameters that need a gradient but are not rows (``modules``)."""
        if not self._unrecorded_warned:
            # The user's write(): past modules, this method, write() and torch.compiler.disable's wrapper.
            self._unrecorded_warned = modules.warn_unrecorded(self._model, self._rows.params, stacklevel=5)

    def _optimizer_columns(self, before_clip):
        """The optimizer columns a step has (made once for clipped steps and once for the others)."""
        clipped = before_clip is not None
        if clipped not in self._columns:
            columns = optim.columns(clipped, self._follower is not None, self._scale)
            self._columns[clipped] = columns + self._forward.columns
        return self._columns[clipped]

    def _content(self, key):
        # The optimizer's groups as last seen (the follower checks them before
        # the step's event is written): a change makes a new layout.
        key = (key, self._link.outside, self._link.not_cleared)
        content = self._contents.get(key)
        if content is None:
            (_, sparse, columns), outside, not_cleared = key
            layers, variables = self._rows.structure.blocks(sparse, outside)
            aggregates = metadata.SINGLE_STEP_AGGREGATES if self.every_n_steps == 1 else metadata.AGGREGATES
            content = metadata.stats_layout(layers, variables, aggregates, self.every_n_steps, columns, not_cleared)
            self._contents[key] = content
        return content

    def _emit(self):
        """Starts the copy of the pending written step, if any, and writes the steps whose copy has arrived."""
        pending, self._link.pending = self._link.pending, None
        if pending is not None:
            copy = self._group.send(pending.pack, pending.key[0], pending.where, self._flights.buffers)
            if copy is not None:  # None: a rank that takes part in the all-reduce but does not write
                self._flights.add(pending, copy)
        self._flights.arrive()

    def _write_step(self, pending, values):
        """Writes one written step's event from its values on the host (``host.Flights`` calls it)."""
        window = self._window if self.every_n_steps > 1 else None
        layer, variable = host.step_slabs(pending, values, self._rows.structure, window)
        self._log.stats(self._content(pending.key), layer, variable, pending.step)

    def _write_partial_window(self):
        """At close: the steps since the last write, as one window written at the last of them (``host``)."""
        device = self._group.local(self._rows.params[0]).device
        written = host.partial_window(self._window, self._group, self._rows, self._last_key, device)
        if written is not None:
            step, layer, variable = written
            self._log.stats(self._content(self._last_key), layer, variable, step)


def _step(value):
    """``value`` as an int in 0..2**63-1: a Python int, or a 0-d integer tensor (read once, here)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(
                f"Expected `step` to be an integer. Received: a {value.dtype} tensor of shape {tuple(value.shape)}"
            )
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Expected `step` to be an integer. Received: {value!r} of type {type(value).__name__}")
    return validate.non_negative_int(value, "step")
