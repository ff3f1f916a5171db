"""The PyTorch path needs no TensorFlow: not imported where it is installed, and a venv without it does everything.

- In this venv (TensorFlow installed): importing ``tb_gradcheck.torch`` and
  writing a run never imports TensorFlow (TensorBoard's own event writer
  would: ``eventlog.EventFile``).
- With TensorFlow made unimportable: the writer, ``report`` and ``export``.
- A fresh venv with only numpy, tensorboard and torch: ``pip install .``,
  a torch training run, ``tb-gradcheck report`` and a real ``tensorboard``
  serving the tab's routes over it.
"""

import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT
from conftest import TensorBoardProcess

# A small run: 3 layers, 20 steps, a NaN at step 12 in the last layer.
TRAIN = textwrap.dedent(
    """
    import sys
    import torch
    import tb_gradcheck.torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    writer = tb_gradcheck.torch.GradientWriter(sys.argv[1], model, optimizer=optimizer)
    for step in range(20):
        optimizer.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        if step == 12:
            model[4].weight.grad[0, 0] = float("nan")
        writer.write(step)
        optimizer.step()
    writer.close()
    """
)


def _python(code, *args, env=None, cwd=None, python=sys.executable):
    env = dict(env or os.environ, OMP_NUM_THREADS="1")  # a tiny model on a shared 2-core machine
    out = subprocess.run(
        [python, "-c", code, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def test_importing_and_writing_never_imports_tensorflow_where_it_is_installed(tmp_path):
    assert importlib.util.find_spec("tensorflow") is not None  # the premise: it could be imported
    code = TRAIN + textwrap.dedent(
        """
        import tb_gradcheck
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras")))
        """
    )
    assert _python(code, tmp_path / "run").strip().splitlines()[-1] == "[]"
    assert list((tmp_path / "run").glob("events.out.tfevents.*"))


def test_writer_report_and_export_work_with_tensorflow_unimportable(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["tensorflow"] = None  # `import tensorflow` raises ImportError, find_spec says absent
        sys.argv = [sys.argv[0]] + sys.argv[1:]
        exec(compile(open(sys.argv[2]).read(), "train", "exec"))
        from tb_gradcheck import cli
        code = cli.main(["report", sys.argv[3], "--format", "json"])
        print("REPORT EXIT", code)
        cli.main(["export", sys.argv[3], "--run", "run", "--metric", "grad_norm", "-o", sys.argv[4]])
        """
    )
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    out = _python(code, tmp_path / "logs" / "run", train, tmp_path / "logs", tmp_path / "norms.csv")
    report = json.loads(out[: out.index("REPORT EXIT")])
    kinds = {f["kind"] for f in report["runs"]["run"]["findings"]}
    assert "non_finite" in kinds, report
    assert "REPORT EXIT 1" in out
    lines = (tmp_path / "norms.csv").read_text().splitlines()
    assert lines[0].split(",")[1:] == ["0", "2", "4"] and len(lines) == 21


def _distributions(*roots):
    """The distributions ``roots`` need at run time, themselves included (read from the installed metadata)."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(key)
        for requirement in dist.requires or ():
            if "extra ==" in requirement:
                continue
            marker = requirement.split(";", 1)
            if len(marker) == 2 and "platform_system" in marker[1] and "Linux" not in marker[1]:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", requirement.strip(), maxsplit=1)[0])
    return sorted(seen)


def _link_distribution(name, site):
    """Symlinks one installed distribution's top-level packages and metadata into ``site``."""
    dist = importlib.metadata.distribution(name)
    tops = {pathlib.PurePath(str(f)).parts[0] for f in dist.files or ()}
    base = pathlib.Path(dist.locate_file(""))
    for top in tops:
        source = base / top
        if top in ("..", "bin") or not source.exists() or (site / top).exists():
            continue
        os.symlink(source, site / top)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """torch, tensorboard and numpy (and what they need) linked from this environment; ``pip install .`` without deps.

    Linked, not downloaded: fast and offline. ``pip install .`` with its
    dependencies is test_tensorboard_process.py's venv.
    """
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    site = next((path / "lib").glob("python*/site-packages"))
    for name in _distributions("torch", "tensorboard", "numpy"):
        _link_distribution(name, site)
    # Our wheel is built by this environment's pip and setuptools: the fresh
    # venv's bundled setuptools may be older than a wheel package would need.
    # Installing a built wheel needs no build tools at all.
    wheels = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps"]
        + ["--no-build-isolation", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    pip = subprocess.run(
        [str(path / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        + [str(w) for w in wheels.glob("tb_gradcheck-*.whl")],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # The console script pip would have made for tensorboard, which was linked rather than installed.
    script = path / "bin" / "tensorboard"
    script.write_text(f"#!{path / 'bin' / 'python'}\nfrom tensorboard.main import run_main\nrun_main()\n")
    script.chmod(0o755)
    out = _python(
        "import importlib.util as u; print([u.find_spec(m) is not None for m in ('tensorflow', 'keras', 'torch')])",
        python=str(path / "bin" / "python"),
        cwd=path,
    )
    assert out.strip() == "[False, False, True]", out
    return path


def test_fresh_venv_with_torch_and_no_tensorflow_trains_reports_and_serves(venv, tmp_path):
    python = str(venv / "bin" / "python")
    logdir = tmp_path / "logs"
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    _python(f"exec(open({str(train)!r}).read())", logdir / "torch_run", python=python, cwd=tmp_path)
    report = subprocess.run(
        [str(venv / "bin" / "tb-gradcheck"), "report", str(logdir)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 1, report.stdout + report.stderr  # 1: something was found
    assert "non_finite" in report.stdout.replace("-", "_") or "NaN" in report.stdout, report.stdout
    tb = TensorBoardProcess(logdir, executable=str(venv / "bin" / "tensorboard"))
    try:
        entry = tb.wait_for_steps("torch_run", 20)
        assert entry["granularities"]["layer"]["rows"] == ["0", "2", "4"]
        heat = tb.get_json("/data/plugin/gradients/heatmap?run=torch_run&metric=update_norm")
        assert heat["steps"] == list(range(20)) and all(v > 0 for v in heat["values"][3])
        findings = tb.get_json("/data/plugin/gradients/findings?run=torch_run")["findings"]
        # The NaN planted in layer 4's gradient at step 12 reaches every weight through SGD after it.
        (nan,) = [f for f in findings if f["kind"] == "non_finite"]
        assert nan["evidence"]["4"]["first_step"] == 12 and nan["evidence"]["0"]["first_step"] == 13, nan
        status, body = tb.get("/data/plugin/gradients/static/index.js")
        assert status == 200 and body
    finally:
        tb.close()
