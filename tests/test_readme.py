"""The README runs as written (issue 10): every fenced ``bash`` command and ``python`` block, in order, in a fresh
directory, with the scripted fake LM standing in wherever a model is named (``embedded``, a URL, a LiteLLM string).

Setup and test commands are checked against ``.ci/run`` instead of being run again. ``chateval serve ... &`` (and
``chateval review serve ... &``) runs in a thread and the ``curl`` lines after it call it. ``<mlflow-run-id>`` is the
id the last command printed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from readme_section import section_span

import chateval_dspy.lm.resolve
from chateval_dspy.testing.fake_lm import fake_lm

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of every fenced block."""
    return [(m.group(1), m.group(2), text[: m.start()].count("\n") + 1) for m in FENCE.finditer(text)]


def commands(code: str) -> list[str]:
    """Shell command lines: continuations joined, comments and blank lines dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        background = bool(words) and words[-1] == "&"
        if background:
            words.pop()
        if words:
            out.append(shlex.join(words) + (" &" if background else ""))
    return out


def test_every_block_is_bash_or_python_or_an_example_file():
    """A block in another language would be skipped silently; the layout diagram is plain text on purpose, and a
    YAML block must be one of data/examples/*.yaml, which the commands use."""
    import yaml

    examples = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in (ROOT / "data" / "examples").glob("*.yaml")]
    for lang, code, line in blocks(README.read_text(encoding="utf-8")):
        assert lang in ("bash", "python", "yaml", ""), f"README.md:{line}: block in {lang!r}"
        if lang == "yaml":
            assert yaml.safe_load(code) in examples, f"README.md:{line}: YAML block is not a file in data/examples"


# The commands that report figures with bootstrap CIs (their --resamples flag).
FIGURES = ("evaluate", "compile", "search", "ablate")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A fresh working directory holding the repository's example files, and a fake LM behind every model spec."""
    shutil.copytree(ROOT / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    asked = []

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        asked.append(spec)
        yield fake_lm()

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    # Batch mode builds its own LM: OpenAI's Batch API is the scripted server's, vllm run-batch a stand-in on waves/.
    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from chateval_dspy.testing.fake_vllm import FakeRunBatch

    batch_api = FakeOpenAIServer(model="gpt-4o-mini")
    monkeypatch.setenv("OPENAI_BASE_URL", batch_api.__enter__())
    run_batch = FakeRunBatch(tmp_path / "waves").__enter__()
    levels = {n: logging.getLogger(n).level for n in ("dspy", "httpx", "openai", "LiteLLM", "mlflow", "alembic")}
    yield asked
    run_batch.__exit__()
    batch_api.__exit__()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def wait_for(url: str, seconds: float = 60) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow
def test_readme_runs_as_written(sandbox, monkeypatch):
    from optim.cli.main import main

    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # .ci/run may call python3 and quiet pip; the commands are otherwise the README's, word for word.
    ci_commands = [[{"python3": "python"}.get(w, w) for w in shlex.split(line, comments=True) if w != "-q"]
                   for line in ci.splitlines()]
    text = README.read_text(encoding="utf-8")
    start, end = section_span(text)  # run by its own tests against real servers (readme_section.py)
    text = text[:start] + "\n" * text[start:end].count("\n") + text[end:]
    namespace: dict = {}
    last_run_id = None
    ran = {"python": 0, "chateval": 0, "curl": 0}
    for lang, code, line in blocks(text):
        where = f"README.md:{line}"
        if lang == "python":
            exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the README's own example
            ran["python"] += 1
            continue
        if lang != "bash":
            continue
        for command in commands(code):
            words = shlex.split(command.removesuffix(" &"))
            if words[:3] == ["python", "-m", "venv"] or words[:3] == ["python", "-m", "pytest"] or words[0] == "apt-get":
                assert words in ci_commands, f"{where}: {command!r} is not what .ci/run runs"
                continue
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                # A placeholder key must still look like a secret, so the planted-key guards see it.
                monkeypatch.setenv(name, value if value != "..." else "sk-readme-placeholder-0123456789")
                continue
            if words[0] == "chateval":
                argv = [last_run_id if w == "<mlflow-run-id>" else w for w in words[1:]]
                if argv[0] in FIGURES:  # fewer bootstrap resamples than a user's 2,000: this checks the commands run
                    argv += ["--resamples", "200"]
                if argv[0] == "serve" or argv[:2] == ["review", "serve"]:
                    threading.Thread(target=main, args=(argv,), daemon=True).start()
                    port = argv[argv.index("--port") + 1]
                    wait_for(f"http://127.0.0.1:{port}/health")
                    ran["chateval"] += 1
                    continue
                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
                    code_ = main(argv)
                assert code_ == 0, f"{where}: {command!r} exited {code_}\n{out.getvalue()}\n{err.getvalue()}"
                found = re.findall(r"^mlflow run: ([0-9a-f]{32})$", out.getvalue(), re.M)
                last_run_id = found[-1] if found else last_run_id
                ran["chateval"] += 1
                continue
            if words[0] == "curl":
                proc = subprocess.run(words, capture_output=True, text=True, timeout=120, env=os.environ.copy())
                assert proc.returncode == 0 and proc.stdout.strip(), f"{where}: {command!r}: {proc.stderr}"
                if "/evaluate" in command:
                    assert '"winner"' in proc.stdout, proc.stdout
                ran["curl"] += 1
                continue
            pytest.fail(f"{where}: no rule runs {command!r}; add one here or change the README")
    assert ran["python"] >= 2 and ran["chateval"] >= 10 and ran["curl"] >= 2, ran
    assert set(sandbox) >= {"embedded"}, sandbox  # the examples named models, and the fake LM answered them


def test_readme_names_no_missing_function():
    """Every ``chateval_dspy...``/``optim...`` dotted name in the README resolves."""
    import importlib

    text = README.read_text(encoding="utf-8")
    for name in sorted(set(re.findall(r"\b((?:chateval_dspy|optim)(?:\.\w+)+)", text))):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"README names {name}, but {'.'.join(parts[:i])} has no {attr}"
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"README names {name}, which does not import")


def test_readme_layout_names_every_module():
    """The Layout section is complete (every runtime module, every optim module or subpackage) and true."""
    text = README.read_text(encoding="utf-8")
    layout = text[text.index("## Layout"):]
    named = set(re.findall(r"([\w*]+\.(?:py|jsonl)|\w+/)", layout))
    for path in (ROOT / "chateval_dspy").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            assert path.name in named, f"README layout omits chateval_dspy/{path.relative_to(ROOT / 'chateval_dspy')}"
    for path in (ROOT / "optim").iterdir():
        if path.suffix == ".py" and path.name != "__init__.py":
            assert path.name in named, f"README layout omits optim/{path.name}"
        elif path.is_dir() and path.name != "__pycache__":
            assert f"{path.name}/" in named, f"README layout omits optim/{path.name}/"
    for name in named:
        if name.endswith(".py"):
            # only the source folders: a glob of the whole checkout would walk .venv
            exists = any(list((ROOT / pkg).glob(f"**/{name}")) for pkg in ("chateval_dspy", "optim", "tests"))
            assert exists, f"README layout names {name}, which does not exist"
