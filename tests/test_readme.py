"""README's PyTorch, Lightning and Hugging Face quick starts run as pasted, and say where their runs went.

Each ```python block of those sections runs as its own script in an empty
directory (the real torch, Lightning and transformers; nothing downloaded),
must end well, must print the line that says where the run is written, and
must leave a run that ``tb-gradcheck report`` reads.
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECTIONS = ("## Quick start: PyTorch", "## Quick start: Lightning and the Hugging Face Trainer")


def _blocks():
    """``[(section, code, the tensorboard --logdir that follows it)]`` of the quick starts' Python blocks."""
    text = (ROOT / "README.md").read_text()
    out = []
    for heading in SECTIONS:
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        for code, after in re.findall(r"```python\n(.*?)```(.*?)(?=```python|\Z)", section, re.S):
            logdir = re.search(r"```bash\n[^`]*?tensorboard --logdir (\S+)", after)
            out.append((heading, code, logdir.group(1) if logdir else None))
    return out


BLOCKS = _blocks()


def test_the_quick_starts_have_three_blocks_each_followed_by_its_tensorboard_line():
    assert [b[2] for b in BLOCKS] == ["logs", "logs/lightning_logs", "out/runs"]


@pytest.mark.parametrize("section, code, logdir", BLOCKS, ids=["torch", "lightning", "transformers"])
def test_a_quick_start_runs_as_pasted_and_says_where_its_run_went(tmp_path, section, code, logdir):
    (tmp_path / "quick_start.py").write_text(code)
    done = subprocess.run([sys.executable, "quick_start.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    said = re.findall(
        r"tb_gradcheck: writing gradient statistics to (\S+) \(to view: tensorboard --logdir (\S+)\)",
        done.stdout + done.stderr,
    )
    assert len(said) == 1, done.stdout[-2000:] + done.stderr[-2000:]
    run, view = said[0]
    assert (tmp_path / run).is_dir() and pathlib.Path(tmp_path / run).parent == tmp_path / view
    report = subprocess.run(
        [sys.executable, "-m", "tb_gradcheck.cli", "report", logdir, "--format", "json", "--fail-on", "never"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    runs = json.loads(report.stdout)["runs"]
    assert len(runs) == 1, runs
