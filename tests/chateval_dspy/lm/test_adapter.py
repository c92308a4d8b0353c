"""The judge adapter: the cache-friendly layout, the lean format, Anthropic's marks, and tuning through it."""

from __future__ import annotations

import gc
import json

import dspy
import pytest
from repo_paths import TEST_DATA

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.adapter import DebateAdapter, Style, rendering
from chateval_dspy.lm.layout import description
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.signatures import signatures_for
from chateval_dspy.testing.fake_lm import ScriptedEngine, fake_lm

PINNED = TEST_DATA / "prompts.json"
PairwiseVerdict, ScoringArgument = signatures_for("pairwise")[1], signatures_for("pointwise")[0]
INPUTS = {"question": "What is 2+2?", "answer_1": "4", "answer_2": "5", "persona": "You are strict.",
          "discussion": "(nothing yet)"}
ITEM = {"question": "Which is the capital of France?", "answer_1": "Paris, on the Seine.", "answer_2": "Lyon."}


def _prompt(call) -> str:
    """Everything the LM was shown, in order, as one text (what a provider's prefix cache compares)."""
    return "".join(f"<{role}>{text}" for role, text in [("system", call.system), *call.history, ("user", call.user)])


def _requests(adapter, signature, inputs, times=2, lm=None):
    lm = lm or fake_lm()
    # without history: DSPy's own call log would otherwise keep every signature alive
    with dspy.context(lm=lm, adapter=adapter, disable_history=True):
        for _ in range(times):
            dspy.Predict(signature)(**inputs)
    return [(c.system, c.user, c.schema) for c in lm.engine.calls]


def _rendered(style: Style) -> dict:
    argue, verdict = signatures_for("pairwise")
    with rendering(style):
        return {name: DebateAdapter().format(sig, [], INPUTS) for name, sig in (("argue", argue), ("verdict", verdict))}


PINNED_STYLES = {"lean": Style(lean=True), "complete": Style(), "anthropic": Style(lean=True, marks=True),
                 "lean, persona static": Style(lean=True, persona_static=True),
                 "anthropic, persona static, item unmarked": Style(lean=True, marks=True, persona_static=True,
                                                                   mark_item=False)}


def test_the_prompts_bytes_are_pinned():
    """Any change to what the built-in prompts send shows up here, byte for byte (tests/data/prompts.json)."""
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))
    assert {name: _rendered(style) for name, style in PINNED_STYLES.items()} == pinned


@pytest.mark.parametrize("fmt", ["pairwise", "pointwise"])
def test_the_lean_format_keeps_every_instruction_and_description(fmt):
    """The meaning does not change: the instructions, every field's description and every output's values are said."""
    for signature in signatures_for(fmt):
        with rendering(Style(lean=True)):
            system = DebateAdapter().format_system_message(signature)
        assert " ".join(signature.instructions.split()) in " ".join(system.split())
        for name, field in {**signature.input_fields, **signature.output_fields}.items():
            assert name in system
            for sentence in description(name, field).rstrip(".").split(". "):
                assert sentence in system, (name, sentence)
        for name, field in signature.output_fields.items():
            values = getattr(field.annotation, "__args__", ())
            said = [min(values), max(values)] if values and all(isinstance(v, int) for v in values) else values
            line = next(x for x in system.splitlines() if x.startswith(f"- {name}"))
            assert all(str(v) in line for v in said), line
        assert "Outputs will be a JSON object" not in system and len(system) < 1100


def test_an_items_calls_share_their_leading_bytes_up_to_the_items_texts():
    """Calls of one step in one answer order are the same bytes up to the end of the item's texts, then differ."""
    cfg = DebateConfig(roles=("critic", "scientist", "general_public"), turns=3)
    lm = fake_lm()
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        build_evaluator(cfg)(**ITEM)
    answers = {"1": ITEM["answer_2"], "2": ITEM["answer_1"]}  # what stands last among the item's texts, per order
    groups: dict[tuple, list[str]] = {}
    for call in lm.engine.calls:
        order = "1" if call.inputs["answer_2"] == ITEM["answer_2"] else "2"
        groups.setdefault((call.kind, order), []).append(_prompt(call))
    assert {k: len(v) for k, v in groups.items()} == {("argument", "1"): 6, ("argument", "2"): 6,
                                                    ("verdict", "1"): 3, ("verdict", "2"): 3}
    for (_kind, order), prompts in groups.items():
        end = prompts[0].index(answers[order]) + len(answers[order])
        assert len({p[:end] for p in prompts}) == 1  # one shared prefix, through the item's texts
        assert len({p[end:] for p in prompts}) == len(prompts)  # and each call its own after it
        assert prompts[0].index("[[ ## persona ## ]]") > end  # the referee's lines follow the item's texts


def test_a_predictors_calls_share_the_static_part_across_items():
    cfg = DebateConfig(roles=("critic",), turns=1, calibrate=False)
    lm = fake_lm()
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        program = build_evaluator(cfg)
        program(**ITEM)
        program(question="Another question?", answer_1="yes", answer_2="no")
    first, second = lm.engine.calls
    assert first.system == second.system and "Another question?" not in first.system


def test_schema_is_sent_as_before_and_instructions_follow_rewrites():
    inputs = {k: v for k, v in INPUTS.items() if k in PairwiseVerdict.input_fields}
    ours = _requests(DebateAdapter(), PairwiseVerdict, inputs)
    theirs = _requests(dspy.JSONAdapter(), PairwiseVerdict, inputs)
    assert [schema for *_, schema in ours] == [schema for *_, schema in theirs]
    assert ours[0][2]["properties"]["preference"]["enum"] == ["1", "2", "tie"]
    adapter = DebateAdapter()
    rewritten = PairwiseVerdict.with_instructions("Prefer the shorter answer.")
    assert _requests(adapter, rewritten, inputs, times=1)[0][0].startswith("Prefer the shorter answer.")
    mutable = PairwiseVerdict.with_instructions("Version one.")
    _requests(adapter, mutable, inputs, times=1)
    mutable.instructions = "Version two."  # a class whose docstring is reassigned in place is re-rendered too
    assert _requests(adapter, mutable, inputs, times=1)[0][0].startswith("Version two.")


class _NoSchemaEngine(ScriptedEngine):
    supports_response_schema = False


def _verdict(call) -> dict:
    return {"evidence": "first is right", "preference": "1", "score_1": 9, "score_2": 2}


def test_an_lm_without_structured_output_gets_the_complete_format_and_still_parses():
    lm = dspy.LM("fake/no-schema", engine=_NoSchemaEngine(_verdict), cache=False, num_retries=0)
    inputs = {k: v for k, v in INPUTS.items() if k in PairwiseVerdict.input_fields}
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        pred = dspy.Predict(PairwiseVerdict)(**inputs)
    call = lm.engine.calls[0]
    assert pred.preference == "1" and pred.score_1 == 9 and not call.schema
    assert '"preference": "{preference}' in call.system and "must exactly match" in call.system
    assert call.user.rstrip().endswith("`score_2` (must be formatted as a valid Python Literal[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).")
    with rendering(Style(lean=True)):
        lean = DebateAdapter().format_system_message(PairwiseVerdict)
    assert call.system.startswith(lean)  # the complete format is the lean one plus DSPy's own notes


def test_anthropic_models_get_breakpoints_after_the_static_part_and_after_the_items_texts():
    argue, _ = signatures_for("pairwise")
    demo = {**INPUTS, "argument": "an earlier turn"}
    with rendering(Style(lean=True, marks=True)):
        marked = DebateAdapter().format(argue, [demo], INPUTS)
    with rendering(Style(lean=True)):
        plain = DebateAdapter().format(argue, [demo], INPUTS)
    marks = [(i, j) for i, m in enumerate(marked) if isinstance(m["content"], list)
             for j, block in enumerate(m["content"]) if "cache_control" in block]
    assert marks == [(2, 0), (3, 0)]  # the end of the last demo; the end of the item's texts
    assert marked[3]["content"][0]["text"].rstrip().endswith(INPUTS["answer_2"])
    flat = [m["content"] if isinstance(m["content"], str) else "".join(b["text"] for b in m["content"]) for m in marked]
    assert flat == [m["content"] for m in plain]  # the marks change no byte of the text


def test_each_signature_gets_its_own_schema():
    adapter = DebateAdapter()
    pair = _requests(adapter, PairwiseVerdict, {k: v for k, v in INPUTS.items() if k in PairwiseVerdict.input_fields}, 1)
    score = _requests(adapter, ScoringArgument, {k: "x" for k in ScoringArgument.input_fields}, 1)
    assert set(pair[0][2]["properties"]) != set(score[0][2]["properties"])


def test_memo_does_not_keep_discarded_signatures_alive():
    adapter = DebateAdapter()
    for i in range(5):
        adapter.format_system_message(PairwiseVerdict.with_instructions(f"candidate {i}"))
    kept = PairwiseVerdict.with_instructions("kept")
    adapter.format_system_message(kept)
    gc.collect()
    assert list(adapter._memo.keys()) == [kept]  # an optimizer's discarded candidates are not held by the memo


def _toy_judge(call) -> dict:
    """Judges by content only with rewritten instructions (an optimizer's proposal) or demonstrations, else says 1."""
    if call.kind == "argument":
        return {"argument": "ok"}
    if call.kind != "verdict":
        return {name: f"{name} from the fake LM" for name in call.outputs}
    tuned = "from the fake LM" in call.system or call.n_messages > 1
    first = "right" in call.inputs["answer_1"] if tuned else True
    return {"evidence": "content", "score_1": 9 if first else 2, "score_2": 2 if first else 9}


def _toy(n: int, start: int = 0) -> list:
    return [dspy.Example(id=str(i), question=f"q{i}", answer_1=f"right {i}" if i % 2 else f"wrong {i}",
                         answer_2=f"wrong {i}" if i % 2 else f"right {i}", label="1" if i % 2 else "2")
            .with_inputs("question", "answer_1", "answer_2") for i in range(start, start + n)]


@pytest.mark.parametrize("optimizer", ["labeled", "mipro"])
def test_tuning_writes_instructions_and_demos_into_the_layout_and_they_round_trip(tmp_path, optimizer):
    from optim.tuning.compile import OptimizerSettings, compile_evaluator
    from optim.tuning.objectives import agreement

    cfg = DebateConfig(roles=("critic", "scientist"), turns=1)
    student = build_evaluator(cfg)
    with dspy.context(lm=fake_lm(_toy_judge), adapter=DebateAdapter()):
        compiled = compile_evaluator(student, optimizer=optimizer, trainset=_toy(8), valset=_toy(4, 20),
                                     metric=agreement, settings=OptimizerSettings(max_demos=2, candidates=2))
    judge = compiled.debate.referees["critic"].judge
    if optimizer == "mipro":  # MIPROv2 rewrites the instructions (its chosen demo set may be empty)
        assert judge.signature.instructions != student.debate.referees["critic"].judge.signature.instructions
    else:
        assert len(judge.demos) == 2
    compiled.save(tmp_path / "p.json")
    loaded = build_evaluator(cfg)
    loaded.load(tmp_path / "p.json")
    prompts = []
    for program in (compiled, loaded):
        lm = fake_lm(_toy_judge)
        with dspy.context(lm=lm, adapter=DebateAdapter()):
            program(**ITEM)
        # sorted: the two answer orders run at once, so their calls interleave
        prompts.append(sorted((c.system, c.history, c.user) for c in lm.engine.calls))
    assert prompts[0] == prompts[1]
    system, history, user = next(p for p in prompts[0] if p[0].startswith(judge.signature.instructions.strip())
                                 and "- evidence" in p[0])
    assert [role for role, _ in history] == ["user", "assistant"] * len(judge.demos)
    if history:
        assert history[0][1].startswith("[[ ## question ## ]]")  # a demo in the same layout: the item's texts first
    assert user.startswith("[[ ## question ## ]]\n" + ITEM["question"])


def test_a_referee_with_static_text_of_its_own_carries_its_persona_in_the_static_part():
    """Tuned predictors share nothing with other referees: the persona joins their static part (cached across
    items), and the item's texts are marked for Anthropic only where a later call of the item reads them."""
    from chateval_dspy.program.demos import with_label_demos

    cfg = DebateConfig(roles=("critic", "scientist"), turns=3)
    untuned = build_evaluator(cfg)
    plan = untuned.debate.placements()
    assert all(p == {"persona_static": False, "mark_item": True} for p in plan.values())
    tuned = with_label_demos(untuned, _toy(4), k=2)  # demonstrations on each referee's judge
    plan = tuned.debate.placements()
    assert plan[("critic", True)] == {"persona_static": True, "mark_item": False}  # one verdict per order
    assert plan[("critic", False)] == {"persona_static": False, "mark_item": True}  # the argue predictors still match
    lm = fake_lm(_toy_judge)
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        tuned(**ITEM)
    verdicts = [c for c in lm.engine.calls if c.kind == "verdict"]
    assert verdicts and all("[[ ## persona ## ]]" in c.system and "[[ ## persona ## ]]" not in c.user for c in verdicts)
    assert {c.inputs["persona"][:12] for c in verdicts} == {"You are a sh", "You are a sc"}  # still shown, in the static part
    argues = [c for c in lm.engine.calls if c.kind == "argument"]
    assert all("[[ ## persona ## ]]" in c.user for c in argues)
