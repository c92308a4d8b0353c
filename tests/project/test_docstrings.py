"""Every docstring example in the runtime and in optim runs.

The doctest namespace offers ``tmp`` (a fresh directory) and ``fake_url`` (a running scripted
OpenAI-compatible server), so examples that need an LM use a real URL, as a user would.
"""

from __future__ import annotations

import doctest
import importlib

import pytest
from repo_paths import ROOT

from chateval_dspy.testing.fake_server import FakeOpenAIServer


def module_names() -> list[str]:
    names = []
    for pkg in ("chateval_dspy", "optim"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "__main__.py":  # running it would start the command
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def fake_url():
    with FakeOpenAIServer() as url:
        yield url


@pytest.mark.parametrize("name", module_names())
def test_docstring_examples_run(name, tmp_path, fake_url, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name, globs={"tmp": tmp_path, "fake_url": fake_url})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        test.globs = {**vars(module), **test.globs}
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} failed (output above)"
