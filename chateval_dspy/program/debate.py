"""The debate: N referees over T rounds, under one strategy. The only debate loop.

Rounds before the last are talk (``argue``); in the last each referee gives its verdict (``judge``). A verdict
that fails to parse after the retries, or a failed or timed-out LM call, is that referee's abstention with its
reason, never a score. Cost and consensus stop: docs/architecture.md; deadlines: docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time

import dspy
from dspy.utils.exceptions import AdapterParseError, LMAuthError, LMConfigurationError

from chateval_dspy.concurrency import parallel_map
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import FatalLMError, cause_of
from chateval_dspy.lm.adapter import placement
from chateval_dspy.lm.engine import DEADLINE_CAUSE, DeadlineExceeded, bounds_of, deadline_in, within_deadline
from chateval_dspy.program.aggregate import vote
from chateval_dspy.program.debater import Debater
from chateval_dspy.program.roles import Role
from chateval_dspy.program.signatures import ScoreRangeError, Summarize, check_verdict
from chateval_dspy.program.strategies import STRATEGIES, SUMMARIZER, Utterance, guard, render
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.program.weighting import expected_scores

log = logging.getLogger(__name__)

# Retries of an unparseable output sample at this temperature under a new
# rollout id: at temperature 0 the same prompt would return the same text.
RETRY_TEMPERATURE = 0.7
# Alternatives per token for weighted scores: enough to cover a 1-10 scale's plausible values.
TOP_LOGPROBS = 10


def consensus(task: TaskSpec | str, verdicts: list[dict | None]) -> bool:
    """Whether every referee gave a verdict and they all agree (same preference; same ratings when pointwise).

    Example:
        >>> consensus("pairwise", [{"score_1": 8, "score_2": 3}, {"score_1": 6, "score_2": 5}])
        True
    """
    task = as_task(task)
    if not verdicts or any(v is None for v in verdicts):
        return False
    if task.format == "pairwise":
        return len({vote(v, task) for v in verdicts}) == 1
    return len({tuple(v[a] for a in task.output_fields) for v in verdicts}) == 1


MEASURED = ("started", "seconds", "prompt_tokens", "completion_tokens")


@contextlib.contextmanager
def measured():
    """Fills the yielded dict with the block's start (epoch seconds), duration and the tokens its LM calls used.

    DSPy's usage trackers nest: the block's calls still count in the item's own tracker.
    """
    took: dict = {}
    started, clock = time.time(), time.perf_counter()
    with dspy.track_usage() as usage:
        try:
            yield took
        finally:
            totals = usage.get_total_tokens().values()
            took.update(started=started, seconds=round(time.perf_counter() - clock, 4),
                        prompt_tokens=sum(t.get("prompt_tokens") or 0 for t in totals) if totals else None,
                        completion_tokens=sum(t.get("completion_tokens") or 0 for t in totals) if totals else None)


def static_key(predictor: dspy.Predict) -> tuple:
    """What a predictor's static part holds: its instructions and demonstrations (equal keys, equal leading bytes).

    Example:
        >>> from chateval_dspy.program.signatures import signatures_for
        >>> a, b = dspy.Predict(signatures_for("pairwise")[0]), dspy.Predict(signatures_for("pairwise")[0])
        >>> static_key(a) == static_key(b), static_key(a) == static_key(dspy.Predict(a.signature.with_instructions("x")))
        (True, False)
    """
    demos = tuple(json.dumps(dict(d.items()) if hasattr(d, "items") else d, sort_keys=True, default=str)
                  for d in predictor.demos)
    return predictor.signature.instructions, demos


class Debate(dspy.Module):
    """A panel of debaters (``roles``, in speaking order) composed by a strategy.

    Example:
        >>> from chateval_dspy.program.roles import resolve_roles
        >>> cfg = DebateConfig(roles=("critic", "scientist"))
        >>> debate = Debate(cfg, resolve_roles(cfg.roles, cfg.format))
        >>> sorted(debate.referees)
        ['critic', 'scientist']
    """

    def __init__(self, config: DebateConfig, roles: list[Role]):
        super().__init__()
        self.config = config
        self.task = config.task_spec
        self.strategy = STRATEGIES[config.strategy]
        self.referees = {role.slug: Debater(role, self.task) for role in roles}
        self.summarizer = dspy.Predict(Summarize) if self.strategy.summarize else None

    def forward(self, **inputs) -> dspy.Prediction:
        cfg, task = self.config, self.task
        # The judged texts here; every generated text when render shows it (the same guard).
        item = {k: guard(inputs[k]) for k in task.input_names}
        transcript: list[Utterance] = []
        verdicts: dict[str, dict | None] = {}
        abstentions: dict[str, str] = {}
        calls = 0
        plan = self.placements()
        for rnd in range(1, cfg.turns + 1):
            final = rnd == cfg.turns
            # With consensus_stop every round ends in scores, so agreement can be checked after each one.
            judging = final or cfg.consensus_stop
            speakers = list(self.referees.values())
            if self.strategy.concurrent_rounds:
                # Nobody in such a round sees another's turn, so the turns are independent.
                seen = render(self.strategy.visible(transcript, rnd))
                turn = functools.partial(self._turn, item=item, seen=seen, final=judging, plan=plan)
                outcomes = parallel_map(turn, speakers, len(speakers))
                transcript.extend(self._utterance(rnd, d, o, judging) for d, o in zip(speakers, outcomes))
            else:
                outcomes = []
                for debater in speakers:
                    seen = render(self.strategy.visible(transcript, rnd))
                    outcome = self._turn(debater, item, seen, judging, plan)
                    outcomes.append(outcome)
                    transcript.append(self._utterance(rnd, debater, outcome, judging))
            for debater, outcome in zip(speakers, outcomes):
                calls += outcome["calls"]
                if judging:
                    verdicts[debater.slug] = outcome["scores"]
                if outcome["abstained"]:
                    abstentions[f"{debater.slug}@{rnd}"] = outcome["abstained"]
            if final or (cfg.consensus_stop and consensus(task, list(verdicts.values()))):
                break
            if self.summarizer is not None:
                calls += 1
                with measured() as took:
                    summary = self._summarize(item, [u for u in transcript if u.round == rnd or u.speaker == SUMMARIZER])
                transcript.append(Utterance(rnd, SUMMARIZER, "Summary", summary, "summary", **took))
        return dspy.Prediction(transcript=transcript, verdicts=verdicts, abstentions=abstentions, calls=calls,
                               rounds=rnd)  # turns >= 1 (DebateConfig), so the loop ran

    def placements(self) -> dict[tuple[str, bool], dict]:
        """Where each referee's calls put its persona and whether they mark the item's texts (``lm.layout``), by
        ``(slug, final)``.

        A referee whose predictor for a step shares its static text with another referee's (an untuned panel)
        keeps its persona after the item's texts, so the two share the bytes through them; otherwise the persona
        joins the static part. The end of the item's texts is marked for Anthropic's cache only where another call
        of the item reads it: a shared predictor's, or the same predictor's in a later round.

        Example:
            >>> from chateval_dspy.program.roles import resolve_roles
            >>> cfg = DebateConfig(roles=("critic", "scientist"), turns=2)
            >>> Debate(cfg, resolve_roles(cfg.roles, cfg.format)).placements()[("critic", True)]
            {'persona_static': False, 'mark_item': True}
        """
        cfg = self.config
        judging = [rnd == cfg.turns or cfg.consensus_stop for rnd in range(1, cfg.turns + 1)]
        out = {}
        for final in {*judging}:
            keys = {slug: static_key(d.judge if final else d.argue) for slug, d in self.referees.items()}
            for slug, key in keys.items():
                shared = sum(k == key for k in keys.values()) > 1
                out[(slug, final)] = {"persona_static": not shared, "mark_item": shared or judging.count(final) > 1}
        return out

    def _turn(self, debater: Debater, item: dict, seen: str, final: bool, plan: dict) -> dict:
        """One referee's turn, with retries: text, scores (verdicts), any abstention reason, and its time and tokens."""
        with measured() as took, placement(**plan[(debater.slug, final)]):
            outcome = self._attempts(debater, item, seen, final)
        return {**outcome, **took}

    def _attempts(self, debater: Debater, item: dict, seen: str, final: bool) -> dict:
        reason = None
        attempts = 1 + self.config.parse_retries
        bounds = bounds_of(dspy.settings.lm)
        for attempt in range(attempts):
            config = {} if attempt == 0 else {"rollout_id": attempt, "temperature": RETRY_TEMPERATURE}
            if final and self.config.weighted_scores:
                config.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
            try:
                call = functools.partial(debater, final=final, config=config, discussion=seen, **item)
                pred = within_deadline(call, bounds)
                if not final:
                    return {"text": pred.argument.strip(), "scores": None, "abstained": None, "calls": attempt + 1}
                scores = check_verdict(self.task, dict(pred))
                if self.config.weighted_scores:
                    scores.update(self._expected(pred))
                return {"text": pred.evidence.strip(), "scores": scores, "abstained": None, "calls": attempt + 1}
            except DeadlineExceeded as exc:
                # Out of time: a parse retry would only be cut short too.
                log.warning("%s: %s", debater.slug, exc)
                return {"text": "", "scores": None, "abstained": DEADLINE_CAUSE,
                        "calls": attempt + (1 if exc.started else 0)}
            except (LMAuthError, LMConfigurationError) as exc:
                raise FatalLMError(f"the LM refused the request ({type(exc).__name__}): {exc}") from exc
            except (AdapterParseError, ScoreRangeError) as exc:
                # Only the LM's output can become an abstention; any other error (no LM configured,
                # a bad config) is the caller's to fix and propagates.
                reason = "parse_failure" if isinstance(exc, AdapterParseError) else "score_out_of_range"
                log.warning("%s: unparseable %s (attempt %d/%d): %s", debater.slug,
                            "verdict" if final else "argument", attempt + 1, attempts, str(exc)[:200])
            except dspy.utils.exceptions.LMError as exc:
                # Our own FatalLMError (a server that died twice) inside DSPy's wrapping must stop the run.
                fatal = cause_of(exc, FatalLMError)
                if fatal is not None:
                    raise fatal from exc
                # Transport faults were already retried inside the LM client; record and move on.
                reason = DEADLINE_CAUSE if deadline_in(exc) else f"lm_error:{type(exc).__name__}"
                log.warning("%s: LM call failed: %s", debater.slug, str(exc)[:200])
                return {"text": "", "scores": None, "abstained": reason, "calls": attempt + 1}
        return {"text": "", "scores": None, "abstained": reason, "calls": attempts}

    def _expected(self, pred: dspy.Prediction) -> dict:
        """``{"expected": {...}}`` from the verdict's token log-probabilities, or {} when the LM gave none."""
        content = (getattr(pred, "logprobs", None) or {}).get("content")
        expected = expected_scores(content, self.task.ordinal_ranges) if content else {}
        return {"expected": expected} if expected else {}

    def _utterance(self, rnd: int, debater: Debater, outcome: dict, final: bool) -> Utterance:
        text = outcome["text"] or f"(no {'verdict' if final else 'argument'}: {outcome['abstained']})"
        if final and outcome["scores"]:
            scores = dict(outcome["scores"])
            stated = scores.pop("preference", None)
            scores.pop("expected", None)
            prefix = f" Prefers: {'a tie' if stated == 'tie' else 'answer ' + stated}." if stated else ""
            text = f"{text}{prefix} Scores: " + ", ".join(f"{k}={v}" for k, v in scores.items())
        return Utterance(rnd, debater.slug, debater.name, text, "verdict" if final else "argument",
                         **{k: outcome.get(k) for k in MEASURED})

    def _summarize(self, item: dict, shown: list[Utterance]) -> str:
        call = functools.partial(self.summarizer, material=self.task.material_text(item), discussion=render(shown))
        try:
            # The material is read again by the next summary only when there is one.
            with placement(persona_static=False, mark_item=self.config.turns > 2):
                return within_deadline(call, bounds_of(dspy.settings.lm)).summary.strip()
        except (AdapterParseError, dspy.utils.exceptions.LMError, DeadlineExceeded) as exc:
            fatal = cause_of(exc, FatalLMError)
            if fatal is not None:
                raise fatal from exc
            # A lost summary costs the next round its context, not the item its verdict.
            log.warning("summarizer failed: %s", str(exc)[:200])
            return f"(no summary: {'deadline' if deadline_in(exc) else type(exc).__name__})"
