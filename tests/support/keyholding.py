"""The fake LM of the search and CLI tests: referees whose scores vary by persona and answer, behind an engine that
holds an API key as a real client does."""

from __future__ import annotations

import os
import zlib

from chateval_dspy.testing.fake_lm import ScriptedEngine, default_responder


def varied(call):
    """Scores that depend on the referee and the answer (never on its position), so panels differ in agreement."""
    out = default_responder(call)
    if "score_1" in out:
        persona = call.inputs.get("persona", "")[:30]
        out["score_1"], out["score_2"] = (1 + zlib.crc32((persona + call.inputs.get(k, "")).encode()) % 10
                                          for k in ("answer_1", "answer_2"))
    return out


class KeyHoldingEngine(ScriptedEngine):
    """Holds the API key as a real client does: were the LM ever pickled or logged, the key would leak."""

    def __init__(self, responder=varied):
        super().__init__(responder)
        self.api_key = os.environ.get("OPENAI_API_KEY", "")
