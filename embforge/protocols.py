"""The contracts between embforge's parts: what a model, a pair scorer and a loss offer the code that uses them.

Evaluators, the retrieval code, the server and the trainer take these :class:`~typing.Protocol`\\ s rather than
concrete classes, so a PyTorch :class:`~embforge.encoder.Encoder`, an exported ONNX/OpenVINO graph, a static
model or a sharding wrapper all fit where they offer the same methods. What a model *is* (dense, cross,
multi-vector, sparse, static) is declared by its ``kind`` (:mod:`embforge.kinds`), never guessed from which
attributes it happens to have; what a loss takes (embeddings or pair scores) is declared by its base class.

The arguments every model kind's ``load`` shares are named here too (:data:`ModelPath`, :data:`DeviceLike`,
:class:`LoadOptions`). Protocols are never imported at run time by the classes that satisfy them: conformance is
structural and checked by mypy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypedDict

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import Tensor
    from typing_extensions import Unpack

    from embforge.kind_names import ModelKind

# What every model kind's ``load`` takes (and each helper that finds a model's folder): a model folder, a known
# alias (all-MiniLM-L6-v2) or a Hub id; and where the loaded model goes (None: where it was built, the CPU).
ModelPath: TypeAlias = "str | os.PathLike"
DeviceLike: TypeAlias = "str | torch.device | None"


class LoadOptions(TypedDict, total=False):
    """The keyword options of every model kind's ``load(path, **options)`` (a kind adds its own before them)."""

    device: DeviceLike  # where to put the model (None: the CPU)
    max_seq_length: int | None  # the most tokens of one input, longer ones cut (None: the folder's setting)


PairIds = tuple[
    list[int], list[int] | None
]  # a tokenised pair: token ids, token type ids (None without them)


class Kinded(Protocol):
    """Anything that declares its model kind (:class:`~embforge.kinds.ModelKind`)."""

    @property
    def kind(self) -> ModelKind: ...


class Tokenizer(Protocol):
    """The part of a Hugging Face (fast) tokenizer embforge calls: ``tokenizer(texts, ...)`` and saving."""

    def __call__(self, text: list[str], text_pair: list[str] | None = None, **options: object) -> Mapping: ...

    def save_pretrained(self, path: str | os.PathLike) -> object: ...


class TextTokenizing(Protocol):
    """A model that tokenises texts itself: prompts (named prefixes) and token ids, truncated, not padded."""

    def prompt_text(self, prompt: str | None = None, prompt_name: str | None = None) -> str: ...

    def tokenize_ids(
        self, texts: Sequence[str], *, prefix: str = "", is_query: bool = False
    ) -> list[list[int]]:
        """Token ids of ``texts``; ``is_query``: the texts are queries (the one way a query column is marked:
        a kind that treats queries apart — ColBERT's marker, inference-free SPLADE's table — does it here)."""
        ...


class BatchOptions(TypedDict, total=False):
    """The keyword options of every text model's ``encode`` (dense, sparse): batching, prompts and progress."""

    batch_size: int  # texts per forward pass (texts are length-sorted first, so batches pad little)
    prompt: str | None  # a literal prefix for every text (overrides prompt_name)
    prompt_name: str | None  # the name of one of the model's prompts (e.g. "query")
    show_progress: bool | None  # a progress bar; None: the command's setting (embforge.progress)
    on_batch: Callable[[int], None] | None  # called with each batch's size once it is embedded


class EncodeOptions(BatchOptions, total=False):
    """The keyword options of :meth:`Embedder.encode`
    (:meth:`embforge.modeling.encoding.BatchEncoding.encode` documents each)."""

    normalize: bool | None  # L2-normalise the output; None: the model's own setting
    dim: int | None  # keep the first dim dimensions (Matryoshka), re-normalised when normalising


class Embedder(Kinded, TextTokenizing, Protocol):
    """A bi-encoder at inference: texts -> ``(n, dim)`` float32 vectors (``(dim,)`` for one string).

    PyTorch :class:`~embforge.encoder.Encoder`, the ONNX and OpenVINO runtimes, static models and the wrappers
    around them (sharded encoding, Matryoshka views) all offer it.
    """

    @property
    def dim(self) -> int: ...

    @property
    def normalize(self) -> bool: ...

    @property
    def prompts(self) -> dict[str, str]: ...

    def encode(self, texts: str | Sequence[str], **options: Unpack[EncodeOptions]) -> np.ndarray: ...


class BatchEmbedder(Embedder, Protocol):
    """An :class:`Embedder` whose forward passes can be planned and run batch by batch (sharded encoding)."""

    def batch_plan(self, lengths: Sequence[int], batch_size: int) -> list[range]: ...

    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray: ...

    def inference(self) -> AbstractContextManager[object]: ...


class HasWeights(Protocol):
    """A PyTorch model's weights by name (what fingerprints of cached embeddings hash)."""

    def state_dict(self) -> Mapping[str, Tensor]: ...


class TrainableModel(Kinded, HasWeights, Protocol):
    """What the trainer, checkpoints and weight averaging need of any model kind: a PyTorch module that saves
    itself as a folder."""

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def train(self, mode: bool = True) -> object: ...

    def eval(self) -> object: ...

    @property
    def training(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    def save(self, path: str | os.PathLike) -> None: ...


class TrainableEmbedder(Embedder, TrainableModel, Protocol):
    """A bi-encoder the trainer can fine-tune: token-id lists -> embeddings with gradients."""

    def embed_ids(self, ids: Sequence[list[int]], *, max_tokens: int | None = None) -> Tensor: ...


class PairScorer(Kinded, Protocol):
    """A cross-encoder at inference: ``(text, text)`` pairs -> scores (``(n,)`` for one label)."""

    @property
    def max_seq_length(self) -> int: ...

    def predict(
        self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32, activation: bool = True
    ) -> np.ndarray: ...


class TaskBatches(Protocol):
    """A prepared training task as one micro-step uses it (:mod:`embforge.training.tasks`): the model inputs of
    some rows, their labels, and the task's loss of the model's outputs for those inputs."""

    def inputs(self, rows: Sequence[int]) -> Sequence[object]: ...

    def labels(self, rows: Sequence[int]) -> Tensor | None: ...

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor: ...


class Loss(Protocol):
    """What the trainer reads of a loss before calling it: the data it needs and the kind of input it takes.

    The values are declared once, on :class:`embforge.losses.base.Loss` (bi-encoder losses take the embeddings of
    each text column, :class:`~embforge.losses.cross.CrossLoss` subclasses take pair scores); the trainer checks a
    task's data against them and never inspects a loss for attributes.
    """

    name: str
    min_texts: int
    max_texts: int | None
    needs_labels: bool
    repeat_single_text: bool
    fixed_dim: bool
    in_batch_negatives: bool

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray: ...
