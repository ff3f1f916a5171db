"""``tb_gradcheck.transformers.GradientCallback``: the gradient each Hugging Face ``Trainer`` step applies, in its run.

    trainer = transformers.Trainer(
        model, args, train_dataset=data, callbacks=[tb_gradcheck.transformers.GradientCallback()]
    )
    trainer.train()

Where the gradient is taken. At each optimizer step the ``Trainer`` (its
inner training loop) has run the last micro-batch's backward (the
gradients summed over ``gradient_accumulation_steps`` and, under DDP,
all-reduced), clipped them to ``max_grad_norm`` (``accelerator.clip_grad_norm_``,
which unscales an fp16 ``GradScaler``'s gradients first), and then calls
``on_pre_optimizer_step`` and ``optimizer.step()``. The callback writes at
``on_pre_optimizer_step``: the gradient the optimizer applies. The writer
follows the optimizer ``accelerate`` wraps (its ``.optimizer``), so each
step's update is recorded, and a ``GradScaler``'s scale and refused steps.

The norm before clipping is not recorded per layer: no callback runs
between the backward pass and the clip, and a callback does not see the
``Trainer`` to hook its clip. The ``Trainer`` logs the total norm before
clipping as its own ``train/grad_norm`` scalar, in the same run at the same
step.

Steps: ``state.global_step`` once this step is done (``state.global_step +
1`` at ``on_pre_optimizer_step``), the step the ``Trainer`` logs the step's
``loss`` and ``grad_norm`` at.

The run is the one ``transformers``' ``TensorBoardCallback`` writes its
scalars to (``report_to="tensorboard"``): ``$TENSORBOARD_LOGGING_DIR`` as it
was when the ``Trainer`` was built (the TensorBoardCallback reads it then;
changed before ``train()``, a warning names both directories and the
gradients follow the scalars), or ``output_dir/runs/<date>_<host>``, which
it names when training begins. A callback added after the ``Trainer`` was
built (``trainer.add_callback``) does not see it built, and reads the
variable at ``train()``.
"""

import os
import socket
import time
import warnings

import torch
import transformers

from tb_gradcheck.core import run_directory
from tb_gradcheck.core import validate
from tb_gradcheck.torch.writer import GradientWriter


def _logging_dir():
    """``$TENSORBOARD_LOGGING_DIR``, ``~`` expanded, as the TensorBoardCallback reads it; None when unset."""
    env = os.getenv("TENSORBOARD_LOGGING_DIR", None)
    return None if env is None else os.path.expanduser(env)


class GradientCallback(transformers.TrainerCallback):
    """A ``transformers.TrainerCallback`` that writes per-layer gradient statistics for the Gradients tab.

    Rank 0 writes (DDP through ``accelerate``: every rank holds the
    all-reduced gradient).

    Args:
      every_n_steps: Int, default 1: write every N optimizer steps
        (``GradientWriter``'s windows between writes).
      log_dir: Optional run directory instead of the ``TensorBoardCallback``'s.
      activations: Bool, default False: also statistics of each layer's
        forward output at written steps (``tb_gradcheck.torch.activations``;
        evaluation passes are not counted). The hooks are registered at
        ``train()``'s start: with ``torch_compile=True`` the compiled model does not run them.

    Attributes:
      writer: The ``tb_gradcheck.torch.GradientWriter`` during ``train()``,
        else None: ``callback.writer.write_check(report, state.global_step + 1)``
        at ``on_pre_optimizer_step`` writes a gradient check into the run.
      log_dir: The run directory of the last ``train()``.
    """

    def __init__(self, every_n_steps=1, log_dir=None, activations=False):
        self.every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        if not isinstance(activations, bool):
            raise TypeError(f"Expected `activations` to be a bool. Received: {activations!r}")
        self.activations = activations
        self._log_dir = validate.optional_path(log_dir, "log_dir")
        if self._log_dir is not None:
            self._log_dir = run_directory.prepare(
                self._log_dir, "log_dir", "tb_gradcheck.transformers.GradientCallback"
            )
        self.log_dir = None
        self.writer = None
        self._since = None  # when the Trainer was made: its TensorBoardCallback's run is newer
        self._built_env = None  # $TENSORBOARD_LOGGING_DIR when the Trainer was made

    def on_init_end(self, args, state, control, **kwargs):
        # The TensorBoardCallback reads $TENSORBOARD_LOGGING_DIR when it is
        # made, with the Trainer: the run is fixed then, and read here then.
        self._since = time.time()
        self._built_env = _logging_dir()

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._close()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Expected the Trainer's model to be a torch.nn.Module. Received: {type(model).__name__}")
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
        if not isinstance(inner, torch.optim.Optimizer):
            warnings.warn(
                f"tb_gradcheck: update_norm is not recorded: the Trainer's optimizer is a {type(inner).__name__}, "
                "not a torch.optim.Optimizer whose step hooks the writer follows.",
                stacklevel=2,
            )
            inner = None
        self.log_dir = self._run_dir(args, state) if state.is_world_process_zero else args.output_dir
        self.writer = GradientWriter(
            self.log_dir,
            model,
            every_n_steps=self.every_n_steps,
            optimizer=inner,
            scaler=getattr(optimizer, "scaler", None),
            activations=self.activations,
        )

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.writer is not None:
            self.writer.write(state.global_step + 1)

    def on_train_end(self, args, state, control, **kwargs):
        self._close()

    def _close(self):
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()

    def _run_dir(self, args, state):
        """The TensorBoardCallback's run: ``log_dir=``, ``$TENSORBOARD_LOGGING_DIR`` as the Trainer was built, or ``output_dir/runs/<date>_<host>``."""
        if self._log_dir is not None:
            return os.fspath(self._log_dir)
        # As transformers.integrations.TensorBoardCallback resolves it at on_train_begin.
        trial = state.trial_name if state.is_hyper_param_search else None
        env = _logging_dir()
        report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
        reports = bool({"tensorboard", "all"} & set(report_to or ()))
        if reports and self._since is not None:  # made with the Trainer: its run is the one named then
            if env != self._built_env:
                warnings.warn(
                    f"tb_gradcheck: TENSORBOARD_LOGGING_DIR was {self._built_env!r} when the Trainer was built and is "
                    f"{env!r} at train(). The Trainer's TensorBoardCallback read it when it was built, so its "
                    "scalars, and the gradients with them, go to the run named then; set it before building the "
                    "Trainer.",
                    stacklevel=3,
                )
            env = self._built_env
        if env is not None and trial is None:
            return env
        from transformers.integrations import integration_utils

        if not reports:
            where = os.path.join(args.output_dir, integration_utils.default_logdir())
            warnings.warn(
                f"tb_gradcheck: the Trainer writes no TensorBoard scalars (report_to={args.report_to!r}); the "
                f"Gradients tab's run is written to {where}. Add report_to='tensorboard' to see the Trainer's "
                "scalars in the same run, or pass GradientCallback(log_dir=...).",
                stacklevel=3,
            )
            return where
        made = self._newest_run(os.path.join(args.output_dir, "runs"))
        if made is None:  # the TensorBoardCallback runs after this one: it names its run now too, to the second
            made = os.path.join(args.output_dir, integration_utils.default_logdir())
        return made if trial is None else os.path.join(made, trial)

    def _newest_run(self, runs):
        """The run directory ``<date>_<host>`` under ``runs`` made since the Trainer was, or None.

        The TensorBoardCallback (a default callback: it runs before the
        user's) names its run from the clock at ``on_train_begin`` and makes
        it then; reading it back rather than naming it again is exact also
        when a second ticked over in between.
        """
        try:
            entries = list(os.scandir(runs))
        except OSError:
            return None
        host = "_" + socket.gethostname()
        since = (self._since or time.time()) - 1.0  # mtimes of coarse filesystems
        fresh = [e for e in entries if e.is_dir() and e.name.endswith(host) and e.stat().st_mtime >= since]
        if not fresh:
            return None
        return max(fresh, key=lambda e: e.stat().st_mtime).path
