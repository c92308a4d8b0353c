"""A compiled evaluator on disk: DSPy JSON state plus a judge card. No pickle.

Layout of a saved evaluator directory::

    program.json   the DSPy state (each predictor's instructions and demos)
    card.json      what it is: config, personas, data and split, optimizer, metrics, model, versions (``card``)
    card.md        the same card for people (``card_md``)
    calibration.json  optional: the calibrated confidence and its threshold (``Calibration``), summarised in the card

Loading trusts none of it: each file is read within its size limit, then checked (``untrusted``) before anything is
built from it. Nothing in the directory is executed, and the LM is always the caller's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from dspy.utils.saving import get_dependency_versions

import chateval_dspy.limits as limits
from chateval_dspy.deploy.saved.card import calibration_block, card_json, fit_card
from chateval_dspy.deploy.saved.card_md import card_markdown
from chateval_dspy.deploy.saved.certificate import PARTS, check_certificate, program_digest
from chateval_dspy.deploy.saved.untrusted import CARD_FORMAT, check_card, check_loaded, check_program_state
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.files import write_atomic
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.confidence import Calibration

log = logging.getLogger(__name__)

PROGRAM_FILE, CARD_FILE, CARD_MD, CALIBRATION_FILE = "program.json", "card.json", "card.md", "calibration.json"


def save_program(program: ChatEval, directory: str | Path, card: dict) -> Path:
    """Write ``program.json`` (through the loader's checks, so nothing is saved that ``load_program`` would refuse;
    no LM), ``card.json`` and ``card.md`` (the card as ``fit_card`` makes it) into ``directory``.

    The program's ``calibration`` is saved as ``calibration.json`` and summarised in the card; without one, a
    calibration.json an earlier program left there (fitted to its confidences) is removed.
    """
    directory = Path(directory)
    calibration = getattr(program, "calibration", None)
    dumped = json.loads(json.dumps(program.dump_state(), default=str))
    for name, entry in dumped.items():
        if entry.get("lm") is not None:
            log.warning("%s: its LM is not saved; a saved evaluator runs on the LM its loader passes", name)
            entry["lm"] = None
    state = check_program_state(dumped, program, directory / PROGRAM_FILE)
    block = calibration_block(calibration) if calibration else None
    card = {k: v for k, v in card.items() if k != "calibration"}
    if "certificate" not in card:
        card = _with_certificate(card, directory, program_digest(state), block)
    card = fit_card({**card, "calibration": block} if calibration else card, directory / CARD_FILE)
    # traces and train stay, empty, so that DSPy's own ``Module.load`` still reads the file
    written = {name: {"traces": [], "train": [], **entry} for name, entry in state.items()}
    written["metadata"] = {"dependency_versions": get_dependency_versions()}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PROGRAM_FILE).write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if calibration is not None:
        _write_calibration(directory, calibration)
    else:
        (directory / CALIBRATION_FILE).unlink(missing_ok=True)
    _write_card(directory, card)
    return directory


def _with_certificate(card: dict, directory: Path, digest: str, calibration: dict | None) -> dict:
    """``card`` with the certificate of the evaluator saved in ``directory`` when it was measured on this very
    program (a rerun of the compile or search that saved it); a certificate of another program is dropped, and its
    calibration error when the calibration changes."""
    try:
        old = read_card(directory) if (directory / CARD_FILE).exists() else {}
        if old.get("certificate") is not None:
            check_certificate(old["certificate"], directory / CARD_FILE)
    except ConfigError as exc:
        log.warning("%s: its certificate is not carried over: %s", directory / CARD_FILE, exc)
        return card
    certificate = old.get("certificate")
    if not certificate or certificate.get("program") != digest:
        return card
    if old.get("calibration") != calibration:
        certificate = {k: v for k, v in certificate.items() if k != "calibration"}
    return {**card, "certificate": certificate}


def _write_card(directory: Path, card: dict) -> None:
    write_atomic(directory / CARD_FILE, card_json(card).encode("utf-8"))
    write_atomic(directory / CARD_MD, card_markdown(card).encode("utf-8"))


def _write_calibration(directory: Path, calibration: Calibration) -> None:
    write_atomic(directory / CALIBRATION_FILE,
                 (json.dumps(calibration.to_dict(), indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def save_calibration(directory: str | Path, calibration: Calibration) -> Path:
    """Add ``calibration`` to the saved evaluator in ``directory`` (replacing any): ``calibration.json``, and its
    summary (``card.calibration_block``) in ``card.json`` and ``card.md``. Returns the calibration file's path; a
    ``ConfigError`` when ``directory`` is not a saved evaluator, or its card breaks a rule (``check_card``)."""
    directory = Path(directory)
    card = read_card(directory)
    check_card(card, directory / CARD_FILE)
    if isinstance(card.get("certificate"), dict):  # its calibration error was measured on the calibration replaced
        card["certificate"] = {k: v for k, v in card["certificate"].items() if k != "calibration"}
    card = fit_card({**card, "calibration": calibration_block(calibration)}, directory / CARD_FILE)
    _write_calibration(directory, calibration)
    _write_card(directory, card)
    return directory / CALIBRATION_FILE


def read_calibration(directory: Path, card: dict) -> Calibration | None:
    """The saved evaluator's ``calibration.json`` (None when there is none), checked as untrusted and against the
    card's summary of it (a card must not claim a guarantee its calibration does not make); a ``ConfigError`` naming
    the file and the field otherwise."""
    path = directory / CALIBRATION_FILE
    if not (path.exists() or path.is_symlink()):
        if card.get("calibration") is not None:
            raise ConfigError(f"{directory / CARD_FILE} says the evaluator is calibrated, but {CALIBRATION_FILE} is "
                              "missing: copy the whole directory, or calibrate it again (chateval calibrate)")
        return None
    calibration = Calibration.from_dict(
        read_json_file(path, limits.MAX_CALIBRATION_FILE_BYTES, "limits.MAX_CALIBRATION_FILE_BYTES"), str(path))
    if card.get("calibration") != calibration_block(calibration):
        raise ConfigError(f"{path} does not match the 'calibration' of {directory / CARD_FILE}: one of them was "
                          "changed or copied from another evaluator; calibrate it again (chateval calibrate)")
    return calibration


def check_certified(card: dict, state: dict, directory: Path) -> None:
    """A ``ConfigError`` unless the card's certificate names the program beside it (``program_digest`` of its
    checked state): figures measured on another evaluator must not travel with this one."""
    certificate = card.get("certificate")
    if certificate is not None and certificate["program"] != program_digest(state):
        raise ConfigError(f"{directory / CARD_FILE}: its certificate was measured on another program than "
                          f"{PROGRAM_FILE} (digest {certificate['program']}, the program's {program_digest(state)}): "
                          "one of them was changed or copied; certify it again (chateval certify --program, "
                          "chateval audit) or remove the card's certificate")


def save_certificate(directory: str | Path, part: str, block: dict) -> dict:
    """Put ``block`` as the certificate's ``part`` (one of ``PARTS``) into the card of the evaluator saved in
    ``directory`` (parts measured on another program are dropped) and return the certificate written; a
    ``ConfigError`` when a file breaks a rule, or ``block`` its part's schema."""
    if part not in PARTS:
        raise ConfigError(f"unknown certificate part {part!r}; choose one of: {', '.join(PARTS)}")
    directory = Path(directory)
    card, _, state = _read_checked(directory)
    digest = program_digest(state)
    old = card.get("certificate") or {}
    certificate = {**(old if old.get("program") == digest else {}), "program": digest, part: block}
    _write_card(directory, fit_card({**card, "certificate": certificate}, directory / CARD_FILE))
    return certificate


def read_json_file(path: Path, limit: int, limit_name: str):
    """The parsed JSON of ``path``, read within ``limit`` bytes (a ``ConfigError`` naming the file otherwise)."""
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


def _read_checked(directory: Path) -> tuple[dict, ChatEval, dict]:
    """The card, the program it describes (not yet loaded) and the checked state of ``program.json``."""
    card = read_card(directory)
    config, roles = check_card(card, directory / CARD_FILE)
    program = build_evaluator(config, roles)
    path = directory / PROGRAM_FILE
    if not path.exists():
        raise ConfigError(f"{directory} has a card but no {PROGRAM_FILE}")
    state = check_program_state(read_json_file(path, limits.MAX_PROGRAM_FILE_BYTES, "limits.MAX_PROGRAM_FILE_BYTES"),
                                program, path)
    return card, program, state


def load_program(directory: str | Path) -> tuple[ChatEval, dict]:
    """Rebuild a saved evaluator (its ``calibration`` from ``calibration.json``, or None) and its card, bound to no
    LM; a ``ConfigError`` naming the file and the key when a file breaks a rule or a limit."""
    directory = Path(directory)
    card, program, state = _read_checked(directory)
    path = directory / PROGRAM_FILE
    try:
        program.load_state(state)
    except Exception as exc:  # the state was checked above; DSPy failing on it anyway is still the file's fault
        raise ConfigError(f"{path}: not a valid program state for this card ({type(exc).__name__}: {exc})") from exc
    check_loaded(program, path)
    check_certified(card, state, directory)
    program.calibration = read_calibration(directory, card)
    return program, card
