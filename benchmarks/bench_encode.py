"""Encode throughput on CPU, fastest path against fastest path: embforge's backends vs sentence-transformers'.

embforge: PyTorch, ONNX Runtime fp32 / dynamic int8, OpenVINO fp32 / static int8 (NNCF, calibrated on STS-B *train*
sentences) — the backends ``embforge serve --backend`` offers (:mod:`embforge.onnx.backends`).
sentence-transformers: PyTorch, OpenVINO fp32 (``backend="openvino"``) and OpenVINO static int8
(``export_static_quantized_openvino_model``, calibrated offline on the same STS-B train sentences from a local CSV).
Its OpenVINO backend needs ``optimum-intel``, whose pins conflict with embforge's, so the sentence-transformers runners
live in a worker process started from ``.bench-venvs/st-openvino`` (``optimum-intel[openvino,nncf]``; torch and the
rest shared with the main venv); without that venv only its PyTorch path runs, in this process.

All encode the unique STS-B test sentences with the same batch size. Runs are interleaved round by round (the
order rotates each round) so all see the same machine load; the table reports the median sentences/s, the ratio
to sentence-transformers' fastest path and the STS-B test Spearman of each.

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/bench_encode.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / ".bench-venvs" / "st-openvino" / "bin" / "python"  # --peer-venv changes it


def spearman_of(emb: np.ndarray, sentences: list[str], data) -> float:
    """STS-B Spearman (0-100) of cosine similarity, from the embeddings of the unique sentences."""
    from embforge.evaluate.similarity import correlations

    s1, s2 = data.columns["sentence1"], data.columns["sentence2"]
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    pos = {t: i for i, t in enumerate(sentences)}
    cos = (emb[[pos[t] for t in s1]] * emb[[pos[t] for t in s2]]).sum(1)
    return correlations(cos, np.asarray(data.labels(), dtype=np.float64))["spearman"]


def peer_worker(model: str, work: Path, batch_size: int) -> None:
    """The sentence-transformers side (run in the peer venv): reads ``{"run": name, "texts": file}`` lines, encodes,
    answers ``{"seconds": s, "out": file}``."""
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers import SentenceTransformer, export_static_quantized_openvino_model

    runners = {"sentence-transformers torch": SentenceTransformer(model, device="cpu")}
    runners["sentence-transformers openvino"] = SentenceTransformer(model, device="cpu", backend="openvino")
    quantized = work / "st-openvino-int8"
    if not (quantized / "openvino" / "openvino_model_qint8_quantized.xml").exists():
        tmp = SentenceTransformer(model, device="cpu", backend="openvino")
        tmp.save(str(quantized))
        export_static_quantized_openvino_model(
            tmp,
            OVQuantizationConfig(),
            str(quantized),
            dataset_name=str(work / "calibration"),
            dataset_config_name="default",
            dataset_split="train",
            column_name="sentence",
        )
    runners["sentence-transformers openvino int8"] = SentenceTransformer(
        str(quantized),
        device="cpu",
        backend="openvino",
        model_kwargs={"file_name": "openvino/openvino_model_qint8_quantized.xml"},
    )
    print(json.dumps({"ready": list(runners)}), flush=True)
    for line in sys.stdin:
        task = json.loads(line)
        texts = Path(task["texts"]).read_text().split("\n")
        start = time.perf_counter()
        emb = runners[task["run"]].encode(texts, batch_size=batch_size, convert_to_numpy=True)
        seconds = time.perf_counter() - start
        out = work / "peer_out.npy"
        np.save(out, np.asarray(emb, dtype=np.float32))
        print(json.dumps({"seconds": seconds, "out": str(out)}), flush=True)


def peer_python() -> Path:
    """The Python of the sentence-transformers OpenVINO venv (``--peer-venv``, else ``.bench-venvs/st-openvino``)."""
    given = os.environ.get("EMBFORGE_PEER_VENV")
    return Path(given) / "bin" / "python" if given else PEER_VENV


class Peer:
    """The worker process of :func:`peer_worker`; ``run(name)`` encodes all sentences there."""

    def __init__(self, model: str, work: Path, batch_size: int, sentences: list[str]) -> None:
        self.texts = work / "sentences.txt"
        self.texts.write_text("\n".join(sentences))
        cmd = [str(peer_python()), __file__, "--peer-worker", "--model", model, "--work", str(work)]
        cmd += ["--batch-size", str(batch_size)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith('{"ready"'):
                self.names = json.loads(line)["ready"]
                break
        else:
            raise RuntimeError("the sentence-transformers worker did not start")

    def run(self, name: str) -> tuple[float, np.ndarray]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"run": name, "texts": str(self.texts)}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return answer["seconds"], np.load(answer["out"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of every runtime")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--model", default=None, help="model folder (default: the installed all-MiniLM-L6-v2)"
    )
    parser.add_argument("--work", default=None, help="folder for exports (default: a temp folder)")
    parser.add_argument(
        "--streams",
        type=int,
        default=0,
        help="OpenVINO inference streams of embforge's openvino backends (0: OpenVINO's throughput choice, one "
        "batch per stream in flight; 1: latency mode); openvino-int8 also runs with one stream for comparison",
    )
    parser.add_argument(
        "--peer-venv", default=None, help="the st-openvino venv (default .bench-venvs/st-openvino)"
    )
    parser.add_argument("--peer-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_venv:
        os.environ["EMBFORGE_PEER_VENV"] = args.peer_venv
    work = Path(args.work or tempfile.mkdtemp(prefix="embforge-bench-encode-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.peer_worker:
        peer_worker(args.model, work, args.batch_size)
        return

    import torch

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table
    from embforge.modeling.resolve import resolve_model_path
    from embforge.onnx.backends import load_embedder

    columns = "0=sentence1,1=sentence2,2=score"
    data = read_table(data_root() / "stsb_en" / "stsb-en-test.csv", header=None, columns=columns)
    train = read_table(data_root() / "stsb_en" / "stsb-en-train.csv", header=None, columns=columns)
    calibration = list(dict.fromkeys(train.columns["sentence1"]))[:1000]
    (work / "calibration").mkdir(exist_ok=True)
    (work / "calibration" / "train.csv").write_text(
        "sentence\n" + "\n".join(json.dumps(t) for t in calibration) + "\n"
    )
    sentences = list(dict.fromkeys(data.columns["sentence1"] + data.columns["sentence2"]))
    model = str(args.model or resolve_model_path("all-MiniLM-L6-v2"))
    bs = args.batch_size
    if args.threads:
        torch.set_num_threads(args.threads)
    runners = {}
    plans = [(b, 1) for b in ("torch", "onnx", "onnx-int8")]
    plans += [("openvino", args.streams), ("openvino-int8", args.streams)]
    if args.streams != 1:
        plans.append(("openvino-int8", 1))
    for backend, streams in plans:
        encoder = load_embedder(
            model, backend=backend, threads=args.threads, calibration=calibration, cache=work, streams=streams
        )
        name = f"embforge {backend}" + (
            " 1 stream" if streams == 1 and backend.startswith("openvino") else ""
        )
        runners[name] = lambda t, e=encoder: e.encode(t, batch_size=bs)
    peer = None
    if peer_python().exists():
        peer = Peer(model, work, bs, sentences)
    else:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(model, device="cpu")
        runners["sentence-transformers torch"] = lambda t: st.encode(t, batch_size=bs, convert_to_numpy=True)
    names = list(runners) + (peer.names if peer else [])
    for run in runners.values():  # warm-up
        run(sentences[:64])
    times: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name in runners:
                start = time.perf_counter()
                outputs[name] = np.asarray(runners[name](sentences), dtype=np.float32)
                times[name].append(time.perf_counter() - start)
            else:
                assert peer is not None
                seconds, outputs[name] = peer.run(name)
                times[name].append(seconds)
        print(
            f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names),
            flush=True,
        )
    if peer is not None:
        peer.close()
    report(names, times, outputs, sentences, data, bs, args)


def report(names, times, outputs, sentences, data, bs, args) -> None:
    spearman = {name: spearman_of(outputs[name], sentences, data) for name in names}
    rate = {name: len(sentences) / statistics.median(times[name]) for name in names}
    peers = [n for n in names if n.startswith("sentence-transformers")]
    best_peer = max(peers, key=lambda n: rate[n])
    ours = [n for n in names if n.startswith("embforge")]
    best = max(ours, key=lambda n: rate[n] if spearman[n] >= spearman["embforge torch"] - 0.5 else 0)
    print(
        f"\n{len(sentences)} unique STS-B test sentences, batch {bs}, {args.rounds} interleaved rounds, "
        f"threads {args.threads or 'default'}, CPU cores {os.cpu_count()}"
    )
    print(f"| runner | sentences/s (median) | vs {best_peer} | STS-B test Spearman |")
    print("|---|---:|---:|---:|")
    for name in names:
        print(f"| {name} | {rate[name]:.0f} | {rate[name] / rate[best_peer]:.2f}x | {spearman[name]:.2f} |")
    print(
        f"\nfastest vs fastest (within 0.5 STS-B of fp32): {best} / {best_peer} = "
        f"{rate[best] / rate[best_peer]:.2f}x (STS-B {spearman[best]:.2f} vs fp32 {spearman['embforge torch']:.2f})"
    )


if __name__ == "__main__":
    main()
