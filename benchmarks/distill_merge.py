"""Session 5 measurements (issue #17): the merging trade-off curve and the teacher's encode time with the cache.

``merge``: an STS specialist (``embforge train`` on STS-B train) merged back into its base, at weights 0 -> 1, with
plain linear interpolation and TIES (task arithmetic with one specialist *is* linear interpolation:
``base + w (spec - base) = (1 - w) base + w spec``; checked at w = 0.5). Each point: STS-B test Spearman and SciFact
dev NDCG@10. ``--eval-docs N`` scores SciFact against the dev-judged documents plus N others instead of the whole
5,183-document corpus (to fit a small CPU budget; say so when reporting). Points are appended to
``OUT/merge.jsonl`` and skipped when present, so an interrupted run resumes. ``plot`` draws ``OUT/merge.png`` and
prints the table and whether a weight keeps >= 80 % of the STS gain and recovers >= 80 % of the retrieval loss.

``teacher``: time the teacher (all-mpnet-base-v2, ``make teacher``) embedding the STS-B test sentences through the
on-disk cache (:func:`embforge.distill.signals.teacher_embeddings`): a cold run, then a second run that reads the cache;
the student (all-MiniLM-L6-v2) encoding the same texts for scale.

Run::

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/distill_merge.py merge \\
        --specialist runs/stsb-specialist --eval-docs 1000 --out runs/distill_merge
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/distill_merge.py plot --out runs/distill_merge \\
        --png benchmarks/distill_merge.png
    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/distill_merge.py teacher \\
        --teacher models/all-mpnet-base-v2 --out runs/distill_merge
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

GRID = "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1"


def _sub_corpus(data: Any, eval_docs: int | None) -> Any:
    if eval_docs is None:
        return data
    judged = {d for rel in data.qrels.values() for d in rel}
    keep = [i for i, d in enumerate(data.doc_ids) if d in judged]
    keep += [i for i, d in enumerate(data.doc_ids) if d not in judged][:eval_docs]
    keep.sort()
    data.doc_ids = [data.doc_ids[i] for i in keep]
    data.doc_texts = [data.doc_texts[i] for i in keep]
    data.doc_titles = [data.doc_titles[i] for i in keep]
    return data


def _done(path: Path) -> dict[tuple[str, float], dict[str, Any]]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["method"], r["w"]): r for r in rows}


def run_merge(args: argparse.Namespace) -> None:
    from embforge.data.builtin import load_builtin
    from embforge.evaluate.retrieval import evaluate_retrieval
    from embforge.evaluate.sts import evaluate_sts
    from embforge.merge import Merger

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "merge.jsonl"
    done = _done(results)
    sts = load_builtin("stsb", "test")
    scifact = _sub_corpus(load_builtin("scifact", "dev"), args.eval_docs)
    grid = [float(x) for x in args.grid.split(",")]
    mergers = {
        "linear": lambda: Merger([args.base, args.specialist]),
        "ties": lambda: Merger([args.specialist], method="ties", base=args.base, density=args.density),
        # task arithmetic with the task vector scaled by depth (LiNeS): embeddings at alpha, last layer at w
        "lines": lambda: Merger(
            [args.specialist], method="task_arithmetic", base=args.base, layer_scaling=args.alpha
        ),
    }
    for method in args.methods.split(","):
        merger = None
        label = f"lines a={args.alpha:g}" if method == "lines" else method
        for w in grid:
            if (label, w) in done or (method != "linear" and w == 0.0):  # w = 0 is the base (linear at 0)
                continue
            merger = merger or mergers[method]()
            model = merger.merge([1 - w, w] if method == "linear" else [w])
            started = time.perf_counter()
            s = evaluate_sts(model, sts)["spearman"]
            r = evaluate_retrieval(model, scifact, metrics=["ndcg@10"], batch_size=32)["ndcg@10"]
            row = {"method": label, "w": w, "sts": s, "ndcg@10": r, "seconds": time.perf_counter() - started}
            row["docs"] = len(scifact.doc_ids)
            print(json.dumps(row), flush=True)
            with results.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
    if args.check_task_arithmetic:
        linear = Merger([args.base, args.specialist]).merge([0.5, 0.5]).state_dict()
        arithmetic = (
            Merger([args.specialist], method="task_arithmetic", base=args.base).merge([0.5]).state_dict()
        )
        gap = max(
            float((linear[k] - arithmetic[k]).abs().max()) for k in linear if linear[k].is_floating_point()
        )
        print(json.dumps({"task_arithmetic_vs_linear_max_abs_diff_at_0.5": gap}))


def run_plot(args: argparse.Namespace) -> None:
    rows = list(_done(Path(args.out) / "merge.jsonl").values())
    if not rows:
        raise SystemExit(f"no results in {args.out}/merge.jsonl; run the merge step first")
    by_method: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    base = next(r for r in rows if r["w"] == 0.0)
    spec = next(r for r in rows if r["method"] == "linear" and r["w"] == 1.0)
    gain, loss = spec["sts"] - base["sts"], base["ndcg@10"] - spec["ndcg@10"]
    print(
        f"base: STS {base['sts']:.2f}, NDCG@10 {base['ndcg@10']:.2f}; specialist: STS {spec['sts']:.2f}, "
        f"NDCG@10 {spec['ndcg@10']:.2f} (STS gain {gain:+.2f}, retrieval loss {loss:+.2f})"
    )
    print(
        "| method | w | STS-B test Spearman | SciFact dev NDCG@10 | STS gain kept | retrieval loss recovered |"
    )
    print("|---|---|---|---|---|---|")
    both = []
    for method, points in sorted(by_method.items()):
        points.sort(key=lambda r: r["w"])
        if method != "linear":
            points = [base, *points]
        for p in points:
            kept = (p["sts"] - base["sts"]) / gain if gain else float("nan")
            recovered = (p["ndcg@10"] - spec["ndcg@10"]) / loss if loss else float("nan")
            if kept >= 0.8 and recovered >= 0.8:
                both.append((method, p["w"]))
            print(
                f"| {method} | {p['w']:.1f} | {p['sts']:.2f} | {p['ndcg@10']:.2f} | {100 * kept:.0f} % | "
                f"{100 * recovered:.0f} % |"
            )
    print(
        f"weights keeping >= 80 % of the STS gain and recovering >= 80 % of the retrieval loss: {both or 'none'}"
    )
    if args.png:
        from embforge._optional import require

        plt = require("matplotlib.pyplot")
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for method, points in sorted(by_method.items()):
            points = sorted(points, key=lambda r: r["w"])
            if method != "linear" and points[0]["w"] > 0:
                points = [base, *points]
            ax.plot([p["ndcg@10"] for p in points], [p["sts"] for p in points], "o-", label=method)
            for p in points:
                ax.annotate(
                    f"{p['w']:g}",
                    (p["ndcg@10"], p["sts"]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        ax.set_xlabel(f"SciFact dev NDCG@10 ({rows[0].get('docs', '?')} docs)")
        ax.set_ylabel("STS-B test Spearman")
        ax.set_title("Merging an STS specialist back into all-MiniLM-L6-v2")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


def run_teacher(args: argparse.Namespace) -> None:
    from embforge.data.builtin import load_builtin
    from embforge.distill.signals import teacher_embeddings
    from embforge.encoder import Encoder

    sts = load_builtin("stsb", "test")
    texts = sorted(set(sts.columns["sentence1"]) | set(sts.columns["sentence2"]))[: args.limit]
    cache = Path(args.out) / "teacher-cache"
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    teacher = Encoder.load(args.teacher)
    load_s = time.perf_counter() - started
    report: dict[str, Any] = {"texts": len(texts), "teacher_load_s": load_s}
    for run in ("cold", "cached"):
        started = time.perf_counter()
        emb = teacher_embeddings(teacher, texts, cache_dir=cache, batch_size=32, show_progress=False)
        report[f"teacher_{run}_s"] = time.perf_counter() - started
    report["teacher_dim"] = int(emb.shape[1])
    student = Encoder.load(args.student)
    started = time.perf_counter()
    student.encode(texts, batch_size=32)
    report["student_encode_s"] = time.perf_counter() - started
    print(json.dumps(report))
    with (Path(args.out) / "teacher.jsonl").open("a") as handle:
        handle.write(json.dumps(report) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    steps = parser.add_subparsers(dest="step", required=True)
    merge = steps.add_parser("merge")
    merge.add_argument("--base", default="all-MiniLM-L6-v2")
    merge.add_argument("--specialist", default="runs/stsb-specialist")
    merge.add_argument("--methods", default="linear,ties")
    merge.add_argument("--grid", default=GRID)
    merge.add_argument("--density", type=float, default=0.2)
    merge.add_argument(
        "--alpha", type=float, default=0.0, help="lines: the embeddings' share of the task vector"
    )
    merge.add_argument("--eval-docs", type=int, default=None)
    merge.add_argument("--check-task-arithmetic", action="store_true")
    merge.add_argument("--out", default="runs/distill_merge")
    merge.set_defaults(func=run_merge)
    plot = steps.add_parser("plot")
    plot.add_argument("--out", default="runs/distill_merge")
    plot.add_argument("--png", default=None)
    plot.set_defaults(func=run_plot)
    teacher = steps.add_parser("teacher")
    teacher.add_argument("--teacher", default="models/all-mpnet-base-v2")
    teacher.add_argument("--student", default="all-MiniLM-L6-v2")
    teacher.add_argument("--out", default="runs/distill_merge")
    teacher.add_argument("--limit", type=int, default=None, help="only the first N sentences (sorted)")
    teacher.set_defaults(func=run_teacher)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
