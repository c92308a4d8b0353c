"""The scripted three-referee panel of the ablation tests (test_ablate, test_run_lifecycle): one referee always
right, one right on four items, one always wrong."""

from __future__ import annotations

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.program.roles import role_library
from chateval_dspy.testing.fake_lm import Call

GOOD, PARTLY, BAD = "general_public", "critic", "scientist"
PANEL = DebateConfig(roles=(GOOD, PARTLY, BAD), turns=1, calibrate=False, aggregate="mean")
DATA = DataSpec("faireval", split="test", limit=10, resamples=200)  # fewer resamples: the suite stays quick
SCORES = {"1": (10, 1), "2": (1, 10), "tie": (5, 5)}
WRONG = {"1": (1, 10), "2": (10, 1), "tie": (10, 1)}


def panel_script(data: DataSpec, config: DebateConfig):
    """A responder that knows each item's human label: the first referee is always right, the second right on
    the first 4 items not labelled a tie (and even-handed, 5-5, elsewhere), the third always wrong.

    Averaged (aggregate 'mean'), the full panel is right on exactly those 4 items; without the third referee
    it is right on all of them (the first referee outweighs an even-handed second, and two 5-5s make a tie).
    """
    items, _ = data.items()
    labels = {(x.question, x.answer_1, x.answer_2): x.label for x in items}
    sure = [x.id for x in items if x.label != "tie"][:4]
    assert len(sure) == 4
    sure_texts = {(x.question, x.answer_1, x.answer_2) for x in items if x.id in sure}
    who = {role_library()[slug].persona(config.task_spec).strip(): slug for slug in config.roles}

    def respond(call: Call) -> dict:
        assert call.kind == "verdict", call.kind  # one turn: every call is a verdict
        key = (call.inputs["question"], call.inputs["answer_1"], call.inputs["answer_2"])
        label, slug = labels[key], who[call.inputs["persona"]]
        if slug == GOOD or (slug == PARTLY and key in sure_texts):
            s1, s2 = SCORES[label]
        elif slug == PARTLY:
            s1, s2 = 5, 5
        else:
            s1, s2 = WRONG[label]
        return {"evidence": f"{slug} on {label}", "score_1": s1, "score_2": s2}
    return respond
