"""The tree's architecture, checked: imports run one way (CLI -> optim -> chateval_dspy, and within the runtime
from the program up to deployment), no module imports a layer above it, no import cycle exists, and no
``_private`` name is imported from another module (issue 10)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chateval_dspy", "optim")

# Lower layers first; a module may import its own layer or lower ones, never a higher one.
LAYERS = [
    ("chateval_dspy.errors", "chateval_dspy.limits", "chateval_dspy.concurrency", "chateval_dspy.files"),
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


def test_the_runtime_never_imports_optim_optuna_or_mlflow_at_import_time():
    """Production imports chateval_dspy only; mlflow is imported lazily, and only to fetch runs:/ and models:/ URIs."""
    for mod, path in modules().items():
        if not mod.startswith("chateval_dspy"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in ("optim", "optuna", "mlflow"), f"{mod} imports {name} at import time"
