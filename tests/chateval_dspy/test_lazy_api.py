"""The package's names load on first use and stay the objects they name, type checkers read the same table as
imports, ``FatalLMError`` is ours, not DSPy's ``LMError``, and an ``except`` clause catches exactly what its class
says."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import dspy
import pytest

import chateval_dspy as ce
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ChatEvalError, FatalLMError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_lm import default_responder, fake_lm

ITEM = {"question": "2+2?", "answer_1": "4", "answer_2": "5"}


def test_task_specs_are_exported_from_the_top_level():
    from chateval_dspy.program.task import TaskSpec, load_task

    assert ce.TaskSpec is TaskSpec and ce.load_task is load_task
    assert {"TaskSpec", "load_task", "FatalLMError"} <= set(ce.__all__)
    assert isinstance(ce.load_task("faireval"), ce.TaskSpec)


def test_dir_lists_every_exported_name_before_it_is_loaded():
    assert set(ce.__all__) <= set(dir(ce))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'chateval_dspy' has no attribute 'Evaluator'"):
        ce.Evaluator  # noqa: B018


def _init_tables() -> tuple[dict[str, str], dict[str, str]]:
    """``(lazy table, TYPE_CHECKING imports)`` of ``chateval_dspy/__init__.py``, each as name -> module."""
    tree = ast.parse(Path(ce.__file__).read_text(encoding="utf-8"))
    lazy = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets))
    block = next(node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                 and node.test.id == "TYPE_CHECKING")
    seen = {a.asname or a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    return lazy, seen


def test_type_checkers_see_the_lazy_table_as_imports():
    """What mypy and pyright read (the ``TYPE_CHECKING`` block) is what the package imports on first use."""
    lazy, seen = _init_tables()
    assert seen == lazy
    eager = {"BudgetExceeded", "ChatEvalError", "ConfigError", "DataError", "FatalLMError"}
    assert set(ce.__all__) == set(lazy) | eager and not set(lazy) & eager
    for name, module in lazy.items():
        assert getattr(ce, name) is getattr(importlib.import_module(module), name)
    assert ce.TYPE_CHECKING is False  # never true when the package runs: its imports stay lazy


def test_fatal_lm_error_is_not_a_dspy_lm_error():
    assert issubclass(FatalLMError, ChatEvalError) and issubclass(FatalLMError, RuntimeError)
    assert not issubclass(FatalLMError, dspy.utils.exceptions.LMError)
    assert issubclass(ce.BudgetExceeded, FatalLMError)


def test_a_run_stopping_fault_passes_an_except_for_dspy_lm_errors_and_stops_at_chateval_error():
    """A refused key stops the run: a handler for DSPy's per-call LM errors does not see it, ChatEvalError does."""

    def responder(call):
        raise dspy.lm15.AuthError("bad key", status=401)

    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    caught = None
    try:
        try:
            with dspy.context(lm=fake_lm(responder)):
                program(**ITEM)
        except dspy.utils.exceptions.LMError:  # what a DSPy user writes for a failed call
            caught = "dspy"
    except ChatEvalError as exc:
        caught = exc
    assert isinstance(caught, FatalLMError) and "refused" in str(caught)


def test_a_failed_call_is_dspys_lm_error_and_becomes_an_abstention_not_a_raise():
    def responder(call):
        if call.kind == "verdict":
            raise dspy.lm15.ServerError("boom", status=500)
        return default_responder(call)

    with dspy.context(lm=fake_lm(responder)):
        pred = build_evaluator(DebateConfig(roles=("critic",), turns=1, calibrate=False))(**ITEM)
    assert pred.abstained == "lm_error:LMServerError"
