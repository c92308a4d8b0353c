"""A type checker sees the public API: pyright types ``chateval_dspy``'s names as what they are (not the ``object``
of a lazy ``__getattr__``) and finds no error in code that uses them, the package docstring's example included."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

from repo_paths import ROOT

import chateval_dspy

# Code a user writes against the public API; each reveal_type names the type pyright must give (a function's: how
# its type ends, its return type).
USES = '''
import chateval_dspy as ce
from typing import reveal_type

reveal_type(ce.DebateConfig)  # type[DebateConfig]
reveal_type(ce.evaluate)  # -> RunResult
reveal_type(ce.build_evaluator)  # -> ChatEval
reveal_type(ce.LMSpec)  # type[LMSpec]
reveal_type(ce.load_task("faireval"))  # TaskSpec
cfg: ce.DebateConfig = ce.DebateConfig(format="pointwise", turns=3)
reveal_type(cfg.calls_per_item())  # int
reveal_type(ce.build_evaluator(cfg))  # ChatEval
items, fmt = ce.load_dataset("faireval")
reveal_type(fmt)  # str
try:
    pass
except ce.FatalLMError as exc:
    reveal_type(exc)  # FatalLMError
'''


def _docstring_example() -> str:
    """The package docstring's example as a script (an example showing a value binds it), ``fake_url`` defined."""
    lines = ['fake_url = "http://127.0.0.1:9/v1"']
    for example in doctest.DocTestParser().get_examples(chateval_dspy.__doc__):
        lines.append(f"shown = ({example.source.strip()})" if example.want else example.source.rstrip())
    return "\n".join(lines) + "\n"


def _pyright(tmp_path: Path, source: str) -> dict:
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"extraPaths": [str(ROOT)], "typeCheckingMode": "standard"}))
    (tmp_path / "uses.py").write_text(source, encoding="utf-8")
    # PYRIGHT_PYTHON_IGNORE_WARNINGS: no look-up of a newer release (the wheel bundles pyright; node comes from PATH or
    # the nodejs wheel), so the check runs offline.
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    done = subprocess.run([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable,
                           "-p", str(tmp_path), str(tmp_path / "uses.py")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.stdout.strip(), f"pyright did not run (it is in the dev extra: pip install -e '.[dev]'): {done.stderr}"
    return json.loads(done.stdout)


def test_pyright_types_the_public_api_and_finds_no_error(tmp_path):
    report = _pyright(tmp_path, USES + "\n" + _docstring_example())
    problems = [d for d in report["generalDiagnostics"] if d["severity"] != "information"]
    assert not problems, json.dumps(problems, indent=1)
    revealed = [d["message"] for d in report["generalDiagnostics"] if d["message"].startswith("Type of")]
    expected = [line.split("# ")[1] for line in USES.splitlines() if line.strip().startswith("reveal_type(")]
    assert len(revealed) == len(expected)
    for message, want in zip(revealed, expected):
        shown = message.split('" is "', 1)[1].removesuffix('"')
        assert shown == want or (want.startswith("->") and shown.endswith(f" {want}")), (message, want)


def test_pyright_sees_a_wrong_call_of_the_api(tmp_path):
    """The clean result above means something: the same check reports a misuse of a public name."""
    report = _pyright(tmp_path, 'import chateval_dspy as ce\nce.DebateConfig(turns="three", no_such_field=1)\n')
    errors = [d["message"] for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert any("no_such_field" in m for m in errors), errors
