"""What the MLflow judge says about one verdict, as plain data (no MLflow): each Feedback's parts
(``feedback_parts``; what each means: ``deploy.mlflow.judge``), the judge's instructions in words and its value type.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping

from chateval_dspy.program.confidence import NEEDS_PERSON
from chateval_dspy.run.tracing import dumps, preference_name

MAX_RATIONALE_CHARS = 8000
ABSTAINED_CODE = "CHATEVAL_ABSTAINED"
SCORER_TRACE_ID = "mlflow.assessment.scorerTraceId"  # mlflow.tracing.constant.AssessmentMetadataKey.SCORER_TRACE_ID
PREFERRED = "preferred"  # <name>/preferred/<response or tie>: one boolean per possible preference
AGREEMENT = "agreement"  # <name>/agreement: the panel's preference equals the row's expected one


def panel_rationale(verdict, task, names: Mapping[str, str] | None = None) -> str:
    """The panel's rationale: its verdict, then (pairwise) each answer order with what each referee voted, its
    scores and its evidence; (pointwise) each referee's evidence.

    Example:
        >>> from types import SimpleNamespace
        >>> from chateval_dspy.program.task import as_task
        >>> v = SimpleNamespace(winner="1", scores={"answer_1": 8.0, "answer_2": 3.5}, consistent=True,
        ...                     abstained=None, rationales={"critic": ["Answer 1 is right.", "Answer 2 is right."]},
        ...                     referees={"critic": [{"score_1": 8, "score_2": 3}, {"score_1": 7, "score_2": 4}]})
        >>> print(panel_rationale(v, as_task("pairwise"), {"critic": "Critic"}))
        Panel: prefers answer_1 (answer_1 8, answer_2 3.5); both answer orders agree.
        Order 1 (answers as given):
        - Critic prefers answer_1 (answer_1 8, answer_2 3): Answer 1 is right.
        Order 2 (answers swapped, answer_2 shown first; votes and scores name the answers as given):
        - Critic prefers answer_1 (answer_1 7, answer_2 4): Answer 2 is right.
    """
    names = names or {}
    lines = [_panel_head(verdict, task)]
    if task.format == "pairwise":
        lines += _order_lines(verdict, task, names)
    else:
        for slug, texts in (verdict.rationales or {}).items():
            lines += [f"{names.get(slug, slug)}: {text}" for text in texts]
    text = "\n".join(lines)
    return text if len(text) <= MAX_RATIONALE_CHARS else text[:MAX_RATIONALE_CHARS] + " [...]"


def _panel_head(verdict, task) -> str:
    pairwise = task.format == "pairwise"
    scores = ", ".join(f"{k} {_num(v)}" for k, v in (verdict.scores or {}).items())
    trust = confidence_text(verdict)
    if verdict.abstained == NEEDS_PERSON:
        withheld = getattr(verdict, "withheld", None)
        leaned = _said(withheld, task) if pairwise else ", ".join(f"{k} {_num(v)}" for k, v in (withheld or {}).items())
        return (f"Panel: no verdict ({NEEDS_PERSON}: {trust} is below the calibrated threshold, so a person "
                f"judges this item; the panel's withheld verdict: {leaned}).")
    trust = f"; {trust}" if trust else ""
    if verdict.abstained and (verdict.winner is None if pairwise else not verdict.scores):
        return f"Panel: no verdict ({verdict.abstained})."
    if not pairwise:
        return f"Panel: {scores}{trust}."
    agree = {True: "; both answer orders agree", False: "; the two answer orders disagree"}.get(verdict.consistent, "")
    return f"Panel: {_said(verdict.winner, task)}{f' ({scores})' if scores else ''}{agree}{trust}."


def confidence_text(verdict) -> str:
    """A verdict's confidence in words ("" without one): calibrated (a probability that people agree) or raw.

    Example:
        >>> from types import SimpleNamespace
        >>> confidence_text(SimpleNamespace(confidence=0.8734, confidence_calibrated=True))
        'confidence 0.873 (calibrated: the probability that people agree)'
        >>> confidence_text(SimpleNamespace(confidence={"coherence": 0.5}, confidence_calibrated=False))
        'confidence coherence 0.500 (raw, not calibrated)'
    """
    confidence = getattr(verdict, "confidence", None)
    if confidence is None:
        return ""
    figures = ", ".join(f"{k} {v:.3f}" for k, v in confidence.items()) if isinstance(confidence, Mapping) \
        else f"{confidence:.3f}"
    kind = "calibrated: the probability that people agree" if getattr(verdict, "confidence_calibrated", False) \
        else "raw, not calibrated"
    return f"confidence {figures} ({kind})"


def _said(winner: str | None, task) -> str:
    if winner is None:
        return "gave no verdict"
    return "calls a tie" if winner == "tie" else f"prefers {preference_name(winner, task)}"


def _order_lines(verdict, task, names: Mapping[str, str]) -> list[str]:
    """Each answer order's heading, then each referee's vote, scores and evidence in that order (votes and scores
    name the answers as given; a referee's own words name positions as it read them)."""
    rationales, referees = verdict.rationales or {}, getattr(verdict, "referees", None) or {}
    slugs = list(dict.fromkeys([*rationales, *referees]))
    orders = max((len(v) for v in (*rationales.values(), *referees.values())), default=0)
    second = task.responses[1]
    lines = []
    for o in range(orders):
        lines.append("Order 1 (answers as given):" if o == 0 else
                     f"Order 2 (answers swapped, {second} shown first; votes and scores name the answers as given):")
        for slug in slugs:
            texts, verdicts = rationales.get(slug) or [], referees.get(slug) or []
            said = _referee_said(verdicts[o] if o < len(verdicts) else None, task)
            text = f": {texts[o]}" if o < len(texts) else ""
            lines.append(f"- {names.get(slug, slug)} {said}{text}")
    return lines


def _referee_said(verdict: dict | None, task) -> str:
    """A referee's verdict in words: its vote and its scores per response (``prefers answer_1 (answer_1 8, ...)``)."""
    from chateval_dspy.program.aggregate import vote

    if not isinstance(verdict, Mapping):
        return "gave no verdict"
    try:
        said = _said(vote(dict(verdict), task), task)
    except (KeyError, TypeError, ValueError):  # a verdict without the scores its vote is made of
        said = "voted"
    scores = []
    for c in task.criteria:
        got = [(r, verdict.get(f"{c.name}_{n}")) for n, r in enumerate(task.responses, start=1)]
        if all(v is not None for _, v in got):
            pairs = ", ".join(f"{r} {_num(v)}" for r, v in got)
            scores.append(pairs if len(task.criteria) == 1 else f"{c.name}: {pairs}")
    return f"{said} ({'; '.join(scores)})" if scores else said


def _num(v):
    return f"{v:g}" if isinstance(v, float) else str(v)


def feedback_metadata(verdict, task, *, model: str | None = None, trace_id: str | None = None) -> dict[str, str]:
    """What every Feedback of one verdict carries as metadata (text values, as MLflow keeps them)."""
    metadata = {"chateval.referees": dumps(verdict.referees), "chateval.scores": dumps(verdict.scores),
                "chateval.calls": str(verdict.calls), "chateval.prompt_tokens": str(verdict.prompt_tokens),
                "chateval.completion_tokens": str(verdict.completion_tokens), "chateval.seconds": str(verdict.seconds),
                "chateval.task": task.name}
    if verdict.consistent is not None:
        metadata["chateval.consistent"] = str(verdict.consistent).lower()
    if getattr(verdict, "criteria", None) is not None:
        metadata["chateval.criteria"] = dumps(verdict.criteria)
    if verdict.abstained:
        metadata["chateval.abstained"] = str(verdict.abstained)
    if getattr(verdict, "confidence", None) is not None:
        metadata["chateval.confidence"] = dumps(verdict.confidence)
        metadata["chateval.raw_confidence"] = dumps(verdict.raw_confidence)
        metadata["chateval.confidence_calibrated"] = str(bool(verdict.confidence_calibrated)).lower()
    if getattr(verdict, "withheld", None) is not None:
        metadata["chateval.withheld"] = dumps(verdict.withheld)
    if getattr(verdict, "stages_run", None):  # a cascade's verdict: which stage gave it, which judged the item
        metadata["chateval.stage"] = str(verdict.stage)
        metadata["chateval.stages_run"] = dumps(verdict.stages_run)
    if model:
        metadata["chateval.model"] = model
    if trace_id:
        metadata[SCORER_TRACE_ID] = metadata["chateval.trace_id"] = trace_id
    return metadata


def _part(name: str, value, rationale: str, metadata: dict, error: str | None = None) -> dict:
    return {"name": name, "value": value, "rationale": rationale, "metadata": dict(metadata), "error": error}


def feedback_parts(verdict, task, *, name: str = "chateval", per_criterion: bool | None = None,
                   names: Mapping[str, str] | None = None, model: str | None = None,
                   trace_id: str | None = None, expected: str | None = None) -> list[dict]:
    """What each Feedback of one verdict holds: ``{name, value, rationale, metadata, error}`` (metadata as text);
    ``expected``: the row's expected preference (pairwise), for ``<name>/agreement``.

    Example:
        >>> from types import SimpleNamespace
        >>> from chateval_dspy.program.task import as_task
        >>> v = SimpleNamespace(winner="2", scores={"answer_1": 3.0, "answer_2": 8.0}, consistent=False,
        ...     abstained=None, rationales={}, referees={"critic": [{"score_1": 3, "score_2": 8}]}, calls=4,
        ...     prompt_tokens=100, completion_tokens=10, seconds=0.2,
        ...     criteria={"score": {"answer_1": 3.0, "answer_2": 8.0}})
        >>> [(p["name"], p["value"]) for p in feedback_parts(v, as_task("pairwise"), expected="1")]
        [('chateval', 'answer_2'), ('chateval/preferred/answer_1', False), ('chateval/preferred/answer_2', True),
         ('chateval/preferred/tie', False), ('chateval/agreement', False)]
        >>> [p["name"] for p in feedback_parts(v, as_task("pairwise"), per_criterion=True)][:2]
        ['chateval', 'chateval/score']
    """
    pairwise = task.format == "pairwise"
    per_criterion = (not pairwise) if per_criterion is None else per_criterion
    rationale = panel_rationale(verdict, task, names)
    metadata = feedback_metadata(verdict, task, model=model, trace_id=trace_id)
    missing = f"no verdict: {verdict.abstained or 'every referee abstained'}"

    def part(part_name, value):
        return _part(part_name, value, rationale, metadata, missing if value is None else None)

    if not pairwise:
        if per_criterion and len(task.criteria) > 1:
            return [part(f"{name}/{c.name}", (verdict.scores or {}).get(c.name)) for c in task.criteria]
        if per_criterion:
            return [part(name, (verdict.scores or {}).get(task.criteria[0].name))]
        return [part(name, dict(verdict.scores) if verdict.scores else None)]
    parts = [part(name, preference_name(verdict.winner, task))]
    if per_criterion:
        parts += [part(f"{name}/{c.name}", (verdict.criteria or {}).get(c.name)) for c in task.criteria]
    return parts + preference_parts(verdict, task, name=name, expected=expected, metadata=metadata)


def preference_parts(verdict, task, *, name: str, expected: str | None = None, metadata: dict | None = None) -> list[dict]:
    """The yes/no Feedbacks that ``mlflow.genai.evaluate`` averages into a pairwise run's metrics (it averages no
    category): ``<name>/preferred/<response or tie>`` (an abstention is false in all three, so the shares and the
    abstentions add up to one) and, with an ``expected`` preference, ``<name>/agreement`` (an abstention disagrees,
    as in ``chateval evaluate``'s accuracy; a verdict withheld as ``needs_person`` has no agreement value)."""
    metadata = metadata or {}
    said = preference_name(verdict.winner, task)
    because = f"The panel {_said(verdict.winner, task)}" + (f" ({verdict.abstained})." if said is None else ".")
    parts = [_part(f"{name}/{PREFERRED}/{option}", said == option, because, metadata)
             for option in (*task.responses, "tie")]
    if expected is not None and verdict.abstained == NEEDS_PERSON:  # withheld for a person: agreement is over given ones
        parts.append(_part(f"{name}/{AGREEMENT}", None, f"{because[:-1]}; a person judges it.", metadata,
                           f"no verdict: {NEEDS_PERSON}"))
    elif expected is not None:
        parts.append(_part(f"{name}/{AGREEMENT}", verdict.winner == expected,
                           f"{because[:-1]}; expected: {preference_name(expected, task)}.", metadata))
    return parts


def instructions_of(judge) -> str:
    """What the panel judges, in words (the MLflow judge's ``instructions``).

    Example:
        >>> from types import SimpleNamespace
        >>> from chateval_dspy.config import DebateConfig
        >>> print(instructions_of(SimpleNamespace(config=DebateConfig(roles=("critic",), turns=1))))
        ChatEval panel on task 'faireval' (pairwise): referees critic debate for 1 round(s) (one_by_one) in both
        answer orders; verdicts aggregated by mean. Criteria: score (1-10): overall score of Assistant 1 or 2's
        answer. Inputs: question, answer_1, answer_2.
    """
    cfg = judge.config
    task = cfg.task_spec
    def described(c) -> str:  # a pairwise description is a template per response
        return c.description.replace("{n}", "1 or 2").replace("{response}", "each response")

    criteria = "; ".join(f"{c.name} ({c.scale}): {described(c)}" for c in task.criteria)
    orders = " in both answer orders" if cfg.orders == 2 else ""
    return (f"ChatEval panel on task {task.name!r} ({task.format}): referees {', '.join(cfg.roles)} debate for "
            f"{cfg.turns} round(s) ({cfg.strategy}){orders}; verdicts aggregated by {cfg.aggregate}. "
            f"Criteria: {criteria}. Inputs: {', '.join(task.input_names)}.")


def value_type(task, per_criterion: bool | None = None):
    """The Python type of the main Feedback's value.

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> value_type(as_task("pairwise"))
        typing.Literal['answer_1', 'answer_2', 'tie']
    """
    if task.format == "pairwise":
        return typing.Literal[(*task.responses, "tie")]
    if per_criterion is False:
        return dict
    scale = task.criteria[0].scale
    return typing.Literal[scale.labels] if scale.labels else float
