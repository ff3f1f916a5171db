"""tb_gradcheck: per-layer gradient statistics and gradient checks, shown in TensorBoard's Gradients tab."""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).parent
# The version lives in one place, the package; read it without importing the
# package (its dependencies may not be installed yet).
VERSION = re.search(
    r'^__version__ = "([^"]+)"$', (HERE / "tb_gradcheck" / "__init__.py").read_text(encoding="utf-8"), re.MULTILINE
).group(1)

setuptools.setup(
    name="tb_gradcheck",
    version=VERSION,
    description="Per-layer gradient statistics and gradient checks for TensorFlow, in a TensorBoard Gradients tab",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # The frontend lives at the top level of the repository (frontend/) and
    # ships inside the package as tb_gradcheck/frontend, where plugin.py looks
    # first.
    packages=[
        "tb_gradcheck",
        *(
            f"tb_gradcheck.{sub}"
            for sub in ("core", "keras", "tensorflow", "torch", "jax", "check", "findings", "reader")
        ),
        "tb_gradcheck.frontend",
    ],
    package_dir={"tb_gradcheck": "tb_gradcheck", "tb_gradcheck.frontend": "frontend"},
    package_data={"tb_gradcheck.frontend": ["*.js", "*.css"]},
    # TensorFlow is not a hard requirement: the plugin and the report command
    # run without it (reading logs on a laptop), and "tensorflow" would not be
    # satisfied by an installed tensorflow-cpu, so pip would fetch a second TF.
    # The writer needs one of the two; pick it with an extra. The PyTorch
    # writer (tb_gradcheck.torch) needs torch instead, and no TensorFlow:
    # [torch] (for a CPU-only build, install torch from PyTorch's CPU index first).
    install_requires=["numpy", "tensorboard>=2.21,<2.22"],
    extras_require={
        "tensorflow": ["tensorflow>=2.21,<2.22"],
        "cpu": ["tensorflow-cpu>=2.21,<2.22"],
        # 2.6: torch.nn.utils.get_total_norm, and optimizer step hooks on every optimizer.
        "torch": ["torch>=2.6"],
        # The trainers' callbacks: tb_gradcheck.lightning (Lightning 2.6's hooks and precision plugins) and
        # tb_gradcheck.transformers (transformers 5's Trainer, through accelerate). No TensorFlow.
        "lightning": ["lightning>=2.6", "torch>=2.6"],
        "transformers": ["transformers>=5", "accelerate", "torch>=2.6"],
        # The JAX writer needs jax and optax; flax for its tests, examples and benchmarks (Linen and NNX models).
        "jax": ["jax>=0.10", "optax>=0.2.8", "flax>=0.12"],
        # ruff pinned: `ruff format --check` in .ci/run must not change its mind with a new release.
        # transformers: the PyTorch writer is tested on library models (GPT-2's Conv1D, tied heads).
        "test": ["pytest", "pytest-xdist", "hypothesis", "playwright", "ruff==0.17.6", "transformers"],
    },
    entry_points={
        "tensorboard_plugins": ["gradients = tb_gradcheck.reader.plugin:GradientsLoader"],
        "console_scripts": ["tb-gradcheck = tb_gradcheck.cli:main"],
    },
)
