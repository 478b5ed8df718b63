"""The serving record of dense and static embedders (one vector per text): :class:`DenseServing`.

Texts are tokenised by the server (the batch cost), and a batch of token-id lists runs through the model's batched
forward — the padding-free packed forward of a PyTorch :class:`~embforge.encoder.Encoder` or a static model
(``embed_ids``), or padded calls of an exported graph (``embed_batch``), the batch cut where the padded tokens saved
pay for another call (:func:`width_groups`). Answers are float vectors, base64 of little-endian float32, or
quantised codes (``int8``/``uint8`` with calibration ranges, ``binary``/``ubinary``: :mod:`embforge.quantization`);
``dimensions`` cuts a vector (Matryoshka) and re-normalises it when the model normalises. ``/search`` uses the
``--index`` folder (:class:`~embforge.serve.store.DocumentStore`).

Task adapters (:mod:`embforge.modeling.adapters`): a request's ``task`` tags its items (:class:`TaskIds`); a
micro-batch that merged requests of several tasks runs one forward per task, each with its adapter, never items of
two tasks in one forward. An unknown ``task`` is a 422 naming the field before anything is queued.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence

import numpy as np

from embforge.encoder import Encoder
from embforge.modeling.adapters import using_task
from embforge.modeling.encoding import BatchEncoding
from embforge.onnx.runtime import ExportedEncoder
from embforge.quantization import quantize
from embforge.serve.middleware import ApiError
from embforge.serve.requests import InputType
from embforge.serve.serving import BatchFn, Items, SearchStore, refuse_index_options
from embforge.static.model import StaticEncoder

EMBEDDING = "embedding"

# a padded call's fixed cost in padded tokens: MiniLM int8 on an OpenVINO stream took ~1.5 ms a call beside ~90 us a
# padded token; 8, 16 and 32 served short texts alike at 16 and 64 clients, 64 was slower (benchmarks/README.md,
# 2026-11-27)
CALL_TOKENS = 16


def width_groups(lengths: Sequence[int], *, step: int = 1, call_tokens: int = CALL_TOKENS) -> list[range]:
    """Cut items of ascending token ``lengths`` into consecutive groups, one padded call each, at the fewest padded
    tokens plus ``call_tokens`` a call (a call pads to its longest item, rounded up to a multiple of ``step``).

    Short texts padded to the width of the batch's longest one cost as much as that many long texts: on short
    STS-B sentences a batch of 32 padded to 16-token multiples was 46 % real tokens. The cuts can only pay where
    the padded width changes; the cheapest set of them comes from a dynamic programme over those points (a handful
    for short texts, so it costs microseconds).

    >>> width_groups([5, 6, 7, 40])  # one 40-token call for the three short ones would cost 160 tokens
    [range(0, 3), range(3, 4)]
    >>> width_groups([5, 6, 7, 40], step=16)  # widths 16, 16, 16, 48
    [range(0, 3), range(3, 4)]
    >>> width_groups([30, 31, 32])  # cutting saves fewer tokens than a call costs
    [range(0, 3)]
    """
    if not lengths:
        return []
    widths = [-(-n // step) * step for n in lengths]
    ends = [i for i in range(1, len(widths)) if widths[i] != widths[i - 1]] + [len(widths)]
    best: dict[int, tuple[int, int]] = {0: (0, 0)}  # end -> (cost of the items before it, start of its group)
    for end in ends:
        width = widths[end - 1]
        best[end] = min((best[start][0] + call_tokens + (end - start) * width, start) for start in best)
    groups = []
    end = len(widths)
    while end > 0:
        start = best[end][1]
        groups.append(range(start, end))
        end = start
    return groups[::-1]


class TaskIds(list[int]):
    """A batch item (token ids) to encode with the task adapter ``task``."""

    def __init__(self, ids: list[int], task: str) -> None:
        super().__init__(ids)
        self.task = task


def by_task(items: Items) -> dict[str | None, list[int]]:
    """Positions of ``items`` by their task (``None``: untagged, the base), in order of first appearance.

    >>> by_task([[1], TaskIds([2], "retrieval"), [3]])
    {None: [0, 2], 'retrieval': [1]}
    """
    groups: dict[str | None, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item.task if isinstance(item, TaskIds) else None, []).append(i)
    return groups


def embed_fn(model: BatchEncoding, max_tokens: int) -> BatchFn:
    """``token-id lists -> (n, dim) float32`` through ``model``'s batched forward (see the module docstring); one
    forward per task of the batch's items."""
    if not isinstance(model, (Encoder, StaticEncoder)):  # an exported graph: padded calls by width
        return padded_fn(model)
    import torch

    model.eval()

    def forward(ids: Items) -> np.ndarray:
        with torch.inference_mode():
            return model.embed_ids(ids, max_tokens=max_tokens).float().cpu().numpy()

    def run(ids: Items) -> np.ndarray:
        groups = by_task(ids)
        if len(groups) == 1 and None in groups:
            return forward(ids)
        assert isinstance(model, Encoder)  # only an Encoder's items carry tasks (DenseServing.batch_items)
        out = np.empty((len(ids), model.dim), dtype=np.float32)
        for task, rows in groups.items():
            with using_task(model, task):
                out[rows] = forward([ids[i] for i in rows])
        return out

    return run


def padded_fn(model: BatchEncoding) -> BatchFn:
    """``token-id lists -> (n, dim) float32`` through a padded graph: the batch sorted by length and cut by
    :func:`width_groups`, the calls one after another on the batcher's thread (its stream)."""
    step = model.width_step if isinstance(model, ExportedEncoder) else 1

    def run(ids: Items) -> np.ndarray:
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), model.dim), dtype=np.float32)
        for group in width_groups([len(ids[i]) for i in order], step=step):
            rows = [order[i] for i in group]
            out[rows] = model.embed_batch([ids[i] for i in rows])
        return out

    return run


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (a zero row stays zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class DenseServing:
    """A dense (or static) embedder as the server serves it; ``ranges``: its int8/uint8 calibration ranges."""

    name = EMBEDDING
    pair_inputs: tuple[InputType | None, InputType | None] = (None, None)  # both texts as they are

    def __init__(self, model: BatchEncoding, *, ranges: np.ndarray | None = None) -> None:
        self.model = model
        self.ranges = ranges
        self.dim = int(model.dim)

    def prefix(self, input_type: InputType | None, prompt_name: str | None) -> str:
        """The prompt put before each text: the named one, else the model's prompt for ``input_type``."""
        prompts = self.model.prompts
        if prompt_name is not None:
            if prompt_name not in prompts:
                known = ", ".join(sorted(prompts)) or "none"
                raise ApiError(
                    422, f"unknown prompt name {prompt_name!r}; this model has: {known}", "prompt_name"
                )
            return prompts[prompt_name]
        if input_type == "query":
            return prompts.get("query", "")
        if input_type == "document":
            return prompts.get("document") or prompts.get("passage") or ""
        return ""

    def batch_items(
        self,
        texts: list[str],
        *,
        input_type: InputType | None,
        prompt_name: str | None,
        task: str | None = None,
    ) -> tuple[Items, list[int]]:
        tasks = self.model.tasks if isinstance(self.model, Encoder) else []  # PyTorch models hold adapters
        if task is not None and task not in tasks:
            have = (
                f"this model's tasks are {', '.join(tasks)}" if tasks else "this model has no task adapters"
            )
            raise ApiError(422, f"unknown task {task!r}: {have} (omit 'task' for the base model)", "task")
        start = self.prefix(input_type, prompt_name)
        ids = self.model.tokenize_ids([start + t for t in texts] if start else texts)
        if task is not None:
            ids = [TaskIds(x, task) for x in ids]
        return ids, [len(x) for x in ids]

    def batched(self, max_tokens: int) -> BatchFn:
        return embed_fn(self.model, max_tokens)

    def check(self, *, encoding_format: str, dimensions: int | None) -> None:
        if dimensions is not None and not 0 < dimensions <= self.dim:
            raise ApiError(
                422, f"'dimensions' must be between 1 and {self.dim}, got {dimensions}", "dimensions"
            )
        cut = dimensions is not None and dimensions < self.dim
        if encoding_format in ("int8", "uint8") and (self.ranges is None or cut):
            why = (
                "with 'dimensions' (its calibration ranges are for full vectors)"
                if cut
                else "for this model: it has no calibration ranges (start the server with --calibration FILE)"
            )
            raise ApiError(
                422, f"'encoding_format' {encoding_format} is not available {why}", "encoding_format"
            )

    def answer(
        self, rows: np.ndarray, *, encoding_format: str, dimensions: int | None
    ) -> list[dict[str, object]]:
        vectors = rows
        if dimensions is not None and dimensions < self.dim:
            vectors = vectors[:, :dimensions]
            if self.model.normalize:
                vectors = unit(vectors)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if encoding_format == "base64":
            out: Sequence[object] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
        elif encoding_format == "float":
            out = list(vectors)
        else:
            out = list(quantize(vectors, encoding_format, self.ranges).astype(np.int32))
        return [{"embedding": row} for row in out]

    def similarity(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Cosine of each pair."""
        a, b = unit(np.asarray(first, dtype=np.float32)), unit(np.asarray(second, dtype=np.float32))
        return np.einsum("ij,ij->i", a, b)

    def open_store(
        self, given: SearchStore | None, *, kind: str | None, options: Mapping[str, object] | None = None
    ) -> SearchStore | None:
        if given is None:
            refuse_index_options(options, "the options of a new index folder: give the folder (--index DIR)")
        if given is None and kind is not None:
            raise ValueError(
                f"index kind {kind!r} is the kind of an index folder: give the folder (--index DIR)"
            )
        return given

    def describe(self) -> dict[str, object]:
        formats = ["binary", "ubinary"] + (["int8", "uint8"] if self.ranges is not None else [])
        tasks = self.model.tasks if isinstance(self.model, Encoder) else []
        return {"quantized_formats": formats, **({"tasks": tasks} if tasks else {})}
