"""``tb_gradcheck.lightning.GradientCallback``: the gradient each Lightning optimizer step applies, in the logger's run.

    trainer = lightning.pytorch.Trainer(
        logger=lightning.pytorch.loggers.TensorBoardLogger("logs"),
        callbacks=[tb_gradcheck.lightning.GradientCallback()],
        accumulate_grad_batches=2, gradient_clip_val=1.0, precision="bf16-mixed",
    )
    trainer.fit(model, loader)

Where the gradient is taken. Lightning's precision plugin steps an
optimizer as ``optimizer.step(closure)``, and the closure runs the
training step and ``backward`` inside the step; after the closure (and,
under ``16-mixed``, after ``GradScaler.unscale_``) the plugin's
``_after_closure`` calls the ``on_before_optimizer_step`` hooks, then
``configure_gradient_clipping``. The callback records:

- ``grad_norm_before_clip``: at ``on_before_optimizer_step`` (accumulated,
  all-reduced, unscaled, not yet clipped), when the module clips
  (``gradient_clip_val`` set, or ``configure_gradient_clipping``
  overridden).
- every other statistic: right after ``_after_closure`` returns (the
  callback wraps the plugin's method for the fit), i.e. the gradient the
  optimizer applies: after accumulation, unscaling and clipping. A step the
  ``GradScaler`` refuses is recorded too (update 0).
- ``update_norm``: the writer's optimizer hooks around the step. Its step
  pre-hook must run after the closure, so a ``ClosureFirst``
  pre-hook runs the closure first (``tb_gradcheck.torch.closure`` says
  when that is the step's own order); with another optimizer the update is
  not recorded.

Steps are ``trainer.global_step`` during the step: the step Lightning logs
that batch's ``self.log(..., on_step=True)`` scalars at. Lightning logs at
the steps ``k`` with ``(k + 1) % log_every_n_steps == 0`` (9, 19, ... for 10),
so with ``every_n_steps=N`` each window ends at such a step too (N - 1,
2N - 1, ...: the writer's ``phase``), and the gradient rows and the scalars
share their steps wherever one count is a multiple of the other (a warning
says so where neither is).
"""

import importlib
import math
import os
import warnings

from tb_gradcheck.core import run_directory
from tb_gradcheck.core import validate
from tb_gradcheck.torch import closure
from tb_gradcheck.torch.writer import GradientWriter


class _Recorder:
    """``GradientCallback``'s body, on either Lightning package (``_PACKAGE`` is set by each class)."""

    _PACKAGE = None

    def __init__(self, every_n_steps=1, log_dir=None, activations=False):
        super().__init__()
        self.every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        if not isinstance(activations, bool):
            raise TypeError(f"Expected `activations` to be a bool. Received: {activations!r}")
        self.activations = activations
        self._log_dir = validate.optional_path(log_dir, "log_dir")
        if self._log_dir is not None:
            self._log_dir = run_directory.prepare(self._log_dir, "log_dir", "tb_gradcheck.lightning.GradientCallback")
        self.log_dir = None  # the run written to, from the fit's start
        self.writer = None
        self._trainer = None
        self._optimizer = None
        self._clips = False
        self._closure_first = None
        self._plugin = None
        self._plugin_had = None  # an _after_closure instance attribute set before ours, put back after the fit

    # -- Lightning's hooks --------------------------------------------------------------

    def on_fit_start(self, trainer, pl_module):
        self._detach()
        if len(trainer.optimizers) != 1:
            raise ValueError(
                "Expected a LightningModule with one optimizer (configure_optimizers). "
                f"Received: {len(trainer.optimizers)} optimizers"
            )
        optimizer = trainer.optimizers[0]
        plugin = trainer.precision_plugin
        if not callable(getattr(plugin, "_after_closure", None)):
            raise TypeError(
                "Expected a precision plugin that runs `_after_closure` before the optimizer step (Lightning "
                f"2.x's Precision and its subclasses). Received: {type(plugin).__name__}"
            )
        self.log_dir = self._run_dir(trainer)
        follows = closure.calls_closure_once(optimizer)
        if follows:
            # Before the writer's step hooks: the closure (backward, clipping, this callback's write) runs first.
            self._closure_first = closure.ClosureFirst(optimizer)
        else:
            warnings.warn(
                f"tb_gradcheck: update_norm is not recorded for a {type(optimizer).__qualname__}: its step may call "
                "the closure more than once (only torch.optim's optimizers other than LBFGS are followed).",
                stacklevel=2,
            )
        if trainer.is_global_zero and not run_directory.announced(self.log_dir):
            # Said through Lightning's own logger, where it says where its scalars go.
            rank_zero = importlib.import_module(self._PACKAGE.__name__ + ".utilities.rank_zero")
            rank_zero.rank_zero_info(run_directory.message(self.log_dir))
        self._warn_unshared_steps(trainer.log_every_n_steps)
        self.writer = GradientWriter(
            self.log_dir,
            pl_module,
            every_n_steps=self.every_n_steps,
            # Windows end where Lightning logs: at steps k with (k + 1) % log_every_n_steps == 0.
            phase=self.every_n_steps - 1,
            optimizer=optimizer if follows else None,
            scaler=getattr(plugin, "scaler", None),
            activations=self.activations,
        )
        self._trainer, self._optimizer = trainer, optimizer
        module_class = self._PACKAGE.LightningModule
        overridden = importlib.import_module(self._PACKAGE.__name__ + ".utilities.model_helpers").is_overridden
        self._clips = bool(pl_module.automatic_optimization) and (
            bool(trainer.gradient_clip_val) or overridden("configure_gradient_clipping", pl_module, module_class)
        )
        self._plugin = plugin
        self._plugin_had = plugin.__dict__.get("_after_closure")
        after_closure = plugin._after_closure

        def recorded_after_closure(model, optimizer):
            out = after_closure(model, optimizer)
            self._write(optimizer)
            return out

        plugin._after_closure = recorded_after_closure

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self._clips and self.writer is not None and optimizer is self._optimizer:
            self.writer.record_norm_before_clip()

    def on_fit_end(self, trainer, pl_module):
        self._detach()

    def on_exception(self, trainer, pl_module, exception):
        self._detach()  # what was recorded is written; the plugin and the optimizer are Lightning's again

    def teardown(self, trainer, pl_module, stage):
        self._detach()

    # -- for manual optimization ---------------------------------------------------------

    def record_norm_before_clip(self):
        """Records the gradients' norms now as the next step's ``grad_norm_before_clip`` (manual optimization).

        Call it in ``training_step`` after ``manual_backward`` and before
        ``self.clip_gradients(...)``; the step's other statistics are taken
        at ``optimizer.step()``, after that clipping.
        """
        if self.writer is None:
            raise ValueError("Cannot record: the callback records during trainer.fit only.")
        self.writer.record_norm_before_clip()

    # -- internals -----------------------------------------------------------------------

    def _write(self, optimizer):
        if self.writer is not None and optimizer is self._optimizer:
            self.writer.write(self._trainer.global_step)

    def _warn_unshared_steps(self, log_every):
        """Warns where the windows and Lightning's logged steps seldom meet: neither count divides the other."""
        n = self.every_n_steps
        if n > 1 and log_every and n % log_every and log_every % n:
            warnings.warn(
                f"tb_gradcheck: every_n_steps={n} and the Trainer's log_every_n_steps={log_every}: the gradient "
                f"windows end at steps {n - 1}, {2 * n - 1}, ... and Lightning logs at {log_every - 1}, "
                f"{2 * log_every - 1}, ...; they share only every {math.lcm(n, log_every)}th step. Make one a "
                "multiple of the other.",
                stacklevel=3,
            )

    def _run_dir(self, trainer):
        """The run directory: ``log_dir=``, else the TensorBoardLogger's ``log_dir`` (Lightning's scalars' run)."""
        if self._log_dir is not None:
            return os.fspath(self._log_dir)
        tensorboard = self._PACKAGE.loggers.TensorBoardLogger
        for logger in trainer.loggers:
            if isinstance(logger, tensorboard):
                return logger.log_dir
        others = [type(logger).__name__ for logger in trainer.loggers]
        first = getattr(trainer.loggers[0], "log_dir", None) if trainer.loggers else None
        where = first if isinstance(first, str) else os.path.join(trainer.default_root_dir, "gradients")
        warnings.warn(
            f"tb_gradcheck: the trainer has no TensorBoardLogger (loggers: {others or 'none'}); the Gradients tab's "
            f"run is written to {where}. Add lightning.pytorch.loggers.TensorBoardLogger to see it beside "
            "Lightning's scalars, or pass GradientCallback(log_dir=...).",
            stacklevel=3,
        )
        return where

    def _detach(self):
        """Closes the writer (writing what it holds) and puts back the optimizer and the plugin as they were."""
        writer, self.writer = self.writer, None
        plugin, self._plugin = self._plugin, None
        hook, self._closure_first = self._closure_first, None
        self._trainer = self._optimizer = None
        try:
            if plugin is not None:
                if self._plugin_had is not None:
                    plugin._after_closure = self._plugin_had
                else:
                    plugin.__dict__.pop("_after_closure", None)
            if hook is not None:
                hook.remove()
        finally:
            self._plugin_had = None
            if writer is not None:
                writer.close()


def _callback_class(package, name):
    base = package.Callback
    doc = f"""A ``{package.__name__}.Callback`` that writes per-layer gradient statistics for the Gradients tab.

    It records, at every optimizer step (``trainer.global_step``), the
    gradient the optimizer applies (after ``accumulate_grad_batches``, the
    all-reduce under DDP, AMP unscaling and ``gradient_clip_val``), the norm
    before Lightning clips it, and the update each layer received; rank 0
    writes. The run is the TensorBoardLogger's ``log_dir``: Lightning's
    scalars and the Gradients tab are one run.

    Manual optimization: nothing more to call; each ``opt.step()`` records
    the gradient it applies. To record the norm before your own
    ``self.clip_gradients(...)``, call ``record_norm_before_clip()`` on the
    callback just before it.

    Args:
      every_n_steps: Int, default 1: write every N optimizer steps
        (``GradientWriter``'s windows between writes), each window ending
        at a step Lightning logs at (N - 1, 2N - 1, ...), so with
        ``log_every_n_steps=N`` the scalars and the gradients share steps.
      log_dir: Optional run directory instead of the TensorBoardLogger's.
      activations: Bool, default False: also statistics of each layer's
        forward output at written steps (``tb_gradcheck.torch.activations``;
        validation passes are not counted). The hooks are registered at the
        fit's start: a model compiled before that does not run them.

    Attributes:
      writer: The ``tb_gradcheck.torch.GradientWriter`` during a fit, else
        None: ``callback.writer.write_check(report, trainer.global_step)``
        writes a gradient check into the run.
      log_dir: The run directory of the last fit.
    """
    return type(name, (_Recorder, base), {"_PACKAGE": package, "__doc__": doc, "__module__": __name__})


_CLASSES = {}


def __getattr__(name):
    # Built at first use, on the package the user trains with: ``GradientCallback`` on
    # ``lightning.pytorch`` (``pytorch_lightning`` where only that is installed),
    # ``PLGradientCallback`` on ``pytorch_lightning``.
    if name not in ("GradientCallback", "PLGradientCallback"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _CLASSES:
        if name == "GradientCallback":
            try:
                import lightning.pytorch as package
            except ImportError:
                import pytorch_lightning as package
        else:
            import pytorch_lightning as package
        _CLASSES[name] = _callback_class(package, name)
    return _CLASSES[name]
