"""Simulated referees: an LM whose pairwise verdicts follow a stated generative model with a known answer.

The embedded model has no judging signal, so no run on it can show that tuning or search recovers any. This
engine plants signal of a known size instead, keyed on the human label of the judged item, and the study
(``python -m optim.bench simulate``) measures how much of it the product's own machinery finds. It runs behind
DSPy's real adapter (``ScriptedEngine``), so prompts, demos, JSON schemas and parsing are those of a real run.

The model (every symbol is a field of ``SimKnobs``). A call shows a referee with persona ``r`` an item whose
answer in the first position is the better one (``L = 1``) or the second (``L = 2``), known from a table of the
judged texts given at construction (never from the product). ``k+`` and ``k-`` are the demonstrations in the
prompt whose stated leaning is right and wrong about their own item, ``key`` whether the instructions contain
``instruction_key``::

    p      = min(ceiling, max(0, accuracy[r] + instruction_gain * key + demo_gain * k+ - demo_loss * k-))
    d      = difficulty_spread * u, u uniform from a hash of seed and the item's texts (either order)
    p_item = 0.5 + (p - 0.5) * (1 - d)            (p itself when d = 0)
    herd   with probability herding, if the discussion states any leaning:
                 the leaning stated most often in it (on a tie, the latest stated)
    first  else, with probability position_bias: answer 1, whatever L is
    longer else, when the two answers differ in length, with probability verbosity_bias: the longer one
    own    else: L with probability p_item, the other answer with probability 1 - p_item

Difficulty belongs to the item: every referee of a panel and both answer orders see the same ``d``, so a hard item
splits the panel's votes as a coin would, and how much a panel agrees carries real information about whether its
verdict is right.

A verdict states its answer as the preference, with scores ``(6 + m // 2, 6 - (m - m // 2))`` towards it
(``m = margin_right`` for an ``own`` verdict that is right, else ``margin_wrong``), so ``--aggregate mean`` weighs a
sure referee more. A talk turn states the same kind of leaning ("I lean to answer 1."), and a summary states the
discussion's leaning by the herd rule, so herding works through every strategy's visibility rule. Instruction
proposals (MIPROv2's ``proposed_instruction``, GEPA's ``new_instruction``) contain ``instruction_key`` with
probability ``propose_rate``: that is what instruction search can find.

Every draw is a uniform number from a hash of ``seed``, the persona, the judged texts in their order and the step
(the herd draw also hashes the discussion, a proposal's its whole prompt), so a rerun gives the same verdicts. The
``own`` draw ignores demos, instructions, the discussion and difficulty (common random numbers): raising ``p`` turns
wrong verdicts right and never the reverse, so a before/after comparison on the same items measures the effect,
not fresh noise. The two answer orders of an item and the personas of a panel draw independently.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import dspy

from chateval_dspy.testing.fake_lm import FIELD, Call, ScriptedEngine, schema_filler

PAIR = ("question", "answer_1", "answer_2")
# How a leaning reads in a discussion: a verdict ("Prefers: answer 2."), a talk turn or a summary.
LEANING = re.compile(r"(?:Prefers: answer|lean(?:s)? to answer) ([12])\b")
CALL_LOG = 1000  # the engine keeps only its latest calls: a study makes hundreds of thousands


@dataclass(frozen=True)
class SimKnobs:
    """The simulated referees' generative model (equations in the module docstring).

    Args:
        accuracy: ``(role slug, p)`` pairs; the default makes the Scientist clearly the strongest.
        default_accuracy: ``p`` of a persona not listed (custom or same-role referees).
        verbosity_bias: Length counts characters, stripped; answers of equal length are never decided by it.
        difficulty_spread: The largest item difficulty: each item's ``d`` is uniform on ``[0, difficulty_spread]``.
        margin_wrong: Score margin of every verdict but a right ``own`` one (wrong, biased or herded).

    Example:
        >>> SimKnobs().p("scientist", right_demos=2, keyed=True)
        0.95
    """

    accuracy: tuple[tuple[str, float], ...] = (("general_public", 0.6), ("critic", 0.6), ("news_author", 0.6),
                                                ("psychologist", 0.6), ("scientist", 0.8))
    default_accuracy: float = 0.6
    position_bias: float = 0.0
    verbosity_bias: float = 0.0
    herding: float = 0.0
    demo_gain: float = 0.04
    demo_loss: float = 0.04
    instruction_key: str = "verify every claim"
    instruction_gain: float = 0.15
    propose_rate: float = 0.3
    ceiling: float = 0.95
    difficulty_spread: float = 0.0
    margin_right: int = 3
    margin_wrong: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        probabilities = [p for _, p in self.accuracy] + [self.default_accuracy, self.position_bias, self.herding,
                                                         self.verbosity_bias, self.propose_rate, self.ceiling,
                                                         self.difficulty_spread]
        if not all(0.0 <= p <= 1.0 for p in probabilities):
            raise ValueError(f"accuracies, rates and the ceiling must lie in [0, 1]: {self}")
        if not (1 <= self.margin_right <= 8 and 1 <= self.margin_wrong <= 8):
            raise ValueError("margins must lie in 1..8 (scores are 1-10 around 6)")
        object.__setattr__(self, "accuracy", tuple((str(k), float(v)) for k, v in self.accuracy))

    @classmethod
    def no_signal(cls, seed: int = 0) -> SimKnobs:
        """Every knob at "no signal": coin-flip referees that nothing can improve.

        Example:
            >>> SimKnobs.no_signal().p("scientist", right_demos=4, keyed=True)
            0.5
        """
        return cls(accuracy=(), default_accuracy=0.5, demo_gain=0.0, demo_loss=0.0, instruction_gain=0.0,
                   margin_right=2, margin_wrong=2, seed=seed)

    def p(self, slug: str | None, *, right_demos: int = 0, wrong_demos: int = 0, keyed: bool = False) -> float:
        """The first equation of the model: a persona's chance that its own verdict is right."""
        raw = (dict(self.accuracy).get(slug or "", self.default_accuracy) + self.instruction_gain * keyed
               + self.demo_gain * right_demos - self.demo_loss * wrong_demos)
        return round(min(self.ceiling, max(0.0, raw)), 12)

    @staticmethod
    def harder(p: float, d: float) -> float:
        """The second equation of the model: ``p`` on an item of difficulty ``d`` (``p`` itself at ``d = 0``).

        Example:
            >>> SimKnobs.harder(0.9, 0.5), SimKnobs.harder(0.9, 1.0), SimKnobs.harder(0.9, 0.0)
            (0.7, 0.5, 0.9)
        """
        if not d:  # exactly p, so that a zero spread changes no verdict by a rounding error
            return p
        return round(0.5 + (p - 0.5) * (1.0 - d), 12)

    def replace(self, **changes) -> SimKnobs:
        return replace(self, **changes)


def pair_key(question: str, first: str, second: str) -> str:
    """What identifies a judged pair in a given order (the texts as the prompt shows them)."""
    return hashlib.sha256("\x1f".join(t.strip() for t in (question, first, second)).encode()).hexdigest()


def label_table(items: Iterable[dspy.Example]) -> dict[str, str]:
    """Judged texts -> the better answer's position, for both orders of every labelled item.

    Example:
        >>> item = dspy.Example(question="q", answer_1="a", answer_2="b", label="2")
        >>> sorted(label_table([item]).values())
        ['1', '2']
    """
    table = {}
    for x in items:
        if x.get("label") in ("1", "2"):
            table[pair_key(x.question, x.answer_1, x.answer_2)] = x.label
            table[pair_key(x.question, x.answer_2, x.answer_1)] = "2" if x.label == "1" else "1"
    return table


def synthetic_items(n: int, *, seed: int = 0, prefix: str = "sim") -> list[dspy.Example]:
    """``n`` pairwise items with balanced labels (``1``, ``2`` alternately) and texts unique to ``seed``.

    Example:
        >>> [x.label for x in synthetic_items(4)]
        ['1', '2', '1', '2']
    """
    items = []
    for i in range(n):
        tag = f"{prefix}-{seed}-{i}"
        items.append(dspy.Example(id=tag, question=f"Question {tag}: which answer serves the user better?",
                                  answer_1=f"First answer to {tag}.", answer_2=f"Second answer to {tag}.",
                                  label="1" if i % 2 == 0 else "2").with_inputs(*PAIR))
    return items


def prevailing(text: str) -> str | None:
    """The leaning stated most often in a discussion (on a tie, the latest stated); None if none is.

    Example:
        >>> prevailing("[A, round 1]: I lean to answer 2. [B, round 1]: I lean to answer 1.")
        '1'
    """
    said = LEANING.findall(text)
    if not said:
        return None
    counts = collections.Counter(said)
    if counts["1"] != counts["2"]:
        return "1" if counts["1"] > counts["2"] else "2"
    return said[-1]


@dataclass
class SimReferees:
    """The responder of the simulated LM: ``Call -> output fields``, following ``knobs``.

    ``labels`` is ``label_table(items)`` of every item the simulator may be shown (demos' items too); ``personas``
    maps persona text -> role slug for per-persona accuracies (one not listed gets ``knobs.default_accuracy``).
    """

    knobs: SimKnobs
    labels: Mapping[str, str]
    personas: Mapping[str, str] = field(default_factory=dict)

    def draw(self, *parts: str) -> float:
        """A uniform number in [0, 1) from the seed and ``parts``."""
        text = "\x1f".join((str(self.knobs.seed), *parts))
        return int(hashlib.sha256(text.encode()).hexdigest()[:13], 16) / 16 ** 13

    def difficulty(self, question: str, first: str, second: str) -> float:
        """The item's difficulty ``d``: the same in both answer orders and for every referee."""
        if not self.knobs.difficulty_spread:
            return 0.0
        return self.knobs.difficulty_spread * self.draw("difficulty", question.strip(), *sorted((first.strip(), second.strip())))

    def label_of(self, fields: Mapping[str, str]) -> str | None:
        if not all(k in fields for k in PAIR):
            return None
        return self.labels.get(pair_key(*(fields[k] for k in PAIR)))

    @staticmethod
    def longer(first: str, second: str) -> str | None:
        """``"1"`` or ``"2"``: the longer answer (stripped); None when both are as long.

        Example:
            >>> SimReferees.longer("short", "much longer"), SimReferees.longer("ab", "cd")
            ('2', None)
        """
        a, b = len(first.strip()), len(second.strip())
        return None if a == b else ("1" if a > b else "2")

    def demos(self, call: Call) -> tuple[int, int]:
        """Demonstrations in the prompt whose leaning is right and wrong about their own item."""
        right = wrong = 0
        history = list(call.history)
        for (role, user), (next_role, answer) in zip(history, history[1:]):
            if role != "user" or next_role != "assistant":
                continue
            label = self.label_of({k: v.strip() for k, v in FIELD.findall(user)})
            leaning = _leaning_of(answer)
            if label is None or leaning is None:
                continue
            right += leaning == label
            wrong += leaning != label
        return right, wrong

    def decide(self, call: Call, step: str) -> tuple[str, str] | None:
        """``(answer, source)`` for a talk or verdict turn; source is ``herd``, ``first``, ``longer``, ``right`` or
        ``wrong``."""
        label = self.label_of(call.inputs)
        if label is None:
            return None
        k, persona = self.knobs, call.inputs.get("persona", "")
        texts = [call.inputs[f] for f in PAIR]
        seen = prevailing(call.inputs.get("discussion", ""))
        if seen is not None and self.draw("herd", step, persona, *texts, call.inputs.get("discussion", "")) < k.herding:
            return seen, "herd"
        if self.draw("first", step, persona, *texts) < k.position_bias:
            return "1", "first"
        longer = self.longer(texts[1], texts[2])
        if longer is not None and self.draw("longer", step, persona, *texts) < k.verbosity_bias:
            return longer, "longer"
        right, wrong = self.demos(call)
        p = k.p(self.personas.get(persona), right_demos=right, wrong_demos=wrong,
                keyed=k.instruction_key.lower() in call.system.lower())
        p = k.harder(p, self.difficulty(*texts))
        if self.draw("own", step, persona, *texts) < p:
            return label, "right"
        return ("2" if label == "1" else "1"), "wrong"

    def __call__(self, call: Call) -> dict | str:
        if call.kind == "summary":
            lean = prevailing(call.inputs.get("discussion", ""))
            return {"summary": f"The panel leans to answer {lean}." if lean else "The panel states no leaning."}
        proposal = next((f for f in ("proposed_instruction", "new_instruction") if f in call.outputs), None)
        if proposal is not None:
            return {**schema_filler(call), proposal: self.propose(call)}
        if call.kind not in ("argument", "verdict"):
            return schema_filler(call)
        decided = self.decide(call, call.kind)
        if decided is None:  # an item the simulator was not told about: no opinion
            return schema_filler(call) if call.kind == "verdict" else {"argument": "I have no view."}
        answer, source = decided
        if call.kind == "argument":
            return {"argument": f"I lean to answer {answer}."}
        m = self.knobs.margin_right if source == "right" else self.knobs.margin_wrong
        high, low = 6 + m // 2, 6 - (m - m // 2)
        scores = (high, low) if answer == "1" else (low, high)
        out = {"evidence": f"simulated verdict ({source})", "preference": answer, "score_1": scores[0],
               "score_2": scores[1]}
        return {k: v for k, v in out.items() if k in call.outputs} if call.outputs else out

    def propose(self, call: Call) -> str:
        """An instruction proposal: the current one, with ``instruction_key`` added with ``propose_rate``."""
        current = call.inputs.get("current_instruction") or call.inputs.get("basic_instruction") or \
            "Decide which answer serves the user better."
        if self.draw("propose", call.user) < self.knobs.propose_rate:
            return f"{current.strip()} Before deciding, {self.knobs.instruction_key}."
        return f"{current.strip()} Be careful and fair."


def _leaning_of(answer: str) -> str | None:
    """The leaning a demo's output states: its preference, or its talk turn's leaning."""
    try:
        out = json.loads(answer)
    except ValueError:
        out = None
    if isinstance(out, dict):
        if out.get("preference") in ("1", "2"):
            return out["preference"]
        answer = str(out.get("argument", ""))
    found = LEANING.search(answer)
    return found.group(1) if found else None


def builtin_personas() -> dict[str, str]:
    """The built-in roles' pairwise persona texts -> their slugs."""
    from chateval_dspy.program.roles import DEFAULT_ORDER, resolve_roles

    return {r.persona("pairwise"): r.slug for r in resolve_roles(DEFAULT_ORDER, "pairwise")}


def sim_lm(knobs: SimKnobs, items: Iterable[dspy.Example], personas: Mapping[str, str] | None = None) -> dspy.LM:
    """A ``dspy.LM`` of simulated referees who know the labels of ``items`` (every labelled item they may see,
    demos' included; cache off, as ``fake_lm``). ``personas``: persona text -> slug (default: the built-in roles).
    Its engine keeps only its latest ``CALL_LOG`` calls.

    Example:
        >>> lm = sim_lm(SimKnobs(), synthetic_items(4))
        >>> type(lm.engine.responder).__name__, lm.engine.calls.maxlen
        ('SimReferees', 1000)
    """
    referees = SimReferees(knobs, label_table(items), builtin_personas() if personas is None else dict(personas))
    engine = ScriptedEngine(referees)
    engine.calls = collections.deque(maxlen=CALL_LOG)
    return dspy.LM("sim/referees", engine=engine, cache=False, temperature=0.0, max_tokens=256, num_retries=0)
