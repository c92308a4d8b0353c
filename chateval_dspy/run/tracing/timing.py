"""When each span of a traced debate started and ended.

The debate measures every turn (its ``started`` epoch seconds, ``seconds``, and the ``prompt_tokens``/
``completion_tokens`` of its LM calls, None when the LM cache answered) and each span is laid out by them
(``chateval.timing`` is ``"measured"``). Results files written before turns were measured hold each item's total
seconds only: then the item's time is laid out over its turns in speaking order (concurrent turns of a round side by
side) and every span says ``"estimated"``.
"""

from __future__ import annotations

from chateval_dspy.program.strategies import SUMMARIZER

NS = 1_000_000_000  # nanoseconds per second: span times are epoch nanoseconds


def measured(transcripts: list[list[dict]]) -> bool:
    """Whether every utterance carries its own start and duration (else the spans' times are estimated)."""
    utterances = [u for t in transcripts for u in t]
    return bool(utterances) and all(isinstance(u.get("started"), (int, float)) and
                                    isinstance(u.get("seconds"), (int, float)) for u in utterances)


def steps(transcript: list[dict], concurrent: bool) -> list[list[int]]:
    """The transcript's utterance indices grouped into steps that follow one another in time: one per turn
    (one_by_one), or a round's turns side by side (concurrent strategies), and each summary on its own."""
    grouped: list[list[int]] = []
    last_round = None
    for i, u in enumerate(transcript):
        if concurrent and u["speaker"] != SUMMARIZER and u["round"] == last_round and grouped \
                and transcript[grouped[-1][0]]["speaker"] != SUMMARIZER:
            grouped[-1].append(i)
        else:
            grouped.append([i])
        last_round = u["round"]
    return grouped


def span_times(transcripts: list[list[dict]], start: int, end: int, concurrent: bool) -> list[list[tuple[int, int]]]:
    """``(start_ns, end_ns)`` of every utterance: measured when the utterances carry their times, else the
    item's interval laid out over its sequential steps (equal shares)."""
    if measured(transcripts):
        # The duration in its own int: added to epoch seconds first, it would lose its last digits to rounding.
        return [[(int(u["started"] * NS), int(u["started"] * NS) + int(u["seconds"] * NS)) for u in t]
                for t in transcripts]
    plans = [steps(t, concurrent) for t in transcripts]
    total = sum(len(p) for p in plans) or 1
    share = (end - start) / total
    out, k = [], 0
    for transcript, plan in zip(transcripts, plans):
        slots: list[tuple[int, int]] = [(start, start)] * len(transcript)
        for step in plan:
            for i in step:
                # Offsets in float, times in int: nanoseconds since 1970 exceed a float's precision.
                slots[i] = (start + int(k * share), start + int((k + 1) * share))
            k += 1
        out.append(slots)
    return out
