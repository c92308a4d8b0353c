"""The documentation runs as written: every fenced ``bash`` command and ``python`` block of
README.md and of each page under docs/, page by page, in order, each page in a fresh directory, with the scripted fake
LM standing in wherever a model is named (``embedded``, a URL, a LiteLLM string). A page whose examples need a saved
evaluator makes it itself, in a block of its own.

README's setup and test commands are checked against ``.ci/run`` instead of being run again; docs/contributing.md's
commands are the other lines of ``.ci/run`` (they install system parts), and docs/many-machines.md runs section by
section in its own tests (``readme_section.py``). ``chateval serve ... &`` (and ``chateval review serve ... &``) runs
in a thread and the ``curl`` lines after it call it. ``<mlflow-run-id>`` is the id the last command printed. Every
relative link and anchor of README.md, docs/, BENCHMARKS.md and benchmarks/ resolves.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import threading
from pathlib import Path

import pytest
from readme_section import DOCS, FENCE, blocks, commands, headings
from repo_paths import ROOT

README = ROOT / "README.md"
# Pages whose commands this file does not run, and why.
RUN_ELSEWHERE = {
    "many-machines.md": "run section by section against real servers (test_postgres_store, test_spark_model, "
                        "test_resumable_scoring, test_gateway)",
    "contributing.md": "installs system parts: checked as the lines of .ci/run (test_ci_runs_the_documented_commands)",
}
DOC_PAGES = [README, *sorted(DOCS.glob("*.md"))]
RUN_PAGES = [page for page in DOC_PAGES if page.name not in RUN_ELSEWHERE]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def shell_words(command: str) -> list[str]:
    """A command's words as CI compares them: ``.ci/run`` may call python3 and quiet pip and apt-get (``-q``)."""
    return [{"python3": "python"}.get(w, w) for w in shlex.split(command, comments=True) if w != "-q"]


def is_setup_or_test(words: list[str]) -> bool:
    return words[:3] in (["python", "-m", "venv"], ["python", "-m", "pytest"])


@pytest.mark.parametrize("page", [p for p in DOC_PAGES if p.name != "contributing.md"], ids=page_id)
def test_every_block_is_bash_or_python_or_an_example_file(page):
    """A block in another language would be skipped silently; the layout diagram is plain text on purpose, and a
    YAML block must be one of data/examples/*.yaml, which the commands use."""
    import yaml

    examples = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in (ROOT / "data" / "examples").glob("*.yaml")]
    for lang, code, line in blocks(page.read_text(encoding="utf-8")):
        where = f"{page_id(page)}:{line}"
        assert lang in ("bash", "python", "yaml", ""), f"{where}: block in {lang!r}"
        if lang == "yaml":
            assert yaml.safe_load(code) in examples, f"{where}: YAML block is not a file in data/examples"


def ci_commands() -> list[list[str]]:
    """``.ci/run``'s commands (continuations joined), less the script's own scaffolding: comments, ``set``, ``cd``."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        words = shell_words(line)
        if words and words[0] not in ("set", "cd"):
            out.append(words)
    return out


def test_ci_runs_the_documented_commands():
    """README shows one setup command and one test command; ``.ci/run`` runs them in that order, and every other
    line of it is a command that docs/contributing.md shows, so what CI installs is what a contributor reads."""
    shown = [shell_words(c) for lang, code, _ in blocks(README.read_text(encoding="utf-8")) if lang == "bash"
             for c in commands(code)]
    setup_and_test = [words for words in shown if is_setup_or_test(words)]
    assert [w[:3] for w in setup_and_test] == [["python", "-m", "venv"], ["python", "-m", "pytest"]], setup_and_test
    setup, test = setup_and_test
    ci = ci_commands()
    assert setup in ci and test in ci, f".ci/run does not run README's {setup} and {test}: {ci}"
    assert ci.index(setup) < ci.index(test), ".ci/run runs README's test command before its setup command"
    contributing = DOCS / "contributing.md"
    documented = [shell_words(c) for lang, code, _ in blocks(contributing.read_text(encoding="utf-8"))
                  if lang == "bash" for c in commands(code)]
    for words in ci:
        assert words in (setup, test) or words in documented, \
            f".ci/run runs {shlex.join(words)!r}, which neither README nor docs/contributing.md shows"


# The commands that report figures with bootstrap CIs (their --resamples flag).
FIGURES = ("evaluate", "compile", "search", "ablate")


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


class PageRun:
    """One page's blocks run in order in the sandbox: Python in one namespace, commands by the rules below."""

    def __init__(self, page: Path, monkeypatch):
        self.page, self.monkeypatch = page, monkeypatch
        self.namespace: dict = {}
        self.last_run_id = None
        self.ran = {"python": 0, "chateval": 0, "curl": 0}

    def run(self) -> dict:
        for lang, code, line in blocks(self.page.read_text(encoding="utf-8")):
            where = f"{page_id(self.page)}:{line}"
            if lang == "python":
                exec(compile(code, where, "exec"), self.namespace)  # noqa: S102 - the page's own example
                self.ran["python"] += 1
            elif lang == "bash":
                for command in commands(code):
                    self.command(command, where)
        return self.ran

    def command(self, command: str, where: str) -> None:
        words = shlex.split(command.removesuffix(" &"))
        if is_setup_or_test(words):
            return  # README's setup and test commands: test_ci_runs_the_documented_commands
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            # A placeholder key must still look like a secret, so the planted-key guards see it.
            self.monkeypatch.setenv(name, value if value != "..." else "sk-readme-placeholder-0123456789")
        elif words[0] == "chateval":
            self.chateval(words[1:], command, where)
        elif words[0] == "curl":
            proc = subprocess.run(words, capture_output=True, text=True, timeout=120, env=os.environ.copy())
            assert proc.returncode == 0 and proc.stdout.strip(), f"{where}: {command!r}: {proc.stderr}"
            if "/evaluate" in command:
                assert '"winner"' in proc.stdout, proc.stdout
            self.ran["curl"] += 1
        else:
            pytest.fail(f"{where}: no rule runs {command!r}; add one here or change the page")

    def chateval(self, argv: list[str], command: str, where: str) -> None:
        from optim.cli.main import main

        argv = [self.last_run_id if w == "<mlflow-run-id>" else w for w in argv]
        self.ran["chateval"] += 1
        if argv[0] in FIGURES:  # fewer bootstrap resamples than a user's 2,000: this checks the commands run
            argv += ["--resamples", "200"]
        if argv[0] == "evaluate" and not {"--trace", "--no-trace"} & set(argv):
            # MLflow writes each default trace in ~0.1 s of CPU, the bulk of a page's run with the fake LM; the
            # tracing rule and the traces are test_tracing's, and the commands that ask for --trace keep it here.
            argv += ["--no-trace"]
        if argv[0] == "serve" or argv[:2] == ["review", "serve"]:
            threading.Thread(target=main, args=(argv,), daemon=True).start()
            wait_for(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/health")
            return
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(argv)
        assert code == 0, f"{where}: {command!r} exited {code}\n{out.getvalue()}\n{err.getvalue()}"
        found = re.findall(r"^mlflow run: ([0-9a-f]{32})$", out.getvalue(), re.M)
        self.last_run_id = found[-1] if found else self.last_run_id


def runnable(page: Path) -> dict:
    """What a page should run: its Python blocks, and its commands that are neither setup, test nor ``export``."""
    expected = {"python": 0, "chateval": 0, "curl": 0}
    for lang, code, _ in blocks(page.read_text(encoding="utf-8")):
        if lang == "python":
            expected["python"] += 1
        for command in commands(code) if lang == "bash" else []:
            word = shlex.split(command)[0]
            if word in ("chateval", "curl"):
                expected[word] += 1
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=page_id)
def test_page_runs_as_written(page, sandbox, monkeypatch):
    ran = PageRun(page, monkeypatch).run()
    assert ran == runnable(page), ran
    if page == README:
        assert ran["python"] >= 2 and ran["chateval"] >= 10 and ran["curl"] >= 2, ran
        assert set(sandbox) >= {"embedded"}, sandbox  # the examples named models, and the fake LM answered them


@pytest.mark.parametrize("page", DOC_PAGES, ids=page_id)
def test_pages_name_no_missing_function(page):
    """Every ``chateval_dspy...``/``optim...`` dotted name in README.md and docs/ resolves."""
    import importlib

    text = page.read_text(encoding="utf-8")
    for name in sorted(set(re.findall(r"\b((?:chateval_dspy|optim)(?:\.\w+)+)", text))):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"{page_id(page)} names {name}, but {'.'.join(parts[:i])} has no {attr}"
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"{page_id(page)} names {name}, which does not import")


def test_layout_names_every_module():
    """docs/architecture.md's Layout section is complete (every runtime module, every optim module or subpackage)
    and true."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout"):]
    named = set(re.findall(r"([\w*]+\.(?:py|jsonl)|\w+/)", layout))
    for path in (ROOT / "chateval_dspy").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            assert path.name in named, f"the layout omits chateval_dspy/{path.relative_to(ROOT / 'chateval_dspy')}"
    for path in (ROOT / "optim").iterdir():
        if path.suffix == ".py" and path.name != "__init__.py":
            assert path.name in named, f"the layout omits optim/{path.name}"
        elif path.is_dir() and path.name != "__pycache__":
            assert f"{path.name}/" in named, f"the layout omits optim/{path.name}/"
    for name in named:
        if name.endswith(".py"):
            # only the source folders: a glob of the whole checkout would walk .venv
            exists = any(list((ROOT / pkg).glob(f"**/{name}")) for pkg in ("chateval_dspy", "optim", "tests"))
            assert exists, f"the layout names {name}, which does not exist"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
LINKED_PAGES = [*DOC_PAGES, ROOT / "BENCHMARKS.md", *sorted((ROOT / "benchmarks").glob("*.md"))]


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in ``page``; a repeated heading gets ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, _, title in headings(page.read_text(encoding="utf-8")):
        base = slug(title)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def links(page: Path) -> list[str]:
    """The link targets of ``page``'s text, leaving out fenced blocks and inline code (they render as text)."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


@pytest.mark.parametrize("page", LINKED_PAGES, ids=page_id)
def test_every_relative_link_and_anchor_resolves(page):
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: ... are not this repository's to check
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page_id(page)}: link {target!r}"
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{where}: {path} does not exist"
        if anchor:
            assert resolved.suffix == ".md", f"{where}: an anchor into a file that is not Markdown"
            assert anchor in anchors(resolved), f"{where}: no heading of {page_id(resolved)} has the anchor #{anchor}"


def test_anchors_follow_github():
    """The slug rule on headings of these pages: backticks, colons and apostrophes go, hyphens and case do not."""
    assert slug("Start-up: `import chateval_dspy` and `chateval --help`") == "start-up-import-chateval_dspy-and-chateval---help"
    assert slug("Which referee earns its cost") == "which-referee-earns-its-cost"
    assert slug("The evaluator in MLflow's registry, on Spark") == "the-evaluator-in-mlflows-registry-on-spark"


def test_benchmark_pages_hold_the_tables_their_figures_give():
    """Each table between ``<!-- bench:FILE -->`` markers is what ``python -m optim.bench tables --update PAGE``
    writes from FILE (beside the page), so no page shows a figure its JSON file does not hold."""
    from optim.bench.tables import MARKER, render_file

    tables = 0
    for page in sorted((ROOT / "benchmarks").glob("*.md")):
        for m in MARKER.finditer(page.read_text(encoding="utf-8")):
            assert m.group("body") == render_file(page.parent / m.group("file")) + "\n", \
                f"{page_id(page)}: the table of {m.group('file')} is stale; run tables --update {page_id(page)}"
            tables += 1
    assert tables >= 14, tables
