"""Items and a confidence map shared by the confidence tests (test_confidence_runtime, test_selective_loop): the
fake LM's score margin, and so the confidence, changes from item to item."""

from __future__ import annotations

import dspy

from chateval_dspy.program.confidence import ConfidenceMap
from chateval_dspy.program.task import builtin_task

FEW = 200
IDENTITY = ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.0, 1.0), method="isotonic", n=50)
FITTED_ON = {"data": "faireval", "split": "calibration", "n": 50, "model": "fake/scripted", "seed": 0}


def item(i, label="1"):
    # answer_1 grows and answer_2 shrinks with i: the score margin (and the confidence) changes from item to item
    return dspy.Example(id=f"item-{i}", label=label, question=f"question {i}", answer_1="a" * (10 + 9 * i),
                        answer_2="b" * (60 - 4 * i)).with_inputs(*builtin_task("pairwise").input_names)


ITEMS = [item(i, label=["1", "2"][i % 2]) for i in range(8)]
