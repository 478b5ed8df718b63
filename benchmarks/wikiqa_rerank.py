"""WikiQA answer selection: a cross-encoder fine-tuned from all-MiniLM-L6-v2 vs the zero-shot bi-encoder.

Training data: WikiQA train pairs of the questions with at least one correct answer (the standard protocol keeps
only those; 873 questions, 8,672 pairs, 1,040 positive). The cross-encoder starts from all-MiniLM-L6-v2 with a new
one-logit head and trains with binary cross-entropy (``--loss bce``, positives up-weighted by ``--pos-weight``) or
listwise softmax over each question's candidates. Both models then rank each test question's candidates (243
answerable test questions); MRR@10 / NDCG@10 / MAP are computed by :func:`embforge.evaluate.rerank.evaluate_rerank`.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/wikiqa_rerank.py --epochs 2
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from _common import quiet_config

from embforge.cross_encoder import CrossEncoder
from embforge.data.builtin.wikiqa import load_wikiqa
from embforge.data.tables import Dataset
from embforge.encoder import Encoder
from embforge.evaluate.ranking import evaluate_run
from embforge.evaluate.rerank import evaluate_rerank, group_candidates
from embforge.losses.cross import get_cross_loss
from embforge.retrieval.two_stage import (
    as_run,
    evaluate_two_stage,
    fuse,
    pool_candidates,
    retrieve_and_rerank,
)
from embforge.training.loop import train
from embforge.training.tasks import Task


def listwise_rows(data, groups, negatives: int, seed: int) -> Dataset:
    """``anchor, positive, negative_1..k``: one row per correct answer, negatives drawn from its question's
    wrong candidates (with replacement when it has fewer; other questions' answers when it has none)."""
    rng = np.random.default_rng(seed)
    texts, labels = data.columns["sentence2"], data.columns["label"]
    columns: dict[str, list[str]] = {"anchor": [], "positive": []}
    columns.update({f"negative_{j + 1}": [] for j in range(negatives)})
    for rows in groups.values():
        wrong = [texts[r] for r in rows if labels[r] == 0] or [
            texts[r] for r in rng.choice(len(texts), negatives)
        ]
        for r in (r for r in rows if labels[r] > 0):
            columns["anchor"].append(data.columns["sentence1"][r])
            columns["positive"].append(texts[r])
            picks = (
                rng.permutation(len(wrong)) if len(wrong) >= negatives else rng.choice(len(wrong), negatives)
            )
            for j in range(negatives):
                columns[f"negative_{j + 1}"].append(wrong[picks[j]])
    return Dataset("wikiqa-train-listwise", columns, list(range(1, len(columns["anchor"]) + 1)))


def with_random_negatives(data, per_question: int, seed: int) -> Dataset:
    """``data`` plus, for each question, ``per_question`` candidate sentences of other questions labelled 0."""
    if per_question <= 0:
        return data
    rng = np.random.default_rng(seed)
    questions, answers = data.columns["sentence1"], data.columns["sentence2"]
    owner = dict(zip(answers, questions))  # sentence -> (last) question it is a candidate of
    pool = list(owner)
    picks = {}
    for question in dict.fromkeys(questions):
        drawn = [pool[i] for i in rng.choice(len(pool), 4 * per_question)]
        picks[question] = [a for a in drawn if owner[a] != question][:per_question]
    return with_negatives(data, picks, "random")


def with_mined_negatives(data, per_question: int, model_name: str) -> Dataset:
    """``data`` plus, for each question, the ``per_question`` sentences the zero-shot bi-encoder ranks highest in
    the pooled training corpus among those that are *not* candidates of that question, labelled 0: the off-article
    text a retriever over a pooled corpus puts in front of the reranker."""
    if per_question <= 0:
        return data
    from embforge.retrieval.index.exact import topk_inner_product

    questions, answers = data.columns["sentence1"], data.columns["sentence2"]
    own: dict[str, set[str]] = {}
    for q, a in zip(questions, answers):
        own.setdefault(q, set()).add(a)
    pool, unique_questions = list(dict.fromkeys(answers)), list(own)
    encoder = Encoder.load(model_name)
    _, top = topk_inner_product(
        encoder.encode(unique_questions, normalize=True),
        encoder.encode(pool, normalize=True),
        per_question + max(len(v) for v in own.values()),
    )
    picks = {
        question: [pool[p] for p in row if pool[p] not in own[question]][:per_question]
        for question, row in zip(unique_questions, top)
    }
    return with_negatives(data, picks, "mined")


def with_negatives(data, picks: dict[str, list[str]], tag: str) -> Dataset:
    """``data`` plus a label-0 row ``(question, sentence)`` for every sentence picked for each question."""
    extra: dict[str, list] = {"sentence1": [], "sentence2": [], "label": []}
    for question, sentences in picks.items():
        extra["sentence1"] += [question] * len(sentences)
        extra["sentence2"] += sentences
        extra["label"] += [0] * len(sentences)
    columns = {k: list(v) + extra[k] for k, v in data.columns.items()}
    return Dataset(f"{data.path}+{tag}", columns, list(range(1, len(columns["label"]) + 1)))


def choose_fusion(bi, cross, dev, top_k: int) -> tuple[float, dict[float, float]]:
    """The fusion weight (0, 0.1, ..., 1) with the best pooled two-stage MRR@10 on ``dev``, and every weight's."""
    queries, corpus, qrels = pool_candidates(dev)
    first, second = retrieve_and_rerank(bi, cross, queries, corpus, top_k=top_k)
    scores = {}
    for weight in [w / 10 for w in range(11)]:
        run = as_run(list(qrels), fuse(first, second, weight))
        scores[weight] = 100 * evaluate_run(run, qrels, ("mrr@10",))["mrr@10"]
    return max(scores, key=lambda w: scores[w]), scores


def train_cross_encoder(args, train_data, groups, answerable) -> CrossEncoder:
    """The cross-encoder from ``args.model``, trained as the command line says."""
    model = CrossEncoder.load(args.model, num_labels=1, new_head=True, max_seq_length=args.max_seq_length)
    if args.loss == "listwise":
        task = Task(
            "wikiqa", listwise_rows(train_data, groups, args.negatives, args.seed), get_cross_loss("listwise")
        )
    else:
        options = {} if args.pos_weight is None else {"pos_weight": args.pos_weight}
        rows = with_random_negatives(answerable, args.random_negatives, args.seed)
        rows = with_mined_negatives(rows, args.mined_negatives, args.model)
        task = Task("wikiqa", rows, get_cross_loss("bce", **options))
    config = quiet_config(
        args.output, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed
    )
    started = time.perf_counter()
    summary = train(model, [task], config)
    print(
        f"trained {summary['steps']} steps in {time.perf_counter() - started:.0f} s "
        f"({summary['pairs_per_second']:.1f} pairs/s)",
        flush=True,
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument(
        "--pos-weight", type=float, default=None, help="BCE weight of positives (default none)"
    )
    parser.add_argument("--loss", default="bce", choices=["bce", "listwise"])
    parser.add_argument(
        "--negatives", type=int, default=7, help="listwise: negatives per (question, correct answer) row"
    )
    parser.add_argument(
        "--random-negatives",
        type=int,
        default=0,
        help="bce: add this many sentences of other questions per question as negatives (teaches the model to "
        "reject off-topic text, which two-stage retrieval over a pooled corpus puts in front of it)",
    )
    parser.add_argument(
        "--mined-negatives",
        type=int,
        default=0,
        help="bce: add the bi-encoder's top N sentences of other questions (pooled train corpus) per question as "
        "negatives — the reranker then trains on the retriever's own off-article candidates",
    )
    parser.add_argument("--top-k", type=int, default=20, help="two-stage: bi-encoder candidates re-scored")
    parser.add_argument(
        "--fusion",
        action="store_true",
        help="two-stage: also fuse cross-encoder and bi-encoder scores, the weight chosen on WikiQA dev",
    )
    parser.add_argument(
        "--load", default=None, help="evaluate this trained cross-encoder folder instead of training one"
    )
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--output", default="runs/wikiqa-ce")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    train_data = load_wikiqa("train")
    groups, _ = group_candidates(train_data)
    answerable = train_data.subset(sorted(r for rows in groups.values() for r in rows))
    test = load_wikiqa("test")
    print(f"train: {len(groups)} answerable questions, {len(answerable)} pairs; test: {len(test)} pairs")

    bi = Encoder.load(args.model)
    zero_shot = evaluate_rerank(bi, test)
    print("zero-shot bi-encoder", json.dumps(zero_shot), flush=True)

    if args.load:
        model = CrossEncoder.load(args.load)
        print(f"loaded {args.load} (no training)")
    else:
        model = train_cross_encoder(args, train_data, groups, answerable)
    tuned = evaluate_rerank(model, test)
    print("fine-tuned cross-encoder", json.dumps(tuned))
    two = evaluate_two_stage(bi, model, test, top_k=args.top_k)
    print("two-stage", json.dumps(two))
    print("\n| model | MRR@10 | NDCG@10 | MAP |\n|---|---:|---:|---:|")
    for name, result in (
        ("all-MiniLM-L6-v2 bi-encoder, zero-shot", zero_shot),
        (args.load or f"cross-encoder from all-MiniLM-L6-v2, {args.loss}, {args.epochs} epoch(s)", tuned),
    ):
        print(f"| {name} | {result['mrr@10']:.2f} | {result['ndcg@10']:.2f} | {result['map']:.2f} |")
    print(
        f"\ntwo-stage over the pooled {int(two['corpus'])} test candidates: bi-encoder MRR@10 {two['bi_mrr@10']:.2f}"
        f" -> re-scored top {args.top_k} {two['reranked_mrr@10']:.2f} (recall@{args.top_k} {two[f'bi_recall@{args.top_k}']:.2f})"
    )
    if args.fusion:
        weight, grid = choose_fusion(bi, model, load_wikiqa("dev"), args.top_k)
        print("dev MRR@10 by fusion weight", json.dumps(grid))
        fused = evaluate_two_stage(bi, model, test, top_k=args.top_k, fusion=weight)
        print("two-stage fused", json.dumps(fused))
        print(
            f"fused (weight {weight} chosen on dev): bi-encoder MRR@10 {fused['bi_mrr@10']:.2f} -> "
            f"{fused['reranked_mrr@10']:.2f} (NDCG@10 {fused['bi_ndcg@10']:.2f} -> {fused['reranked_ndcg@10']:.2f})"
        )


if __name__ == "__main__":
    main()
