"""The host side of the JAX writer: what a ``monitor`` holds in its optax state -> the Gradients tab's events.

``GradientWriter.write(opt_state, step)`` finds every ``MonitorState`` in the
state it is given (anywhere in an ``optax.chain``, a wrapped optimizer, an
``nnx.Optimizer``), and at a written step reads its held reductions from the
device (one small transfer: a few numbers per parameter) and writes them
through ``eventlog.EventLog``, with the statistics' definitions of
``rowstats``. At other steps it reads nothing: the call is a modulo.

What it writes is the stored format of every writer
(``docs/stored_format.md``); rows are the monitor's ``layout``.
"""

import numbers
import warnings

import jax
import numpy as np

from tb_gradcheck.core import at_exit
from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.core import run_directory
from tb_gradcheck.core import running
from tb_gradcheck.core import validate
from tb_gradcheck.jax.transform import Held
from tb_gradcheck.jax.transform import MonitorState

UPDATE_COLUMNS = ("update_norm", "update_to_weight")


class GradientWriter:
    """Writes what ``tb_gradcheck.jax.monitor`` took inside the jitted step, for the Gradients tab.

    Example (Flax NNX):

        optimizer = nnx.Optimizer(model, tb_gradcheck.jax.monitor(optax.adamw(1e-3), every_n_steps=10), wrt=nnx.Param)
        writer = tb_gradcheck.jax.GradientWriter("logs/run1")
        for step, batch in enumerate(batches):
            train_step(model, optimizer, batch)  # an nnx.jit function calling optimizer.update
            writer.write(optimizer, step)
        writer.close()

    Args:
      logdir: Directory of the run (TensorBoard shows one run per
        directory), made if missing and checked here; where it goes is
        logged once (``core.run_directory``). Exactly one of ``logdir`` and ``sink``.
      sink: Instead, an object with ``add_event(event)`` and ``flush()``
        (an ``EventFileWriter``, or ``clu``'s or ``tensorboardX``'s file
        writer) to write through; ``close`` flushes it but leaves it open.
    """

    def __init__(self, logdir=None, *, sink=None):
        validate.exactly_one(logdir=logdir, sink=sink)
        if sink is not None and not (hasattr(sink, "add_event") and hasattr(sink, "flush")):
            raise TypeError(f"Expected `sink` to have add_event(event) and flush(). Received: {type(sink).__name__}")
        if logdir is not None:
            logdir = run_directory.prepare(logdir, "logdir", "tb_gradcheck.jax.GradientWriter")
            run_directory.announce(logdir)
        # The run directory (None when writing through a sink).
        self.log_dir = logdir
        self._log = eventlog.EventLog(logdir, sink=sink)
        self._contents = {}  # Layout -> the stats layout content
        self._periods = {}  # tree structure -> the every_n_steps of the monitors in it
        self._latest = {}  # tree structure -> (optax state, step): the newest seen, for partial windows at close
        at_exit.opened(self)

    def write(self, opt_state, step):
        """Writes the step's statistics if it is a written step (``step % every_n_steps == 0``); else does nothing.

        Call it after every training step, with the state the step returned
        and the step's index: the monitor's own count of updates, from 0
        (``optax``'s counting, Flax's ``TrainState.step`` and
        ``nnx.Optimizer.step`` before the update). At a written step it
        waits for the step to finish and reads a few numbers per parameter.

        Args:
          opt_state: The optax state holding one or more monitors (a
            ``MonitorState`` anywhere inside it), or an ``nnx.Optimizer``.
          step: The step's index, a Python int: a device array would have
            to be read, which waits for the step.

        Raises:
          TypeError: ``step`` is not an int.
          ValueError: No monitor in ``opt_state``; a monitor whose step
            counter is not a scalar (a pmap-replicated state: pass one
            replica); a written step whose monitor counted another step; a
            closed writer.
        """
        self._check_open()
        step = _step(step)
        tree = getattr(opt_state, "opt_state", opt_state)
        # Between writes: the tree's structure (one C++ walk, no Python per
        # node) says which monitors it holds; the state is kept for close().
        structure = jax.tree_util.tree_structure(tree)
        periods = self._periods.get(structure)
        if periods is not None and all(step % n for n in periods):
            self._latest[structure] = (tree, step)
            return
        states = find_states(tree)
        for state in states:
            # Here, not only where a written step reads it: a state refused
            # now is not kept for close() to trip on.
            _check_scalar_count(jax.tree_util.tree_leaves(state)[0])
        if periods is None and _guards(tree):
            warnings.warn(f"tb_gradcheck: {_INSIDE_APPLY_IF_FINITE}", stacklevel=2)
        self._periods[structure] = {state.layout.every_n_steps for state in states}
        self._latest[structure] = (tree, step)
        for state in states:
            lay = state.layout
            if step % lay.every_n_steps:
                continue
            count, held = fetch(state)
            if int(held.step) != step or int(count) != step + 1:
                guard = _guards(tree).get(id(state))
                hint = ""
                if guard is not None:
                    skipped = int(np.asarray(jax.device_get(guard.total_notfinite)).ravel()[0])
                    hint = f"; {skipped} steps skipped so far: {_INSIDE_APPLY_IF_FINITE}"
                raise ValueError(
                    "Expected `step` to be the index of the update just made, counted from 0 as the monitor "
                    f"counts its updates (it writes when that index is a multiple of every_n_steps; the last "
                    f"update it made was number {int(count) - 1}{hint}). Received: step={step}"
                )
            self._write(lay, held, step)

    def write_check(self, report, step):
        """Records a gradient check report for the tab's ``check_error`` heatmap (``GradientWriter.write_check``'s format)."""
        from tb_gradcheck.check.report import stored_checks

        self._check_open()
        stored = stored_checks(report)
        step = _step(step)
        for content, matrix in stored:
            self._log.tensor(content, matrix, step)

    def flush(self):
        self._log.flush()

    def close(self, params=None):
        """Writes each monitor's partial window (the steps since its last write), flushes, closes. Safe twice.

        Args:
          params: The parameters after the last step (the pytree the
            monitor was initialised with), or None. Given, the partial
            window's ``weight_norm`` is theirs, as the TensorFlow and PyTorch
            writers store it; else MISSING (with a warning when ``params``
            are another pytree's).
        """
        if self._log.closed:
            return
        leaves = None if params is None else jax.tree_util.tree_leaves(params)
        try:
            for tree, step in list(self._latest.values()):
                for state in find_states(tree):
                    if step % state.layout.every_n_steps:
                        weights = None if leaves is None else _row_norms(state.layout, leaves)
                        if leaves is not None and weights is None:
                            warnings.warn(
                                "tb_gradcheck: the last window's weight_norm is MISSING: `close(params)` was given "
                                f"a pytree of {len(leaves)} leaves, not the {len(set(state.layout.order))} the "
                                "monitor was initialised with (a monitor inside optax.masked or multi_transform "
                                "sees only its part of the model).",
                                stacklevel=2,
                            )
                        self._write_partial(state.layout, state, step, weights)
        finally:
            self._latest.clear()
            self._log.close()
            at_exit.closed(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _check_open(self):
        if self._log.closed:
            raise ValueError("Cannot write: this GradientWriter is closed. Create a new one to keep writing.")

    def _content(self, lay):
        content = self._contents.get(lay)
        if content is None:
            layers, variables = lay.structure.blocks()
            window = lay.every_n_steps
            aggregates = metadata.SINGLE_STEP_AGGREGATES if window == 1 else metadata.AGGREGATES
            content = metadata.stats_layout(
                layers, variables, aggregates, window, UPDATE_COLUMNS if lay.updates else ()
            )
            self._contents[lay] = content
        return content

    def _write(self, lay, held, step):
        s = lay.structure
        # A norm of -1: the row had no gradient (``transform.advance``); NaN is a gradient's.
        present = ~(held.norm < 0)
        reductions = rowstats.Reductions(
            present=present,
            norm=held.norm[present],
            nonfinite=held.nonfinite[present],
            max_abs=held.max_abs[present],
            nonzero=held.nonzero[present],
            dead=held.dead[np.repeat(present, np.asarray(lay.units, int))],
        )
        weights = held.weight if np.all(held.weight >= 0) else None
        windowed = lay.every_n_steps > 1
        layer, variable = rowstats.rows(reductions, s, weights, onset=windowed)
        slabs = np.concatenate([layer, variable])[None]
        if windowed:
            window = running.to_numpy(held.window, np.asarray, _window_steps(held.window, step))
            slabs = rowstats.window_slabs(window, step, _both(weights, s), last=slabs[0])
        if lay.updates:
            update = held.update if np.all(held.update >= 0) else None
            slabs = rowstats.with_last_columns(slabs, rowstats.optimizer_rows(UPDATE_COLUMNS, s, update, weights))
        self._stats(lay, slabs, step)

    def _write_partial(self, lay, state, step, weights=None):
        """The window under way at close: its reduced columns, MISSING where the write step's full statistics would be."""
        try:
            window = fetch(state, held=False)
        except RuntimeError as e:  # its buffers were donated to a later step and deleted
            warnings.warn(
                f"tb_gradcheck: the last window (to step {step}) could not be read, so is not written: {e}",
                stacklevel=3,
            )
            return
        if float(window.steps) == 0:
            return
        window = running.to_numpy(window, np.asarray, _window_steps(window, step))
        slabs = rowstats.window_slabs(window, step, _both(weights, lay.structure))
        if lay.updates:
            slabs = rowstats.with_last_columns(slabs, np.full((slabs.shape[1], len(UPDATE_COLUMNS)), rowstats.MISSING))
        self._stats(lay, slabs, step)

    def _stats(self, lay, slabs, step):
        n_layers = len(lay.structure.layer_names)
        self._log.stats(self._content(lay), slabs[:, :n_layers], slabs[:, n_layers:], step)


# A monitor inside ``optax.apply_if_finite`` never records a step that it skips: apply_if_finite puts
# the inner state, the monitor's with it, back as it was, so the NaN is lost and the monitor's count
# falls one behind the step at each one.
_INSIDE_APPLY_IF_FINITE = (
    "a monitor inside optax.apply_if_finite does not see the steps it skips (a non-finite gradient is put "
    "back with its state: the NaN is not recorded) and its count of updates falls behind the training step "
    "at the first one. Wrap it in the monitor instead, which records every step, NaN included: "
    "tb_gradcheck.jax.monitor(optax.apply_if_finite(optimizer, max_consecutive_errors))."
)


def _guards(tree):
    """``{id(MonitorState): the ApplyIfFiniteState around it}`` for each monitor inside an ``optax.apply_if_finite``."""
    import optax

    out = {}
    kinds = (MonitorState, optax.ApplyIfFiniteState)
    for node in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, kinds)):
        if isinstance(node, optax.ApplyIfFiniteState):
            for state in jax.tree_util.tree_leaves(node.inner_state, is_leaf=lambda x: isinstance(x, MonitorState)):
                if isinstance(state, MonitorState):
                    out[id(state)] = node
    return out


def find_states(opt_state):
    """Every ``MonitorState`` in ``opt_state`` (an optax state, or an object with ``opt_state``), in tree order."""
    tree = getattr(opt_state, "opt_state", opt_state)
    nodes = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, MonitorState))
    states = [x for x in nodes if isinstance(x, MonitorState)]
    if not states:
        raise ValueError(
            "Expected an optax state with a tb_gradcheck.jax.monitor in its transformation "
            "(optax.chain(tb_gradcheck.jax.monitor(), ...) or tb_gradcheck.jax.monitor(optimizer)). "
            f"Received: {type(opt_state).__name__} without one"
        )
    return states


def fetch(state, held=True):
    """``(count, Held)``: a monitor's count and held reductions; or with ``held=False`` its window under way; as NumPy.

    Reads the state's leaves whatever wraps them (``nnx.Optimizer`` keeps
    each array in a Variable, which flattens to the array): the count, the
    held step's leaves and the window's come first in its flattening.

    Raises:
      ValueError: The count is not a scalar (a pmap-replicated state).
    """
    windowed = state.layout.every_n_steps > 1
    window = running.State(*[0] * len(running.State._fields)) if windowed else None
    template = (0, Held(*[0] * (len(Held._fields) - 1), window=window), window)
    treedef = jax.tree_util.tree_structure(template)
    leaves = jax.tree_util.tree_leaves(state)[: treedef.num_leaves]
    _check_scalar_count(leaves[0])
    start, stop = (0, 1 + treedef.children()[1].num_leaves) if held else (treedef.num_leaves - len(window), None)
    values = [np.asarray(x) for x in jax.device_get(leaves[start:stop])]
    if held:
        return values[0], jax.tree_util.tree_unflatten(treedef.children()[1], values[1:])
    return running.State(*values)


def _check_scalar_count(count):
    """Refuses a state with a counter per device: its reductions would be read as one model's."""
    shape = np.shape(count)  # the array's shape, read without a transfer
    if not shape:
        return
    hint = (
        ": a pmap-replicated state (a leading device axis). Pass one replica, jax.tree.map(lambda x: x[0], state), "
        "or replicate with jax.jit and jax.sharding instead of pmap"
        if len(shape) == 1
        else ""
    )
    raise ValueError(
        "Expected an optax state whose monitor's step counter is a scalar (one state for the whole model). "
        f"Received: a counter of shape {shape}{hint}"
    )


def _window_steps(window, step):
    """The training steps a window's state covers: the ``steps`` consecutive ones ending at ``step``."""
    count = int(round(float(window.steps)))
    return range(step - count + 1, step + 1)


def _both(per_variable, s):
    """float64 ``[L + V]``: layer norms then the per-variable ones, or None."""
    if per_variable is None:
        return None
    return np.concatenate([rowstats.combine_norms(per_variable, s), per_variable])


def _row_norms(lay, leaves):
    """Per row of ``lay``, the float64 norm of its part of ``leaves`` (a stacked leaf's slice), or None.

    None (the partial window's ``weight_norm`` MISSING) when ``leaves`` are
    not the monitored pytree's: another count of leaves, or a row's shape
    that is not its leaf's. A leaf stacked for ``lax.scan`` is several rows
    (``layout.stacks``): each row's norm is its own slice's, as at a written step.
    """
    if len(leaves) != len(set(lay.order)):
        return None
    stacks = lay.stacks or ((),) * len(lay.order)
    slices = lay.slices or (0,) * len(lay.order)
    norms = []
    for leaf, dims, flat, shape in zip(lay.order, stacks, slices, lay.shapes):
        value = np.asarray(jax.device_get(leaves[leaf]), np.float64)
        if tuple(value.shape) != tuple(dims) + tuple(shape):
            return None
        # The stacked axes flattened in row-major order: ``flat`` is the slice's index there (``stacks.expand``).
        norms.append(float(np.linalg.norm(value.reshape((-1, *shape))[flat].ravel())))
    return np.array(norms)


def _step(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            "Expected `step` to be a Python int (a device array would have to be read, waiting for the step). "
            f"Received: {type(value).__name__}"
        )
    return validate.non_negative_int(value, "step")
