"""The curated Python API: what ``chateval_dspy`` exports exists and is what the README uses."""

from __future__ import annotations

import chateval_dspy as ce
from chateval_dspy.deploy.saved.judge import Judge, Verdict, load


def test_every_exported_name_exists():
    for name in ce.__all__:
        assert hasattr(ce, name), name


def test_production_names_are_exported():
    """``chateval_dspy.load(...)`` raised AttributeError: load and Verdict were not exported."""
    assert ce.load is load and ce.Verdict is Verdict and ce.Judge is Judge
    assert {"load", "Verdict", "Judge", "LMSpec", "DataSpec", "evaluate_dataset"} <= set(ce.__all__)


def test_importing_the_runtime_pulls_in_neither_optim_nor_mlflow():
    import subprocess
    import sys

    code = "import sys, chateval_dspy; print(sorted(m for m in ('optim', 'optuna', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
