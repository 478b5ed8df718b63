"""Run exported ONNX graphs with onnxruntime behind the same API as the PyTorch models.

:class:`OnnxEncoder` has :meth:`Encoder.encode` (one implementation: :mod:`embforge.modeling.encoding`);
:class:`OnnxCrossEncoder` has ``predict(pairs)``. Both read a folder written by :func:`embforge.onnx.export.export_onnx` (graph, tokenizer files and
``embforge_onnx.json``). Pooling, normalisation and any Matryoshka truncation run inside the graph.

Example:
    >>> from embforge.encoder import Encoder
    >>> enc = Encoder.load("exported/model_int8.onnx", backend="onnx")  # doctest: +SKIP
    >>> enc.encode(["a cat", "a dog"]).shape  # doctest: +SKIP
    (2, 384)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from embforge._optional import require
from embforge.kind_names import ModelKind
from embforge.modeling.encoding import BatchEncoding

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from transformers import PreTrainedTokenizerBase

META_FILE = "embforge_onnx.json"


def read_export_meta(path: str | os.PathLike) -> tuple[Path, Path, dict[str, Any]]:
    """``(folder, graph file, metadata)`` for an export folder or one ``.onnx`` file inside it."""
    given = Path(path).expanduser()
    folder = given.parent if given.suffix == ".onnx" else given
    meta_file = folder / META_FILE
    if not meta_file.is_file():
        raise FileNotFoundError(
            f"{meta_file} not found: {given} is not an embforge ONNX export "
            "(create one with: embforge export onnx --model M --output DIR)"
        )
    meta = json.loads(meta_file.read_text())
    graph = given if given.suffix == ".onnx" else folder / meta["files"]["fp32"]
    if not graph.is_file():
        raise FileNotFoundError(
            f"ONNX graph {graph} does not exist (files listed in {meta_file}: {meta['files']})"
        )
    return folder, graph, meta


def make_session(graph: Path, *, threads: int | None = None) -> InferenceSession:
    """An onnxruntime CPU session with full graph optimisation."""
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(graph), sess_options=options, providers=["CPUExecutionProvider"])


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in an export folder (a broken ``tokenizer.json`` there is an error naming it)."""
    from transformers import AutoTokenizer

    from embforge.modeling.resolve import naming_broken_files

    with naming_broken_files(folder):
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> ``(input_ids, attention_mask)`` int64 arrays, right-padded with ``pad_id``."""
    width = max(len(x) for x in ids)
    batch = np.full((len(ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return batch, mask


class ExportedEncoder(BatchEncoding):
    """A bi-encoder export's settings, read from its ``embforge_onnx.json`` (pooling, normalisation, length,
    prompts, dimension), and its padded graph inputs: what the onnxruntime and OpenVINO runtimes share; each
    adds its inference engine and :meth:`embed_batch`."""

    backend: ClassVar[str] = "onnx"  # the runtime, as the server reports it
    width_step: ClassVar[int] = 1  # a padded call's sequence width is rounded up to a multiple of this

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, meta: dict[str, Any], *, graph: Path, inputs: set[str]
    ) -> None:
        self.tokenizer = tokenizer
        self.meta = meta
        self.graph = graph
        self.input_names = inputs
        self.pooling: str = meta["pooling"]
        self.normalize: bool = bool(meta["normalize"])
        self.max_seq_length: int = int(meta["max_seq_length"])
        self.prompts: dict[str, str] = dict(meta.get("prompts") or {})
        self.default_prompt_name: str | None = meta.get("default_prompt_name")
        self.append_token_id: int | None = meta.get("append_token_id")  # decoders (modeling/decoder.py)

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def feeds(self, ids: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        """The graph's inputs for token-id lists right-padded together (``token_type_ids`` zeros where the graph
        takes them)."""
        batch, mask = pad_batch(ids, self.pad_token_id)
        feeds = {"input_ids": batch, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(batch)
        return feeds


class OnnxEncoder(ExportedEncoder):
    """A bi-encoder running an exported graph: texts -> vectors, same ``encode()`` as :class:`Encoder`."""

    def __init__(
        self,
        session: InferenceSession,
        tokenizer: PreTrainedTokenizerBase,
        meta: dict[str, Any],
        *,
        graph: Path,
    ) -> None:
        super().__init__(tokenizer, meta, graph=graph, inputs={i.name for i in session.get_inputs()})
        self.session = session

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        threads: int | None = None,
        max_seq_length: int | None = None,
        pooling: str | None = None,
        normalize: bool | None = None,
    ) -> OnnxEncoder:
        """Load an export folder (its fp32 graph) or a specific ``.onnx`` file in it (e.g. ``model_int8.onnx``).

        ``pooling`` and ``normalize`` are baked into the graph; passing a different value is an error.
        """
        folder, graph, meta = read_export_meta(path)
        if meta.get("kind") != "bi-encoder":
            raise ValueError(f"{graph} is a {meta.get('kind')} export; load it with OnnxCrossEncoder")
        for name, value in (("pooling", pooling), ("normalize", normalize)):
            if value is not None and value != meta[name]:
                raise ValueError(
                    f"{name}={value!r} differs from the exported graph ({meta[name]!r}, fixed at export time); "
                    "re-export the model with the setting you want"
                )
        model = cls(make_session(graph, threads=threads), load_tokenizer(folder), meta, graph=graph)
        if max_seq_length is not None:
            model.max_seq_length = max_seq_length
        return model

    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One graph call on a list of token-id lists (padded together): ``(n, dim)`` float32."""
        return np.asarray(self.session.run(None, self.feeds(ids))[0], dtype=np.float32)

    def embed_token_ids(self, ids: Sequence[Sequence[int]], *, batch_size: int = 32) -> np.ndarray:
        """Embed tokenised texts in input order, in length-sorted batches of ``batch_size`` (the server's call)."""
        return self.embed_sorted(ids, batch_size=batch_size)


class OnnxCrossEncoder:
    """A cross-encoder running an exported graph: ``predict(pairs)`` -> one score per pair."""

    kind: ClassVar[ModelKind] = ModelKind.CROSS
    backend: ClassVar[str] = "onnx"
    parallel_batches: int = 1  # batches that may run at once (OpenVINO's streams)

    def __init__(
        self, session: InferenceSession, tokenizer: PreTrainedTokenizerBase, meta: dict[str, Any]
    ) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.meta = meta
        self.max_seq_length: int = int(meta["max_seq_length"])
        self._inputs = {i.name for i in session.get_inputs()}

    @classmethod
    def load(cls, path: str | os.PathLike, *, threads: int | None = None) -> OnnxCrossEncoder:
        """Load a cross-encoder export folder or one ``.onnx`` file in it."""
        folder, graph, meta = read_export_meta(path)
        if meta.get("kind") != "cross-encoder":
            raise ValueError(f"{graph} is a {meta.get('kind')} export; load it with OnnxEncoder")
        return cls(make_session(graph, threads=threads), load_tokenizer(folder), meta)

    @property
    def activation(self) -> str | None:
        return self.meta.get("activation")

    def logits(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's ``(n, labels)`` float32 logits for one padded batch of pairs."""
        return np.asarray(self.session.run(None, feeds)[0], dtype=np.float32)

    def predict(
        self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32, activation: bool = True
    ) -> np.ndarray:
        """Scores of ``(query, document)`` pairs: ``(n,)`` for one-label models, else ``(n, labels)``.

        Like :meth:`CrossEncoder.predict`: ``activation`` applies the model's activation (sigmoid when it was
        exported with one); ``False`` returns raw logits.
        """
        pairs = list(pairs)
        if not pairs:
            return np.zeros((0,), dtype=np.float32)
        scores = []
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            enc = self.tokenizer(
                [a for a, _ in chunk],
                [b for _, b in chunk],
                truncation=True,
                max_length=self.max_seq_length,
                padding=True,
                return_tensors="np",
            )
            feeds = {name: np.asarray(enc[name], dtype=np.int64) for name in self._inputs if name in enc}
            if "token_type_ids" in self._inputs and "token_type_ids" not in feeds:
                feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
            scores.append(self.logits(feeds))
        out = np.concatenate(scores)
        if activation and self.activation == "sigmoid":
            out = (1.0 / (1.0 + np.exp(-out))).astype(np.float32)
        return out[:, 0] if out.ndim == 2 and out.shape[1] == 1 else out
