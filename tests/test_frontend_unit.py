"""Runs the frontend's pure-helper unit tests (node --test), so `python -m pytest` covers them too."""

import shutil
import subprocess

import pytest

from conftest import ROOT


def test_node_unit_tests_pass():
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (v18+) is required for the frontend unit tests")
    tests = sorted(str(p) for p in (ROOT / "tests" / "frontend").glob("*.test.mjs"))
    assert tests, "no frontend unit tests found in tests/frontend"
    out = subprocess.run([node, "--test", *tests], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert "# fail 0" in out.stdout, out.stdout[-2000:]
