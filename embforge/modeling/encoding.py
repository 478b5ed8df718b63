"""``encode()`` of every bi-encoder runtime (PyTorch :class:`~embforge.encoder.Encoder`, ONNX encoder).

A runtime gives one padded forward pass over a batch of token-id lists (:meth:`BatchEncoding.embed_batch`); this
module does the rest the same way for all: prompts, length-sorted batches, progress, Matryoshka truncation and
normalisation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import ClassVar

import numpy as np

from embforge.kind_names import ModelKind
from embforge.modeling.padding import sort_by_length
from embforge.modeling.tokenizing import PromptTokenizing
from embforge.progress import progress_bar, progress_enabled


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (rows of norm below ``1e-12`` divided by ``1e-12``, like ``F.normalize``)."""
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(x.dtype)


class BatchEncoding(PromptTokenizing):
    """Mixin: :meth:`encode` for a runtime with ``dim``, ``normalize`` and :meth:`embed_batch`
    (plus :class:`PromptTokenizing`'s attributes)."""

    kind: ClassVar[ModelKind] = ModelKind.DENSE  # exported graphs and static models are bi-encoders
    normalize: bool
    parallel_batches: int = 1  # batches that may run at once (a runtime with several inference streams)

    @property
    def dim(self) -> int:
        raise NotImplementedError

    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One forward pass over token-id lists padded together: ``(n, dim)`` float32 in the model's own
        normalisation."""
        raise NotImplementedError

    def inference(self) -> AbstractContextManager[object]:
        """The context :meth:`encode` runs its forward passes in: nothing here (exported graphs); PyTorch models
        put :class:`~embforge.modeling.module.SavedModule` first in their bases, whose ``inference()`` is eval
        mode and no autograd."""
        return nullcontext()

    def batch_plan(self, lengths: Sequence[int], batch_size: int) -> list[range]:
        """How :meth:`embed_sorted` cuts texts of these token ``lengths`` (sorted, longest first) into forward
        passes: positions of each batch. Here fixed batches of ``batch_size`` texts; runtimes with a
        padding-free forward fill batches by tokens (:meth:`embforge.encoder.Encoder.batch_plan`). Sharded
        encoding splits the same plan across processes, so every forward is the one a single process runs."""
        size = max(1, batch_size)
        return [range(start, min(start + size, len(lengths))) for start in range(0, len(lengths), size)]

    def embed_sorted(
        self,
        ids: Sequence[Sequence[int]],
        *,
        batch_size: int = 32,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed tokenised texts in input order, length-sorted and cut by :meth:`batch_plan` (``on_batch``:
        called with each batch's size once it is embedded)."""
        order = sort_by_length(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        plan = [
            [order[i] for i in rows] for rows in self.batch_plan([len(ids[i]) for i in order], batch_size)
        ]

        def run(chosen: list[int]) -> None:
            out[chosen] = self.embed_batch([ids[i] for i in chosen])
            if on_batch is not None:
                on_batch(len(chosen))

        if self.parallel_batches > 1 and len(plan) > 1:  # one batch per stream in flight
            with ThreadPoolExecutor(self.parallel_batches, thread_name_prefix="embforge-stream") as pool:
                list(pool.map(run, plan))
        else:
            for chosen in plan:
                run(chosen)
        return out

    def encode(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = 32,
        normalize: bool | None = None,
        dim: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        show_progress: bool | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed texts for inference.

        Args:
            texts: One text or a list of texts.
            batch_size: Texts per forward pass; texts are sorted by token length first so batches pad little.
            normalize: L2-normalise the output; ``None`` keeps the model's own setting.
            dim: Keep only the first ``dim`` dimensions (Matryoshka); re-normalised when normalising.
            prompt: A literal prefix for every text (overrides ``prompt_name``).
            prompt_name: The name of one of the model's prompts (e.g. ``"query"``).
            show_progress: Progress bar; ``None``: the command's setting (``embforge`` verbs show it unless
                ``--quiet``), else shown for long inputs on a terminal (:mod:`embforge.progress`).
            on_batch: Called with the number of texts of each batch once it is embedded (a caller's own bar).

        Returns:
            ``(n, dim)`` float32 array (or ``(dim,)`` for a single string).
        """
        single = isinstance(texts, str)
        batch: list[str] = [texts] if isinstance(texts, str) else list(texts)
        if dim is not None and not 0 < dim <= self.dim:
            raise ValueError(f"dim must be between 1 and the model's dimension {self.dim}, got {dim}")
        if not batch:  # e.g. a process of a sharded job that got no rows
            return np.zeros((0, dim or self.dim), dtype=np.float32)
        n_batches = (len(batch) + batch_size - 1) // batch_size
        enabled = progress_enabled(show_progress, steps=n_batches)
        bar = progress_bar(total=len(batch), desc="encode", unit="text", enabled=enabled)

        def embedded(n: int) -> None:
            bar.update(n)
            if on_batch is not None:
                on_batch(n)

        with self.inference():
            ids = self.tokenize_ids(batch, prefix=self.prompt_text(prompt, prompt_name))
            out = self.embed_sorted(ids, batch_size=batch_size, on_batch=embedded)
        bar.close()
        do_norm = self.normalize if normalize is None else normalize
        if dim is not None:
            out = out[:, :dim]
        if do_norm and (dim is not None or not self.normalize):
            out = l2_normalize(out)
        return out[0] if single else out


def reports_batches(model: object) -> bool:
    """Whether ``model.encode`` takes ``on_batch`` (a progress callback per forward): named in its signature, or
    in the one an override reaches through ``**options`` (``Encoder.encode(task=...)`` over :meth:`BatchEncoding.encode`)."""
    for cls in type(model).__mro__:
        if "encode" not in cls.__dict__:
            continue
        parameters = inspect.signature(cls.__dict__["encode"]).parameters
        if "on_batch" in parameters:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return False
    return False
