"""The MLflow GenAI judge class, built by ``chateval_dspy.mlflow_judge`` (which says what each row gives): MLflow is
imported with this module, which only ``mlflow_judge`` imports.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback
from mlflow.genai.judges.base import Judge as MlflowJudge
from mlflow.genai.judges.base import JudgeField
from pydantic import PrivateAttr

from chateval_dspy.deploy.mlflow.assessments import ABSTAINED_CODE, feedback_parts, instructions_of, value_type
from chateval_dspy.deploy.mlflow.genai_rows import expected_preference, item_for
from chateval_dspy.deploy.mlflow.trace_labels import labels_from_traces
from chateval_dspy.deploy.mlflow.traced import TracedJudge, untraced
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.limits import DEFAULT_DEMOS
from chateval_dspy.program.demos import with_label_demos
from chateval_dspy.run.tracing import Tracer
from chateval_dspy.scrub import scrub, secret_values

SOURCE_RUN = "mlflow.sourceRun"  # mlflow.tracing.constant.TraceMetadataKey.SOURCE_RUN


class ChatEvalJudge(MlflowJudge):
    """A ChatEval panel as an MLflow GenAI judge (build it with ``chateval_dspy.mlflow_judge``)."""

    _judge = PrivateAttr(default=None)
    _traced = PrivateAttr(default=None)
    _fields = PrivateAttr(default=None)
    _per_criterion = PrivateAttr(default=None)

    @classmethod
    def of(cls, judge, *, name: str = "chateval", trace: bool = False, fields: Mapping[str, str] | None = None,
           per_criterion: bool | None = None, description: str | None = None) -> ChatEvalJudge:
        """The scorer over a loaded ``Judge``; the arguments are ``chateval_dspy.mlflow_judge``'s."""
        if trace and getattr(judge, "stages", None) is not None:
            raise ConfigError("mlflow_judge: trace=True traces one panel's debate; a cascade's items run through "
                              "several. Use trace=False (MLflow's scorer tracing still records the calls)")
        scorer = cls(name=name, description=description or _instructions(judge), timeout=0)
        scorer._judge = judge
        scorer._fields = dict(fields) if fields else None
        scorer._per_criterion = per_criterion
        if trace:
            # A trace made during genai.evaluate belongs to its run, and MLflow deletes every trace of the run that
            # is not an evaluated row's (unless it traces scorers itself): a debate trace is the experiment's instead.
            tracer = Tracer(judge.config, roles=getattr(judge.program, "roles", None),
                            model=getattr(judge.lm, "model", None),
                            tags={"chateval.command": "mlflow.genai.evaluate", "chateval.scorer": name},
                            metadata={SOURCE_RUN: ""})
            scorer._traced = TracedJudge(judge, tracer)
        return scorer

    @property
    def chateval(self):
        """The loaded ``Judge`` behind this scorer."""
        return self._judge

    @property
    def instructions(self) -> str:
        return _instructions(self._judge)

    @property
    def feedback_value_type(self):
        return value_type(self._judge.task, self._per_criterion)

    def get_input_fields(self) -> list:
        return [JudgeField(name=i.name, description=i.description or i.name, value_type=str) for i in self._judge.task.inputs]

    def __call__(self, *, inputs=None, outputs=None, expectations=None, trace=None):
        task = self._judge.task
        row_id = trace.info.trace_id if trace is not None else None
        item = item_for(task, inputs, outputs, expectations, fields=self._fields, item_id=row_id)
        # Read before the debate: a row whose expectation is unreadable costs no LM call.
        expected = expected_preference(expectations, task) if task.format == "pairwise" else None
        verdict, trace_id = self._debate(item)
        return self._feedbacks(verdict, trace_id=trace_id, expected=expected)

    def _debate(self, item: dict):
        """``(verdict, trace id)`` of one row's item (the trace id is None unless the scorer traces its debates)."""
        judge, task = self._judge, self._judge.task
        try:
            if self._traced is not None:
                return self._traced.judge_traced(item, source="mlflow.genai.evaluate row", quiet=True)
            # MLflow autologs DSPy during genai.evaluate: a call-level trace of every debate that it deletes again at
            # the end (unless the user asked it to trace scorers, when that detail is wanted).
            asked = os.environ.get("MLFLOW_GENAI_EVAL_ENABLE_SCORER_TRACING", "").strip().lower() in ("true", "1")
            with contextlib.nullcontext() if asked else untraced():
                return judge(item, source="mlflow.genai.evaluate row"), None
        except DataError as exc:
            raise DataError(f"{exc}. Name the task's inputs ({', '.join(task.input_names)}) in the row's inputs, "
                            "outputs or expectations, or map them: mlflow_judge(judge, fields={...})") from exc

    def _feedbacks(self, verdict, *, trace_id: str | None, expected: str | None) -> list:
        """The MLflow ``Feedback`` objects of one verdict (``feedback_parts``), scrubbed of secrets."""
        judge = self._judge
        judges = getattr(judge, "stages", None) or [judge]  # a cascade: every stage's referees and models
        names = {r.slug: r.name for j in judges for r in getattr(j.program, "roles", [])}
        model = "+".join(dict.fromkeys(str(getattr(j.lm, "model", "?")) for j in judges))
        source = AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id=f"chateval:{model}")
        secrets = secret_values()
        out = []
        for p in feedback_parts(verdict, judge.task, name=self.name, per_criterion=self._per_criterion, names=names,
                                model=model, trace_id=trace_id, expected=expected):
            p = scrub(p, secrets)
            error = AssessmentError(error_code=ABSTAINED_CODE, error_message=p["error"]) if p["error"] else None
            out.append(Feedback(name=p["name"], value=p["value"], rationale=p["rationale"], source=source,
                                metadata=p["metadata"], error=error))
        return out

    def align(self, traces, optimizer=None):
        """A new judge, on the same LM, tuned to the human feedback on ``traces`` (read by ``trace_labels``'s rule).

        With no ``optimizer``, every referee's judge predictor gets up to ``DEFAULT_DEMOS`` labelled items as
        demonstrations (``chateval compile``'s ``labeled`` optimizer: no LM call); else ``optimizer`` is an MLflow
        ``AlignmentOptimizer`` (``optimizer.align(scorer, traces)``), such as ``optim.tuning.align.CompileAligner``.
        """
        traces = list(traces)
        if optimizer is not None:
            return optimizer.align(self, traces)
        got = labels_from_traces(traces, self._judge.task)
        if not got.items:
            raise ConfigError(f"align: none of the {len(traces)} traces carries usable human feedback (name it "
                              f"'label' or 'preference' for a pairwise task, else a criterion's name; "
                              f"{got.disagreements} even splits)")
        program = with_label_demos(self._judge.program, list(got.items.values()), k=DEFAULT_DEMOS)
        return self.retuned(program, got.card())

    def retuned(self, program, labels: dict):
        """This scorer's settings over ``program`` (a tuned copy of its panel; the card's ``labels`` say what it
        learned from), without a calibration: it was fitted to the old panel's confidences."""
        if getattr(self._judge, "stages", None) is not None:
            raise ConfigError("align: a cascade is aligned stage by stage; align each stage's evaluator, calibrate "
                              "it, and save the cascade again")
        program.calibration = None
        card = {k: v for k, v in self._judge.card.items() if k != "calibration"}
        judge = self._judge.with_program(program, {**card, "labels": labels})
        return type(self).of(judge, name=self.name, trace=self._traced is not None, fields=self._fields,
                             per_criterion=self._per_criterion)


def _instructions(judge) -> str:
    """What the judge does, in words: its panel's (``instructions_of``), or a cascade's stages' in order."""
    stages = getattr(judge, "stages", None)
    if stages is None:
        return instructions_of(judge)
    return "A cascade: each item goes to the first stage confident enough. " + " Then: ".join(
        f"stage {s.name} (threshold {s.threshold}): {instructions_of(j)}" for s, j in zip(judge.spec.stages, stages))
