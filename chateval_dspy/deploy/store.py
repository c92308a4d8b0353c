"""A compiled evaluator on disk: DSPy JSON state plus a judge card. No pickle.

Layout of a saved evaluator directory::

    program.json   the DSPy state (each predictor's instructions and demos)
    card.json      what it is: config, personas, data and split, optimizer, metrics, model, versions (``card``)
    card.md        the same card for people (``card_md``)

Loading trusts none of it: each file is read up to its size limit before it is parsed, then checked
(``untrusted``) before anything is built from it. Nothing in the directory is executed, and the LM is
always the caller's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from dspy.utils.saving import get_dependency_versions

import chateval_dspy.limits as limits
from chateval_dspy.deploy.card import card_json, fit_card, make_card
from chateval_dspy.deploy.card_md import card_markdown
from chateval_dspy.deploy.untrusted import CARD_FORMAT, check_card, check_loaded, check_program_state
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.chateval import ChatEval, build_evaluator

log = logging.getLogger(__name__)

# make_card lives in ``card``; it is importable from here too, as every card is made to be saved with a program.
__all__ = ["CARD_FILE", "CARD_MD", "PROGRAM_FILE", "load_program", "make_card", "read_card", "read_json_file",
           "save_program"]

PROGRAM_FILE, CARD_FILE, CARD_MD = "program.json", "card.json", "card.md"


def save_program(program: ChatEval, directory: str | Path, card: dict) -> Path:
    """Write ``program.json``, ``card.json`` and ``card.md`` into ``directory``.

    ``program.json`` is written from the same checks a loader applies, so nothing is saved that
    ``load_program`` would refuse (too many demos, an instruction over its limit); an LM set on a
    predictor is left out, as the loader's caller chooses the LM. The card is saved as ``fit_card`` makes it.
    """
    directory = Path(directory)
    card = fit_card(card, directory / CARD_FILE)
    dumped = json.loads(json.dumps(program.dump_state(), default=str))
    for name, entry in dumped.items():
        if entry.get("lm") is not None:
            log.warning("%s: its LM is not saved; a saved evaluator runs on the LM its loader passes", name)
            entry["lm"] = None
    state = check_program_state(dumped, program, directory / PROGRAM_FILE)
    # traces and train stay, empty, so that DSPy's own ``Module.load`` still reads the file
    written = {name: {"traces": [], "train": [], **entry} for name, entry in state.items()}
    written["metadata"] = {"dependency_versions": get_dependency_versions()}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PROGRAM_FILE).write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / CARD_FILE).write_text(card_json(card), encoding="utf-8")
    (directory / CARD_MD).write_text(card_markdown(card), encoding="utf-8")
    return directory


def read_json_file(path: Path, limit: int, limit_name: str):
    """The parsed JSON of ``path``, reading at most ``limit`` bytes whatever the file claims to be.

    Raises:
        ConfigError: naming the file: unreadable, not a regular file, over ``limit``, or not JSON.
    """
    return limits.parse_json(limits.read_bounded(path, limit, limit_name), str(path))


def read_card(directory: str | Path) -> dict:
    """The card's JSON, read within ``limits.MAX_CARD_FILE_BYTES`` and of this card format (not yet checked)."""
    path = Path(directory) / CARD_FILE
    if not path.exists():
        raise ConfigError(f"{directory} is not a saved evaluator: cannot read {CARD_FILE} (no such file)")
    card = read_json_file(path, limits.MAX_CARD_FILE_BYTES, "limits.MAX_CARD_FILE_BYTES")
    if not isinstance(card, dict):
        raise ConfigError(f"{path}: malformed card: expected a JSON object, got {type(card).__name__}")
    fmt = card.get("card_format")
    if isinstance(fmt, bool) or fmt != CARD_FORMAT:
        versions = card.get("versions")
        wrote = versions.get("chateval-dspy", "?") if isinstance(versions, dict) else "?"
        raise ConfigError(f"{path} has card format {shown(fmt, 40)}; this chateval-dspy reads format "
                          f"{CARD_FORMAT}. Use the chateval-dspy version that wrote it ({wrote!s:.40})")
    return card


def load_program(directory: str | Path) -> tuple[ChatEval, dict]:
    """Rebuild a saved evaluator and its card. The LM is chosen by the caller, never read from the files.

    Raises:
        ConfigError: the directory is not a saved evaluator, or a file breaks a rule or a limit
            (see ``limits`` and the module's docstring); the message names the file and the key.
    """
    directory = Path(directory)
    card = read_card(directory)
    config, roles = check_card(card, directory / CARD_FILE)
    program = build_evaluator(config, roles)
    path = directory / PROGRAM_FILE
    if not path.exists():
        raise ConfigError(f"{directory} has a card but no {PROGRAM_FILE}")
    state = check_program_state(read_json_file(path, limits.MAX_PROGRAM_FILE_BYTES, "limits.MAX_PROGRAM_FILE_BYTES"),
                                program, path)
    try:
        program.load_state(state)
    except Exception as exc:  # the state was checked above; DSPy failing on it anyway is still the file's fault
        raise ConfigError(f"{path}: not a valid program state for this card ({type(exc).__name__}: {exc})") from exc
    check_loaded(program, path)
    return program, card
