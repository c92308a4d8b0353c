"""The package's names load on first use and stay the objects they name; ``FatalLMError`` is ours, not DSPy's
``LMError``, and an ``except`` clause catches exactly what its class says."""

from __future__ import annotations

import warnings

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
    import chateval_dspy.lm as lm

    assert not hasattr(lm, "resolve_lm_typo")


def test_subpackages_export_their_names_lazily():
    import chateval_dspy.data as data
    import chateval_dspy.lm as lm
    import chateval_dspy.program as program
    import chateval_dspy.run as run
    from chateval_dspy.lm.resolve import EMBEDDED, resolve_lm
    from chateval_dspy.program.strategies import STRATEGIES

    assert lm.resolve_lm is resolve_lm and lm.EMBEDDED is EMBEDDED
    assert program.STRATEGIES is STRATEGIES and program.build_evaluator is build_evaluator
    assert data.split is ce.split and run.RunResult.__name__ == "RunResult"


def test_the_old_name_lmerror_is_the_same_class_and_says_it_is_renamed():
    import chateval_dspy.errors as errors

    with pytest.warns(DeprecationWarning, match="renamed FatalLMError"):
        old = errors.LMError
    assert old is FatalLMError
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert ce.LMError is FatalLMError


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
