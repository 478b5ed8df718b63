"""``distill-static``: a static embedding model made from a transformer by the ``model2vec`` library.

model2vec embeds every token of the transformer's vocabulary on its own (one forward per token, the output
mean-pooled), reduces the vectors with PCA (``pca_dims``) and scales each token's row by a Zipf weight
``sif_coefficient / (sif_coefficient + p(token))``, where the token's probability comes from its rank in the
vocabulary (Zipf's law), so frequent tokens count less in the mean. No data set is needed; it runs offline from
a local model folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from embforge._optional import require
from embforge.modeling.resolve import resolve_model_path

if TYPE_CHECKING:
    from embforge.protocols import ModelPath


def distill_static(
    model: ModelPath,
    output: str | os.PathLike,
    *,
    pca_dims: int | None = 256,
    sif_coefficient: float | None = 1e-4,
    device: str = "cpu",
) -> Path:
    """Distil ``model`` (a folder or alias) into a static model saved at ``output`` (returned).

    The folder loads with :meth:`embforge.static.model.StaticEncoder.load`, ``model2vec.StaticModel`` and
    sentence-transformers (``SentenceTransformer(output)``: a ``StaticEmbedding`` module).
    """
    require("model2vec")
    require("skeletoken")
    from model2vec.distill import distill

    source = resolve_model_path(model)
    static = distill(
        model_name=str(source),
        pca_dims=pca_dims,
        sif_coefficient=sif_coefficient,
        device=device,
        quantize_to="float32",
    )
    out = Path(output)
    static.save_pretrained(str(out))
    return out
