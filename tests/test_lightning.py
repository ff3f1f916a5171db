"""tb_gradcheck.lightning.GradientCallback in real Lightning fits, against the test's own float64 record of each step.

Every fit accumulates 2 batches and clips (gradient_clip_val binds at every
step); tests/lightning_job.py records, on the test side only, the norms of
the gradients the optimizer applied, of the gradients before Lightning
clipped them, and of each step's update. The runs are read back through
TensorBoard's own data provider (the Python multiplexer), beside
Lightning's own scalars.
"""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as L  # noqa: E402
import lightning_job  # noqa: E402

import tb_gradcheck.lightning  # noqa: E402
from conftest import ROOT  # noqa: E402
from conftest import get_json  # noqa: E402
from conftest import make_app  # noqa: E402
from conftest import wait_for_steps  # noqa: E402

# Stored values are float32 of float64 statistics: one float32 rounding (2**-24 ~ 6e-8) apart.
RTOL = 1e-6
ROWS = ["body", "norm", "head"]  # forward order; registered head, body, norm
VARIABLES = [f"{m}.{p}" for m in ROWS for p in ("weight", "bias")]
STEPS = lightning_job.SAMPLES // lightning_job.BATCH // lightning_job.ACCUMULATE * lightning_job.EPOCHS

torch.set_num_threads(1)  # tiny models on a shared 2-core machine


def _fp16_on_cpu():
    # Lightning turns precision="16-mixed" on a CPU into bf16-mixed; its plugin runs fp16 autocast and a GradScaler.
    return {"plugins": [L.plugins.MixedPrecision("16-mixed", "cpu")]}


PRECISIONS = {
    "32-true": lambda: {"precision": "32-true"},
    "bf16-mixed": lambda: {"precision": "bf16-mixed"},
    "16-mixed": _fp16_on_cpu,
}


def _heat(client, run, metric, aggregate="last"):
    query = f"run={run}&metric={metric}&granularity=variable&aggregate={aggregate}"
    body = get_json(client, f"/data/plugin/gradients/heatmap?{query}")
    assert body["layers"] == VARIABLES
    values = np.array([[np.nan if v is None else v for v in row] for row in body["values"]], float)
    return body["steps"], values


def _by_param_order(net, values):
    """Reorders the test's record (``net.parameters()`` order) into the run's variable rows."""
    names = [n for n, _ in net.named_parameters()]
    return values[:, [names.index(v) for v in VARIABLES]]


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_fit_records_the_applied_gradient_the_norm_before_clipping_and_the_update(tmp_path, precision):
    overflow = 2 if precision == "16-mixed" else None
    net, callback, trainer = lightning_job.fit(tmp_path, overflow_at=overflow, **PRECISIONS[precision]())
    assert trainer.global_step == STEPS
    logger_dir = trainer.logger.log_dir
    assert os.path.samefile(callback.log_dir, logger_dir)  # the logger's own run: one run in TensorBoard
    run = os.path.relpath(logger_dir, tmp_path)
    client, _ = make_app(tmp_path, "python")
    entry = wait_for_steps(client, run, STEPS)
    assert entry["granularities"]["layer"]["rows"] == ROWS
    scalars = get_json(client, "/data/plugin/scalars/tags")
    assert "train_loss" in scalars[run]  # Lightning's scalars are in the same run
    loss = get_json(client, f"/data/plugin/scalars/scalars?run={run}&tag=train_loss")
    steps, grad = _heat(client, run, "grad_norm")
    assert steps == list(range(STEPS)) == sorted({point[1] for point in loss})  # trainer.global_step, as the scalars

    _, before = _heat(client, run, "grad_norm_before_clip")
    _, update = _heat(client, run, "update_norm")
    want_before = _by_param_order(net, np.stack([net.before[s] for s in steps]))
    stepped = sorted(net.applied)
    refused = sorted(set(steps) - set(stepped))
    assert refused == ([overflow] if overflow is not None else [])
    rows = [steps.index(s) for s in stepped]
    np.testing.assert_allclose(grad[rows], _by_param_order(net, np.stack([net.applied[s] for s in stepped])), RTOL)
    np.testing.assert_allclose(update[rows], _by_param_order(net, np.stack([net.update[s] for s in stepped])), RTOL)
    finite = [i for i, s in enumerate(steps) if s not in refused]
    np.testing.assert_allclose(before[finite], want_before[finite], RTOL)
    # The clip bound: the applied gradient is the clipped one, not the one before.
    assert (np.sqrt((grad[rows] ** 2).sum(axis=1)) < 0.9 * np.sqrt((before[rows] ** 2).sum(axis=1))).all()
    np.testing.assert_allclose(np.sqrt((grad[rows] ** 2).sum(axis=1)), lightning_job.CLIP, rtol=1e-4)
    if overflow is not None:
        _, nonfinite = _heat(client, run, "grad_nonfinite")
        _, scale = _heat(client, run, "loss_scale")
        at = steps.index(overflow)
        assert nonfinite[at].sum() > 0 and (update[at] == 0).all()  # refused: recorded, and nothing applied
        assert scale[at + 1, 0] == scale[at, 0] / 2  # the scaler backed off after it


def test_report_reads_the_run(tmp_path):
    lightning_job.fit(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "tb_gradcheck.cli", "report", str(tmp_path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lightning_logs/version_0" in out.stdout


def test_ddp_on_two_processes_writes_rank_0s_applied_gradient(tmp_path):
    logdir, record = tmp_path / "logs", tmp_path / "record"
    record.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "lightning_job.py"), "ddp", str(logdir), str(record)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        # Lightning picks a free port for rank 0; a test running beside this one can take it first.
        if out.returncode == 0 or "address already in use" not in out.stderr.lower():
            break
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    ranks = [np.load(record / f"rank{r}.npz") for r in (0, 1)]
    # DDP's all-reduce: both ranks applied the same gradient (their own halves of each batch, averaged).
    np.testing.assert_allclose(ranks[0]["applied"], ranks[1]["applied"], rtol=1e-6)
    run_dir = str(ranks[0]["log_dir"])
    files = [f for f in os.listdir(run_dir) if f.endswith(".gradients")]
    assert len(files) == 1  # rank 0 alone wrote
    client, _ = make_app(logdir, "python")
    run = os.path.relpath(run_dir, logdir)
    steps_total = len(ranks[0]["steps"])
    wait_for_steps(client, run, steps_total)
    steps, grad = _heat(client, run, "grad_norm")
    assert steps == ranks[0]["steps"].tolist()
    order = _order()
    np.testing.assert_allclose(grad, ranks[0]["applied"][:, order], RTOL)
    _, before = _heat(client, run, "grad_norm_before_clip")
    np.testing.assert_allclose(before, ranks[0]["before"][:, order], RTOL)
    _, update = _heat(client, run, "update_norm")
    np.testing.assert_allclose(update, ranks[0]["update"][:, order], RTOL)


def _order():
    names = [n for n, _ in lightning_job.Net().named_parameters()]
    return [names.index(v) for v in VARIABLES]


def test_manual_optimization_records_each_step_and_the_norm_before_the_users_clip(tmp_path):
    class Manual(lightning_job.Net):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def on_before_optimizer_step(self, optimizer):
            pass  # inside optimizer.step(), after the clip: the record before it is taken in training_step

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            x, y = batch
            self.manual_backward(torch.nn.functional.mse_loss(self(x), y) / 2)
            if (batch_idx + 1) % 2 == 0:  # accumulated by hand: a step every 2 batches
                self.before[self.trainer.global_step] = lightning_job._norms(p.grad for p in self.parameters())
                callback.record_norm_before_clip()
                self.clip_gradients(optimizer, gradient_clip_val=lightning_job.CLIP, gradient_clip_algorithm="norm")
                optimizer.step()
                optimizer.zero_grad()

    callback = tb_gradcheck.lightning.GradientCallback()
    net = Manual()
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=L.loggers.TensorBoardLogger(str(tmp_path)),
        callbacks=[callback],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(net, lightning_job.data())
    client, _ = make_app(tmp_path, "python")
    run = os.path.relpath(callback.log_dir, tmp_path)
    wait_for_steps(client, run, 4)
    steps, grad = _heat(client, run, "grad_norm")
    assert steps == [0, 1, 2, 3] == sorted(net.applied)
    np.testing.assert_allclose(grad, _by_param_order(net, np.stack([net.applied[s] for s in steps])), RTOL)
    _, before = _heat(client, run, "grad_norm_before_clip")
    np.testing.assert_allclose(before, _by_param_order(net, np.stack([net.before[s] for s in steps])), RTOL)
    _, update = _heat(client, run, "update_norm")
    np.testing.assert_allclose(update, _by_param_order(net, np.stack([net.update[s] for s in steps])), RTOL)


def test_without_a_tensorboard_logger_it_says_where_it_writes(tmp_path):
    callback = tb_gradcheck.lightning.GradientCallback()
    with pytest.warns(UserWarning, match="no TensorBoardLogger.*CSVLogger"):
        lightning_job.fit(tmp_path, callback=callback, logger=L.loggers.CSVLogger(str(tmp_path)), max_epochs=1)
    assert any(f.endswith(".gradients") for f in os.listdir(callback.log_dir))


def test_misuse_is_refused_with_expected_received(tmp_path):
    with pytest.raises(ValueError, match="Expected `every_n_steps` to be a positive integer. Received: 0"):
        tb_gradcheck.lightning.GradientCallback(every_n_steps=0)
    with pytest.raises(TypeError, match="Expected `log_dir` to be a path or None. Received: int"):
        tb_gradcheck.lightning.GradientCallback(log_dir=3)

    class TwoOptimizers(lightning_job.Net):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def configure_optimizers(self):
            return [torch.optim.SGD(self.body.parameters(), lr=0.1), torch.optim.SGD(self.head.parameters(), lr=0.1)]

    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        callbacks=[tb_gradcheck.lightning.GradientCallback(log_dir=tmp_path)],
    )
    with pytest.raises(ValueError, match="Expected a LightningModule with one optimizer.*Received: 2 optimizers"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(TwoOptimizers(), lightning_job.data())


def test_example_writes_the_loggers_run_as_a_user_runs_it(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    script = ROOT / "examples" / "lightning_example.py"
    out = subprocess.run(
        [sys.executable, str(script), "--logdir", str(tmp_path), "--epochs", "1", "--check-every", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Wrote 16 steps to" in out.stdout
    client, _ = make_app(tmp_path, "python")
    entry = wait_for_steps(client, "lightning_logs/version_0", 16)
    assert entry["granularities"]["layer"]["rows"] == [f"net.{i}" for i in range(0, 12, 2)]
    assert {"grad_norm_before_clip", "update_norm"} <= set(entry["metrics"])
    assert "train_loss" in get_json(client, "/data/plugin/scalars/tags")["lightning_logs/version_0"]
    # Its gradient check from inside the fit, in the same run at the steps its gradient rows are written at.
    checks = get_json(client, "/data/plugin/gradients/checks?run=lightning_logs/version_0")
    assert checks["failures"] == [] and len(checks["rows"]) == 6
    heat = get_json(client, "/data/plugin/gradients/heatmap?run=lightning_logs/version_0&metric=check_error")
    assert heat["steps"] == [0, 8]


def test_docs_show_the_examples_gradient_check():
    """docs/torch.md's check from inside a Lightning fit is the example's, which the test above runs."""
    example = (ROOT / "examples" / "lightning_example.py").read_text()
    shown = (ROOT / "docs" / "torch.md").read_text()
    start = example.index("class GradientCheck(L.Callback)")
    code = example[start : example.index("\n\n\n", start)]
    assert code in shown


def test_windows_end_at_the_steps_lightning_logs_at(tmp_path):
    """every_n_steps=2 beside log_every_n_steps=2: the gradient rows and self.log's scalars share steps 1, 3, 5, 7."""
    callback = tb_gradcheck.lightning.GradientCallback(every_n_steps=2)
    net, _, trainer = lightning_job.fit(tmp_path, callback=callback, log_every_n_steps=2)
    run = os.path.relpath(trainer.logger.log_dir, tmp_path)
    client, _ = make_app(tmp_path, "python")
    wait_for_steps(client, run, STEPS // 2)
    loss = get_json(client, f"/data/plugin/scalars/scalars?run={run}&tag=train_loss")
    steps, grad = _heat(client, run, "grad_norm")
    assert steps == [1, 3, 5, 7] == [point[1] for point in loss]
    # Each window's steps: the write step and the one before it (the largest of the two in `max`).
    np.testing.assert_allclose(grad, _by_param_order(net, np.stack([net.applied[s] for s in steps])), RTOL)
    _, peak = _heat(client, run, "grad_norm", aggregate="max")
    both = np.maximum(np.stack([net.applied[s - 1] for s in steps]), np.stack([net.applied[s] for s in steps]))
    np.testing.assert_allclose(peak, _by_param_order(net, both), RTOL)


def test_windows_and_logged_steps_that_seldom_meet_are_a_warning(tmp_path):
    callback = tb_gradcheck.lightning.GradientCallback(every_n_steps=3)
    with pytest.warns(UserWarning, match=r"every_n_steps=3 and the Trainer's log_every_n_steps=2.*every 6th step"):
        lightning_job.fit(tmp_path, callback=callback, log_every_n_steps=2, max_epochs=1)


def test_a_fit_that_raises_leaves_its_steps_written_and_lightning_as_it_was(tmp_path):
    class Fails(lightning_job.Net):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 2:
                raise RuntimeError("planted")
            return super().training_step(batch, batch_idx)

    callback = tb_gradcheck.lightning.GradientCallback()
    net = Fails()
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        accumulate_grad_batches=2,
        gradient_clip_val=lightning_job.CLIP,
        logger=L.loggers.TensorBoardLogger(str(tmp_path)),
        callbacks=[callback],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="planted"):
        trainer.fit(net, lightning_job.data())
    assert callback.writer is None and "_after_closure" not in vars(trainer.precision_plugin)
    optimizer = trainer.optimizers[0]
    assert len(optimizer._optimizer_step_pre_hooks) == len(optimizer._optimizer_step_post_hooks) == 1  # the test's
    client, _ = make_app(tmp_path, "python")
    run = os.path.relpath(callback.log_dir, tmp_path)
    wait_for_steps(client, run, 2)
    steps, grad = _heat(client, run, "grad_norm")
    assert steps == [0, 1]
    np.testing.assert_allclose(grad, _by_param_order(net, np.stack([net.applied[s] for s in steps])), RTOL)


def test_pytorch_lightning_gets_its_own_callback_class(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 3)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = tb_gradcheck.lightning.PLGradientCallback()
    assert isinstance(callback, pl.Callback)
    trainer = pl.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=pl.loggers.TensorBoardLogger(str(tmp_path)),
        callbacks=[callback],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(), lightning_job.data())
    client, _ = make_app(tmp_path, "python")
    entry = wait_for_steps(client, os.path.relpath(callback.log_dir, tmp_path), 3)
    assert entry["granularities"]["layer"]["rows"] == ["layer"]


def test_a_log_dir_that_cannot_hold_the_run_is_refused_when_the_callback_is_built():
    with pytest.raises(
        ValueError, match="tb_gradcheck.lightning.GradientCallback can write its run to. Received: '/proc/x'"
    ):
        tb_gradcheck.lightning.GradientCallback(log_dir="/proc/x")


def test_activations_are_recorded_over_the_accumulated_batches_of_each_written_step(tmp_path):
    """activations=True: act_rms of each written step, over both accumulated micro-batches, as the test's own hook sees."""
    callback = tb_gradcheck.lightning.GradientCallback(every_n_steps=2, activations=True)
    outputs = {}

    def record(net):
        def hook(module, args, output):
            if module.training:  # the sanity check's validation passes run in eval mode
                outputs.setdefault(net.trainer.global_step, []).append(output.detach().double().numpy().ravel())

        net.body.register_forward_hook(hook)

    original = lightning_job.Net.on_fit_start
    lightning_job.Net.on_fit_start = lambda self: record(self)
    try:
        _, _, trainer = lightning_job.fit(tmp_path, callback=callback, log_every_n_steps=2)
    finally:
        lightning_job.Net.on_fit_start = original
    run = os.path.relpath(trainer.logger.log_dir, tmp_path)
    client, _ = make_app(tmp_path, "python")
    wait_for_steps(client, run, STEPS // 2)
    body = get_json(client, f"/data/plugin/gradients/heatmap?run={run}&metric=act_rms")
    assert body["steps"] == [1, 3, 5, 7] and body["layers"] == ROWS
    want = [np.sqrt(np.mean(np.concatenate(outputs[s]) ** 2)) for s in body["steps"]]
    assert all(len(outputs[s]) == lightning_job.ACCUMULATE for s in body["steps"])
    # float32 sums of squares over a few dozen elements, stored as float32: 1e-5 is far above that noise.
    np.testing.assert_allclose([row[0] for row in body["values"]], want, rtol=1e-5)
