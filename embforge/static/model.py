"""StaticEncoder: a text's embedding is the mean of its tokens' rows in one table (no transformer).

A model2vec / sentence-transformers ``StaticEmbedding`` model: tokenise (no special tokens), look every token's
row up, average (``nn.EmbeddingBag``), optionally L2-normalise. Encoding is a tokeniser call and one gather, tens
to hundreds of times faster than a transformer on a CPU; :func:`embforge.static.distill.distill_static` makes
the table from a transformer, and the usual losses train it further (``--model-type static``).

Folders are model2vec's layout, which sentence-transformers reads as a ``StaticEmbedding`` module:
``model.safetensors`` (``embeddings``: the table), ``tokenizer.json``, ``config.json`` (model2vec's settings),
``modules.json`` (``StaticEmbedding`` at the root, then ``Normalize`` when normalising).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from embforge.kind_names import ModelKind
from embforge.modeling import st_folder
from embforge.modeling.encoding import BatchEncoding
from embforge.modeling.module import SavedModule
from embforge.modeling.resolve import resolve_model_path

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from embforge.protocols import LoadOptions, ModelPath

ST_STATIC = "sentence_transformers.models.StaticEmbedding"


def fold_model2vec(weights: dict[str, Tensor]) -> Tensor:
    """One row per token id from a model2vec ``model.safetensors`` (``embeddings``, optional vocabulary-quantising
    ``mapping`` and per-token ``weights``), or sentence-transformers' ``embedding.weight``."""
    if "embedding.weight" in weights:
        return weights["embedding.weight"].float()
    table = weights["embeddings"].float()
    if "mapping" in weights:
        table = table[weights["mapping"].long()]
    if "weights" in weights:
        table = table * weights["weights"].float()[:, None]
    return table


class StaticEncoder(SavedModule, BatchEncoding):
    """Texts -> the (optionally normalised) mean of their tokens' embeddings.

    Example: all-MiniLM-L6-v2 distilled into a token table (``embforge distill-static``; model2vec's folder,
    which ``model2vec.StaticModel`` and sentence-transformers load too), encoding ~170x faster than MiniLM on a
    CPU (``benchmarks/static_minilm.py``):

        >>> from embforge.static.distill import distill_static  # doctest: +SKIP
        >>> folder = distill_static("all-MiniLM-L6-v2", "runs/minilm-static", pca_dims=256)  # doctest: +SKIP
        >>> model = StaticEncoder.load(folder)  # doctest: +SKIP
        >>> model.embedding.num_embeddings, model.dim  # doctest: +SKIP
        (29525, 256)
    """

    kind: ClassVar[ModelKind] = ModelKind.STATIC

    def __init__(
        self,
        table: Tensor,
        tokenizer: Any,
        *,
        normalize: bool = True,
        max_seq_length: int = 512,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        config: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag.from_pretrained(table.float(), freeze=False, mode="mean")
        self.tokenizer = tokenizer  # a ``tokenizers.Tokenizer``
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        self.config = dict(config or {})  # model2vec's config.json, kept for the next save

    @property
    def dim(self) -> int:
        return int(self.embedding.embedding_dim)

    # ------------------------------------------------------------------ tokens and forward
    def tokenize_ids(
        self, texts: Sequence[str], *, prefix: str = "", is_query: bool = False
    ) -> list[list[int]]:
        """Token ids of each text, without special tokens, cut at ``max_seq_length`` (model2vec's tokenisation);
        queries and documents alike."""
        encodings = self.tokenizer.encode_batch([prefix + t for t in texts], add_special_tokens=False)
        return [e.ids[: self.max_seq_length] for e in encodings]

    def forward(
        self,
        ids: Sequence[Sequence[int]],
        attention_mask: Tensor | None = None,
        *,
        max_tokens: int | None = None,
        dropout_seed: int | None = None,
        places: Sequence[int] | None = None,
    ) -> Tensor:
        """``(n, dim)`` embeddings of token-id lists (the training forward; no dropout, one gather)."""
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        offsets = torch.from_numpy(np.cumsum(lengths) - lengths).to(self.device)
        emb = self.embedding(torch.from_numpy(flat).to(self.device), offsets)
        return F.normalize(emb, p=2, dim=-1) if self.normalize else emb

    def embed_ids(self, ids: Sequence[Sequence[int]], *, max_tokens: int | None = None) -> Tensor:
        """Embed tokenised texts in the input order (``self(ids)``; the server's batched forward)."""
        return self(ids)

    def gradient_checkpointing(self, enabled: bool = True) -> None:
        if enabled:
            raise ValueError("a static model has no layers to checkpoint; drop --gradient-checkpointing")

    # ------------------------------------------------------------------ inference (BatchEncoding.encode)
    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        return self(ids).float().cpu().numpy()

    # ------------------------------------------------------------------ persistence
    @classmethod
    def load(
        cls, path: ModelPath, *, normalize: bool | None = None, **options: Unpack[LoadOptions]
    ) -> StaticEncoder:
        """Load a model2vec folder or a sentence-transformers folder whose first module is ``StaticEmbedding``
        (``normalize``: override the folder's; ``options``: ``device``, ``max_seq_length``)."""
        from tokenizers import Tokenizer

        root = resolve_model_path(path)
        module_dir, has_norm = _static_module(root)
        config = st_folder.read_json(root / "config.json")
        if not st_folder.has_modules(root):
            has_norm = bool(config.get("normalize", True))
        st_config = st_folder.read_st_config(root)
        model = cls(
            fold_model2vec(load_file(str(module_dir / "model.safetensors"))),
            Tokenizer.from_file(str(module_dir / "tokenizer.json")),
            normalize=has_norm if normalize is None else normalize,
            max_seq_length=options.get("max_seq_length") or int(config.get("max_length") or 512),
            prompts=st_config.get("prompts") or {},
            default_prompt_name=st_config.get("default_prompt_name"),
            config=config,
        )
        return model.loaded_from(path, device=options.get("device"))

    def save(self, path: str | os.PathLike) -> None:
        """Write the model2vec layout (also a sentence-transformers ``StaticEmbedding`` model)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        save_file(
            {"embeddings": self.embedding.weight.detach().float().cpu().contiguous()},
            str(root / "model.safetensors"),
        )
        self.tokenizer.save(str(root / "tokenizer.json"))
        config = {
            "model_type": "model2vec",
            "architectures": ["StaticModel"],
            **self.config,
            "hidden_dim": self.dim,
            "normalize": self.normalize,
            "pooling": "mean",
            "max_length": self.max_seq_length,
            "embedding_dtype": "float32",
        }
        modules = [(".", ST_STATIC)]
        if self.normalize:
            modules.append(("1_Normalize", st_folder.ST_NORMALIZE))
            (root / "1_Normalize").mkdir(exist_ok=True)
        st_folder.write_json(root / "config.json", config)
        st_folder.write_modules(root, modules)
        st_folder.write_model_config(
            root,
            "SentenceTransformer",
            prompts=self.prompts,
            default_prompt_name=self.default_prompt_name,
            similarity="cosine",
        )


def _static_module(root: Path) -> tuple[Path, bool]:
    """The folder holding the table and tokenizer, and whether a ``Normalize`` module follows."""
    if not st_folder.has_modules(root):
        return root, True
    modules = st_folder.read_modules(root)
    kinds = [module.kind for module in modules]
    if not kinds or kinds[0] != "StaticEmbedding" or set(kinds[1:]) - {"Normalize"}:
        raise ValueError(
            f"{root / st_folder.MODULES_FILE}: a static model is StaticEmbedding (+ Normalize); found "
            f"{', '.join(kinds) or 'nothing'}"
        )
    return modules[0].folder, "Normalize" in kinds[1:]
