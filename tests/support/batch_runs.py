"""What the batch-mode tests share: a responder whose verdicts differ per item, the batch LMSpec, the live run."""

from __future__ import annotations

from pathlib import Path

from said import said

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_lm import default_responder
from chateval_dspy.testing.fake_server import FakeOpenAIServer


def by_length(call):
    """The default answers, but verdict scores that differ per item and answer order (each answer's length modulo
    10), so that equal verdicts mean something and a cross-wired answer shows."""
    out = default_responder(call)
    if call.kind == "verdict" and "score_1" in out:
        a1, a2 = call.inputs.get("answer_1", ""), call.inputs.get("answer_2", "")
        out = {**out, "score_1": 1 + len(a1) % 10, "score_2": 1 + len(a2) % 10}
    return out


def batch_spec(url: str, **kwargs) -> LMSpec:
    """Batch mode against ``url``, looking at submitted batches every 20 ms."""
    return LMSpec(model=url, cache=False, batch=True, batch_poll=0.02, **kwargs)


def live_verdicts(out: Path, data: DataSpec) -> dict:
    """What the default panel says of ``data``'s items judged live (not in batches), by item (``said``)."""
    with FakeOpenAIServer(responder=by_length) as url:
        evaluate_dataset(data, DebateConfig(), LMSpec(model=url, cache=False), out=out)
    return said(out)
