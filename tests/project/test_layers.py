"""The tree's architecture, checked: imports run one way (CLI -> optim -> chateval_dspy, and within the runtime
from the program up to deployment), no module imports a layer above it, no import cycle exists, and no
``_private`` name is imported from another module. Functions stay short, and importing the package or
building the command's parser is light: no heavy library loaded, no environment variable set."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import ROOT

PACKAGES = ("chateval_dspy", "optim")

# Lower layers first; a module may import its own layer or lower ones, never a higher one.
LAYERS = [
    ("chateval_dspy.errors", "chateval_dspy.lazy", "chateval_dspy.limits",
     "chateval_dspy.concurrency", "chateval_dspy.files", "chateval_dspy.scrub"),
    ("chateval_dspy.lm",),
    ("chateval_dspy.program", "chateval_dspy.config"),
    ("chateval_dspy.data",),
    ("chateval_dspy.run",),
    ("chateval_dspy.deploy",),
    ("chateval_dspy.testing",),
    ("chateval_dspy",),  # the package's curated re-exports
    ("optim",),
    ("optim.bench",),
    ("optim.cli",),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, imported names, line)`` for every import in the file, at any depth (lazy ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names], node.lineno))
    return out


def layer(name: str) -> int:
    best, rank = -1, None
    for i, group in enumerate(LAYERS):
        for prefix in group:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{name} is in no layer: add it to LAYERS"
    return rank


def edges() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        for target, names, _ in imports(path):
            if target.split(".")[0] not in PACKAGES:
                continue
            subs = {f"{target}.{n}" for n in names if f"{target}.{n}" in known}
            graph[mod] |= subs or ({target} if target in known else set())
    return graph


def test_every_module_is_in_a_layer():
    for mod in modules():
        layer(mod)


@pytest.mark.parametrize("mod", sorted(modules()))
def test_no_module_imports_a_layer_above_it(mod):
    path = modules()[mod]
    for target, names, line in imports(path):
        if target.split(".")[0] not in PACKAGES:
            continue
        assert layer(target) <= layer(mod), f"{path.relative_to(ROOT)}:{line} imports {target}, a layer above {mod}"
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{path.relative_to(ROOT)}:{line} imports private names {private} from {target}"


def test_no_import_cycles():
    graph = edges()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


# Runtime modules that are MLflow code by nature, each imported only where MLflow is wanted (checked below).
MLFLOW_BOUND = {
    "chateval_dspy.deploy.mlflow.pyfunc": "logged as code: MLflow executes the file when it loads the model",
    "chateval_dspy.deploy.mlflow.scorer": "an MLflow judge class, imported when an MLflow judge is built",
}


def test_the_runtime_never_imports_optim_optuna_or_mlflow_at_import_time():
    """Production imports chateval_dspy only; mlflow is imported lazily, and only to fetch runs:/ and models:/ URIs."""
    for mod, path in modules().items():
        if not mod.startswith("chateval_dspy"):
            continue
        if mod in MLFLOW_BOUND:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in ("optim", "optuna", "mlflow"), f"{mod} imports {name} at import time"
            if isinstance(node, ast.ImportFrom):  # from chateval_dspy.deploy import pyfunc
                names += [f"{node.module}.{a.name}" for a in node.names]
            for name in set(names) & set(MLFLOW_BOUND):
                raise AssertionError(f"{mod} imports {name} ({MLFLOW_BOUND[name]}) at import time")


# ---- function length

MAX_FUNCTION_LINES = 60
# An argument parser's declaration is a list of add_argument calls, read as a table, not a procedure: the command
# modules' add_command and the shared add_<group>_flags / add_<group>_arguments helpers, in optim/cli only.
PARSER_DECLARATION = re.compile(r"add_command|add_\w+_(flags|arguments)")


def is_parser_declaration(mod: str, name: str) -> bool:
    return (mod == "optim.cli" or mod.startswith("optim.cli.")) and PARSER_DECLARATION.fullmatch(name) is not None


def test_no_function_is_longer_than_60_lines():
    """From its ``def`` line to its last line, docstring included; argument-parser declarations excepted."""
    long = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or is_parser_declaration(mod, node.name):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(sorted(long))


def test_only_parser_declarations_in_the_cli_are_exempt():
    assert is_parser_declaration("optim.cli.search", "add_command")
    assert is_parser_declaration("optim.cli.flags", "add_lm_flags")
    assert is_parser_declaration("optim.cli.score", "add_trace_flags")
    assert not is_parser_declaration("optim.cli.search", "add_command_and_run")
    assert not is_parser_declaration("optim.cli.flags", "lm_flags")
    assert not is_parser_declaration("optim.search.run", "add_command")
    assert not is_parser_declaration("chateval_dspy.config", "add_panel_flags")


# ---- a light import

# What `import chateval_dspy` and `chateval --help` must not load: each costs from 0.3 s (numpy) to 5 s (litellm).
HEAVY = ("dspy", "litellm", "pandas", "scipy", "sklearn", "numpy", "openai", "optuna", "mlflow", "pydantic",
         "pyspark", "ray", "torch")


def run_fresh(code: str) -> dict:
    """``code``'s printed JSON, from a fresh interpreter in the repository root whose environment holds only what
    finding Python and a home needs (no offline switch a test session sets)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "SYSTEMROOT", "TMPDIR") if k in os.environ}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


ENV_CHANGES = """
import json, os
before = dict(os.environ)
{imports}
after = dict(os.environ)
print(json.dumps(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))))
"""


@pytest.mark.parametrize("imports", ["import chateval_dspy", "import chateval_dspy.lm", "import optim",
                                     "import optim.cli.main", "import optim.cli.main; optim.cli.main.build_parser()"])
def test_importing_sets_no_environment_variable(imports):
    """A notebook that imports the package keeps its Hugging Face downloads, telemetry and LiteLLM settings: only the
    command (main()), the benchmark runner and the test suite set the offline switches, for their own process."""
    assert run_fresh(ENV_CHANGES.format(imports=imports)) == []


# scikit-learn sets these when it is imported (for its OpenMP runtime): the library's own doing, as in any process that
# imports it, and no module of ours at import time on the package's or the parser's path (the tests above and below).
SET_BY_SKLEARN = ["KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"]


def test_importing_any_runtime_module_sets_no_environment_variable():
    names = sorted(m for m in modules() if m.startswith("chateval_dspy") and not m.endswith("__main__")
                   and m not in MLFLOW_BOUND)  # importing MLflow sets its own variables (a telemetry session id)
    changed = run_fresh(ENV_CHANGES.format(imports="\n".join(f"import {m}" for m in names)))
    assert [k for k in changed if k not in SET_BY_SKLEARN] == []


LOADED = """
import json, sys
{imports}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))))
"""


def test_importing_chateval_dspy_loads_no_heavy_library():
    assert run_fresh(LOADED.format(imports="import chateval_dspy", heavy=HEAVY)) == []


def test_building_the_command_parser_loads_no_heavy_library():
    """``chateval --help`` builds every command's parser: their choices and defaults come from light modules."""
    code = LOADED.format(imports="import optim.cli.main\noptim.cli.main.build_parser()", heavy=HEAVY)
    assert run_fresh(code) == []
