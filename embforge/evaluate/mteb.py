"""Use an embforge encoder with the ``mteb`` package (``pip install 'embforge[mteb]'``), and run MTEB tasks
from local files.

:class:`MTEBEncoder` implements mteb's encoder protocol (``encode(DataLoader, *, task_metadata, hf_split,
hf_subset, prompt_type)``, ``similarity``, ``similarity_pairwise``, ``mteb_model_meta``). MTEB tasks normally
download their data from the Hugging Face hub; :func:`local_task` instead fills a task with rows read from disk
(an embforge :class:`~embforge.data.tables.Dataset` per split), so e.g. ``Banking77Classification`` runs offline on
``../shared/data/banking77``::

    from embforge.data.builtin.banking77 import load_banking77
    task = local_task("Banking77Classification", {"train": load_banking77("train_all"),
                                                   "test": load_banking77("test")})
    result = run_mteb(Encoder.load("all-MiniLM-L6-v2"), task)   # {"accuracy": ..., "f1": ...} (0-100)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from embforge._optional import require
from embforge.data.tables import Dataset

if TYPE_CHECKING:
    import numpy.typing as npt
    from torch import Tensor

    from embforge.protocols import Embedder


class MTEBEncoder:
    """An embforge encoder seen through mteb's ``EncoderProtocol``.

    Args:
        model: An :class:`~embforge.protocols.Embedder` (e.g. an :class:`~embforge.encoder.Encoder`).
        name: Model name reported in mteb results (``org/name`` form).
        batch_size: Encoding batch size (mteb's ``encode_kwargs["batch_size"]`` wins when given).
        normalize: L2-normalise embeddings; ``None`` keeps the model's own setting (as mteb's
            sentence-transformers wrapper does; classifiers on the embeddings are scale-sensitive).

    mteb's ``prompt_type`` (``query`` / ``document``) selects the model prompt of that name when the model has
    one (``"document"`` also tries ``"passage"``), as sentence-transformers does.
    """

    def __init__(
        self,
        model: Embedder,
        *,
        name: str = "embforge/model",
        batch_size: int = 32,
        normalize: bool | None = None,
    ) -> None:
        self.model = model
        self.name = name if "/" in name else f"embforge/{name}"
        self.batch_size = batch_size
        self.normalize = normalize

    @property
    def mteb_model_meta(self) -> object:
        meta = require("mteb.models.model_meta")
        return meta.ModelMeta.create_empty(
            {
                "name": self.name,
                "revision": "local",
                "embed_dim": int(self.model.dim),
                "framework": ["PyTorch"],
            }
        )

    def _prompt_name(self, prompt_type: object) -> str | None:
        if prompt_type is None:
            return None
        value = str(getattr(prompt_type, "value", prompt_type))
        for candidate in (value, "passage" if value == "document" else None):
            if candidate and candidate in self.model.prompts:
                return candidate
        return None

    def encode(
        self,
        inputs: Iterable[Mapping[str, Iterable[object]]],
        *,
        task_metadata: object = None,
        hf_split: str = "",
        hf_subset: str = "",
        prompt_type: object = None,
        batch_size: int | None = None,
        **kwargs: object,
    ) -> np.ndarray:
        """Embed every ``text`` of mteb's batches, in order; returns ``(n, dim)`` float32."""
        texts: list[str] = []
        for batch in inputs:
            if "text" not in batch:
                raise ValueError(
                    f"mteb gave a batch without a 'text' field (fields: {sorted(batch)}); only text is supported"
                )
            texts.extend(str(t) for t in batch["text"])
        return self.model.encode(
            texts,
            batch_size=int(batch_size or self.batch_size),
            normalize=self.normalize,
            prompt_name=self._prompt_name(prompt_type),
        )

    def similarity(self, embeddings1: npt.ArrayLike, embeddings2: npt.ArrayLike) -> Tensor:
        """Cosine similarity matrix ``(n1, n2)`` (a torch tensor, as mteb expects)."""
        import torch

        a = torch.nn.functional.normalize(
            torch.as_tensor(np.asarray(embeddings1), dtype=torch.float32), dim=-1
        )
        b = torch.nn.functional.normalize(
            torch.as_tensor(np.asarray(embeddings2), dtype=torch.float32), dim=-1
        )
        return a @ b.T

    def similarity_pairwise(self, embeddings1: npt.ArrayLike, embeddings2: npt.ArrayLike) -> Tensor:
        """Row-wise cosine similarity ``(n,)``."""
        import torch

        a = torch.as_tensor(np.asarray(embeddings1), dtype=torch.float32)
        b = torch.as_tensor(np.asarray(embeddings2), dtype=torch.float32)
        return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def local_task(name: str, splits: Mapping[str, Dataset], *, label_names: list[str] | None = None) -> object:
    """The mteb task ``name`` with its data taken from ``splits`` (split name -> ``text, label`` Dataset).

    Only single-text tasks with a ``text`` input and a ``label`` column (classification, clustering) are filled
    this way; the task's own evaluation protocol (sub-sampling, seeds, metrics) is unchanged.
    """
    mteb = require("mteb")
    datasets = require("datasets")
    task = mteb.get_task(name)
    columns = {}
    for split, data in splits.items():
        data.require(["text", "label"], purpose=f"mteb task {name} ({split})")
        labels = data.labels()
        assert labels is not None
        columns[split] = datasets.Dataset.from_dict(
            {"text": list(data.columns["text"]), "label": labels.tolist()}
        )
    task.dataset = datasets.DatasetDict(columns)
    task.data_loaded = True
    return task


def run_mteb(
    model: Embedder,
    task: object,
    *,
    batch_size: int = 32,
    name: str = "embforge/model",
    predictions: str | Path | None = None,
) -> dict[str, float]:
    """Evaluate ``model`` on one (already loaded) mteb task offline; returns the test split's scores (0-100).
    ``predictions``: a folder where mteb writes its per-item predictions (``<task>_predictions.json``; for a
    classification task one list per experiment)."""
    mteb = require("mteb")
    result = mteb.evaluate(
        MTEBEncoder(model, name=name, batch_size=batch_size),
        task,
        cache=None,
        show_progress_bar=False,
        encode_kwargs={"batch_size": batch_size},
        prediction_folder=predictions,
    )
    scores = result.task_results[0].scores
    split = "test" if "test" in scores else next(iter(scores))
    first = scores[split][0]
    return {
        k: 100.0 * float(v)
        for k, v in first.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
