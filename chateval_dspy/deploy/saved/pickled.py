"""Pickled programs: refused unless the caller trusts the file, because unpickling runs code from it.

A trusted pickle (``program.pkl``, a ``.pkl``/``.pickle`` file, an MLflow dspy-flavour model) is unpickled, then held
to the same limits as a JSON program and stripped of any LM or call settings it carried (``trusted``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".pkl", ".pickle")
PICKLE_FILE = "program.pkl"  # a program directory saved by DSPy with pickle


def is_pickled(path: Path, card_file: str) -> bool:
    """Whether ``path`` is a pickled program: a ``.pkl``/``.pickle`` file, or a directory holding ``program.pkl``
    and no ``card_file`` (a saved JSON evaluator's card wins)."""
    if path.is_file():
        return path.suffix in PICKLE_SUFFIXES
    return path.is_dir() and not (path / card_file).exists() and (path / PICKLE_FILE).exists()


def refuse_pickle(source, trust_pickle: bool) -> None:
    """A ``ConfigError`` naming ``source`` unless the caller trusts it."""
    if not trust_pickle:
        raise ConfigError(f"{source} is a pickled program: loading it can run arbitrary code. "
                          "Pass trust_pickle=True (CLI: --trust-pickle) only for files you trust")


def unpickle_file(path: Path, trust_pickle: bool) -> ChatEval:
    """The program pickled at ``path`` (a file or a DSPy program directory), if trusted."""
    import dspy

    refuse_pickle(path, trust_pickle)
    program = dspy.load(str(path), allow_pickle=True)
    if not isinstance(program, ChatEval):
        raise ConfigError(f"{path} holds a {type(program).__name__}, not a chateval-dspy evaluator")
    return program


def unpickle_model(uri: str, trust_pickle: bool) -> ChatEval:
    """The program of an MLflow dspy-flavour model (a pickle), if trusted."""
    refuse_pickle(uri, trust_pickle)
    import mlflow

    previous = os.environ.get("MLFLOW_ALLOW_PICKLE_DESERIALIZATION")
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "true"  # the caller trusts this one model only
    try:
        return mlflow.dspy.load_model(uri)
    finally:
        os.environ.pop("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", None)
        if previous is not None:
            os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = previous


def trusted(program: ChatEval) -> ChatEval:
    """A trusted, unpickled program held to ``DebateConfig``'s checks (which unpickling skips) and stripped of any
    LM or call settings: the caller trusted the code, not an LM or a budget chosen by whoever wrote it."""
    DebateConfig.from_dict(program.config.to_dict())
    for name, predictor in program.named_predictors():
        if predictor.lm is not None or predictor.config:
            log.warning("%s: dropping the LM and call settings the pickled program carried", name)
        predictor.lm, predictor.config = None, {}
    return program
