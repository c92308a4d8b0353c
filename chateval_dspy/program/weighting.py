"""G-Eval-style scores: the expected score under the LM's token distribution, not just its argmax.

When the LM returns log-probabilities, each score field's value token comes with ranked
alternatives. Renormalised over the valid ratings, they give an expected score such as
6.7 instead of a bare 7, which separates items a coarse integer scale would tie.
"""

from __future__ import annotations

import itertools
import math
import re


def expected_scores(content: list[dict], ranges: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Expected value of each score field from DSPy's ``prediction.logprobs["content"]``.

    ``ranges``: field name -> (lowest, highest) valid rating. Only fields whose value is a single token with
    alternatives are returned; the caller keeps the plain integer for the others (e.g. "10", two tokens mostly).

    Example:
        >>> toks = [{"token": '{"score_1": ', "logprob": 0.0, "top_logprobs": []},
        ...         {"token": "7", "logprob": math.log(0.6),
        ...          "top_logprobs": [{"token": "7", "logprob": math.log(0.6)}, {"token": "8", "logprob": math.log(0.2)}]},
        ...         {"token": "}", "logprob": 0.0, "top_logprobs": []}]
        >>> round(expected_scores(toks, {"score_1": (1, 10)})["score_1"], 3)
        7.25
    """
    text = "".join(tok["token"] for tok in content)
    starts = list(itertools.accumulate((len(tok["token"]) for tok in content), initial=0))
    out = {}
    for name, (lo, hi) in ranges.items():
        match = re.search(rf'"{re.escape(name)}"\s*:\s*(\d+)', text)
        if not match:
            continue
        at = match.start(1)
        index = max(i for i, s in enumerate(starts) if s <= at)
        token = content[index]
        if token["token"].strip() != match.group(1):
            continue  # the value spans several tokens: no single distribution to read
        weights: dict[int, float] = {}
        for alt in [token, *token.get("top_logprobs", [])]:
            value = alt["token"].strip()
            if value.isdigit() and lo <= int(value) <= hi:
                weights[int(value)] = math.exp(alt["logprob"])
        total = sum(weights.values())
        if total > 0:
            out[name] = sum(v * w for v, w in weights.items()) / total
    return out
