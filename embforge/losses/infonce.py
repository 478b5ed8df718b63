"""InfoNCE with in-batch negatives (also known as MultipleNegativesRankingLoss), its GTE directions and
hardness-weighted negatives, and unsupervised SimCSE."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.data.augment import AUGMENTATIONS, augment_texts
from embforge.losses.base import EmbeddingLoss, check_temperature, cosine_matrix

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
"""The similarity blocks an InfoNCE softmax can span (sentence-transformers' names)."""
PARTITION_MODES = ("joint", "per_direction")
HARDNESS_MODES = ("in_batch_negatives", "hard_negatives", "all_negatives")
GTE_DIRECTIONS = DIRECTIONS
"""Li et al., 2023 (GTE): every block in one joint partition function."""


def infonce_blocks(
    embeddings: Sequence[Tensor],
    *,
    scale: float,
    directions: Sequence[str] = ("query_to_doc",),
    hardness_mode: str | None = None,
    hardness_strength: float = 0.0,
) -> dict[str, Tensor]:
    r"""The scaled logit blocks of an InfoNCE softmax, by direction; row *i* of each belongs to pair *i*.

    With queries :math:`q`, positives :math:`d` and every document column :math:`D` (positives, then each
    hard-negative column), :math:`s = \text{scale}`:

    ====================  ===========================  =====================================================
    direction             block ``(n, ·)``              left out (``-inf``)
    ====================  ===========================  =====================================================
    ``query_to_doc``      :math:`s\cos(q_i, D_j)`      nothing (column *i* is the positive)
    ``query_to_query``    :math:`s\cos(q_i, q_j)`      :math:`j = i`
    ``doc_to_query``      :math:`s\cos(d_i, q_j)`      nothing
    ``doc_to_doc``        :math:`s\cos(d_i, D_j)`      pair *i*'s own documents (positive and negatives)
    ====================  ===========================  =====================================================

    A hardness mode adds :math:`\alpha\,\mathrm{sg}(\cos(q_i, D_j))` (``hardness_strength`` α, no gradient
    through it, not scaled) to the ``query_to_doc`` logits of some negatives: ``in_batch_negatives`` the other
    pairs' documents, ``hard_negatives`` pair *i*'s own hard negatives, ``all_negatives`` both (Lan et al., 2025,
    Eq. 5; Schechter Vera et al., 2025). A fixed number of tensor operations whatever the batch.
    """
    queries, positives = embeddings[0], embeddings[1]
    documents = torch.cat(list(embeddings[1:])) if len(embeddings) > 2 else positives
    n, columns = len(queries), len(embeddings) - 1
    query_doc = cosine_matrix(queries, documents)
    blocks = {"query_to_doc": query_doc * scale}
    if (hardness_mode is not None and hardness_strength > 0) or "doc_to_doc" in directions:
        own = torch.eye(n, dtype=torch.bool, device=queries.device).repeat(1, columns)  # pair i's documents
    if hardness_mode is not None and hardness_strength > 0:
        first_column = torch.zeros_like(own)
        first_column[:, :n] = True
        penalised = {
            "in_batch_negatives": ~own,
            "hard_negatives": own & ~first_column,
            "all_negatives": ~(own & first_column),
        }[hardness_mode]
        blocks["query_to_doc"] = blocks["query_to_doc"] + hardness_strength * query_doc.detach() * penalised
    if "query_to_query" in directions:
        same = torch.eye(n, dtype=torch.bool, device=queries.device)
        blocks["query_to_query"] = (cosine_matrix(queries, queries) * scale).masked_fill(same, -torch.inf)
    if "doc_to_query" in directions:
        blocks["doc_to_query"] = cosine_matrix(positives, queries) * scale
    if "doc_to_doc" in directions:
        blocks["doc_to_doc"] = (cosine_matrix(positives, documents) * scale).masked_fill(own, -torch.inf)
    return blocks


def partitioned_loss(blocks: dict[str, Tensor], partition_mode: str = "joint") -> Tensor:
    r"""InfoNCE from :func:`infonce_blocks`: the positive logit (``query_to_doc``'s diagonal) against one joint
    partition function over every block, or the mean of one per block (``per_direction``).

    .. math::
        \text{joint: } \mathcal{L} = -\frac1n\sum_i \Big(\ell_{ii} - \log\sum_{b}\sum_j e^{\ell^{b}_{ij}}\Big)
        \qquad \text{per\_direction: } \mathcal{L} = -\frac1n\sum_i \Big(\ell_{ii} - \frac1B\sum_b
        \log\sum_j e^{\ell^{b}_{ij}}\Big)
    """
    query_doc = blocks["query_to_doc"]  # first: the positive of row i is column i of the joined blocks too
    targets = torch.arange(len(query_doc), device=query_doc.device)
    if partition_mode == "joint":
        logits = torch.cat(list(blocks.values()), dim=1) if len(blocks) > 1 else query_doc
        return F.cross_entropy(logits, targets)
    # per_direction takes only the blocks that hold the pair's positive on their diagonal (q->d, d->q)
    return torch.stack([F.cross_entropy(block, targets) for block in blocks.values()]).mean()


def _directions(value: str | Sequence[str] | None, symmetric: bool) -> tuple[str, ...]:
    """The ``directions`` option as a tuple (a list, or one comma-separated string as the CLI gives it)."""
    if value is None:
        return ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    if symmetric:
        raise ValueError(
            "give either symmetric = true or directions, not both (symmetric is directions = "
            "['query_to_doc', 'doc_to_query'] with partition_mode = 'per_direction')"
        )
    names = [d.strip() for d in value.split(",")] if isinstance(value, str) else [str(d) for d in value]
    unknown = [d for d in names if d not in DIRECTIONS]
    if unknown or not names:
        raise ValueError(f"directions must be some of {', '.join(DIRECTIONS)}, got {value!r}")
    if "query_to_doc" not in names:
        raise ValueError(
            "directions must include 'query_to_doc' (the block that holds each query's positive)"
        )
    return tuple(d for d in DIRECTIONS if d in names)


class InfoNCELoss(EmbeddingLoss):
    r"""InfoNCE: each anchor must pick its own positive among all candidates of the batch.

    .. math::
        \mathcal{L} = -\frac{1}{n}\sum_i \log
        \frac{e^{\cos(a_i, p_i)/\tau}}{\sum_j e^{\cos(a_i, p_j)/\tau} + \sum_{k,j} e^{\cos(a_i, n^{(k)}_j)/\tau}}

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive``                        none (the other rows' positives are the negatives)
    ``anchor, positive, negative_1..k``         none (plus every row's hard negatives as candidates)
    ==========================================  ==============================================================

    Candidates are the batch's positives plus every extra negative column (hard negatives). Options, as
    sentence-transformers' ``MultipleNegativesRankingLoss`` names them (equal on the same batch with
    ``scale = 1/τ``, loss and gradients, tested):

    - ``directions``: which similarity blocks the softmax spans (:func:`infonce_blocks`): ``query_to_doc``
      (always; the formula above), ``doc_to_query`` (each positive picks its anchor among the batch's anchors),
      ``query_to_query`` and ``doc_to_doc`` (same-type negatives). All four in one ``joint`` partition function
      is GTE's improved contrastive loss (Li et al., 2023): ``directions = GTE_DIRECTIONS``.
    - ``partition_mode``: ``joint`` (one softmax over every block, default) or ``per_direction`` (one per block,
      averaged; only with ``query_to_doc`` / ``doc_to_query``, whose blocks hold the positive).
    - ``symmetric = True``: shorthand for ``directions = ("query_to_doc", "doc_to_query")``, ``per_direction``
      (sentence-transformers' ``MultipleNegativesSymmetricRankingLoss``).
    - ``hardness_mode`` + ``hardness_strength`` α: hardness-weighted negatives, α·sg(cos) added to the logits of
      the ``in_batch_negatives``, the ``hard_negatives`` (explicit columns) or ``all_negatives``
      (:func:`infonce_blocks`; α = 9 in Lan et al., 2025 for in-batch, 5 in EmbeddingGemma for hard ones).

    Under torchrun the candidates are the global batch's (all-gathered).

    Paper: van den Oord et al., 2018, "Representation Learning with Contrastive Predictive Coding"; with
    in-batch negatives for text, Henderson et al., 2017, "Efficient Natural Language Response Suggestion for
    Smart Reply"; the directions, Li et al., 2023, "Towards General Text Embeddings with Multi-stage Contrastive
    Learning"; hardness weighting, Lan et al., 2025, "LLaVE: Large Language and Vision Embedding Models with
    Hardness-Weighted Contrastive Learning".

    Example:
        >>> import torch
        >>> loss = InfoNCELoss(temperature=1.0)
        >>> anchors = positives = torch.eye(2)  # each anchor's positive is itself, orthogonal to the other
        >>> round(float(loss([anchors, positives])), 4)  # -log(e^1 / (e^1 + e^0))
        0.3133
        >>> hard = positives.clone()  # a hard-negative column as close as the positive: -log(e / (2e + 2))
        >>> round(float(loss([anchors, positives, hard])), 4)
        1.0064
        >>> gte = InfoNCELoss(temperature=1.0, directions=GTE_DIRECTIONS)  # + q->q, d->q, d->d: -log(e / (2e + 4))
        >>> round(float(gte([anchors, positives])), 4)
        1.2446
        >>> weighted = InfoNCELoss(temperature=1.0, hardness_mode="hard_negatives", hardness_strength=1.0)
        >>> round(float(weighted([anchors, positives, hard])), 4)  # its logit 1 + 1: -log(e / (e + e^2 + 2))
        1.4938
    """

    name = "infonce"
    in_batch_negatives = True

    def __init__(
        self,
        temperature: float = 0.05,
        symmetric: bool = False,
        directions: str | Sequence[str] | None = None,
        partition_mode: str | None = None,
        hardness_mode: str | None = None,
        hardness_strength: float = 0.0,
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.scale = 1.0 / self.temperature
        self.directions = _directions(directions, symmetric)
        if partition_mode is None:
            partition_mode = "per_direction" if symmetric else "joint"
        if partition_mode not in PARTITION_MODES:
            raise ValueError(
                f"partition_mode must be one of {', '.join(PARTITION_MODES)}, got {partition_mode!r}"
            )
        if partition_mode == "per_direction" and {"query_to_query", "doc_to_doc"} & set(self.directions):
            raise ValueError(
                "partition_mode 'per_direction' needs every block to hold the positive; 'query_to_query' and "
                "'doc_to_doc' do not: use partition_mode 'joint' with them"
            )
        self.partition_mode = partition_mode
        if hardness_mode is not None and hardness_mode not in HARDNESS_MODES:
            raise ValueError(
                f"hardness_mode must be one of {', '.join(HARDNESS_MODES)} or none, got {hardness_mode!r}"
            )
        if hardness_strength < 0 or (hardness_mode is None) != (hardness_strength == 0):
            raise ValueError(
                "hardness-weighted negatives need both hardness_mode and hardness_strength > 0 "
                f"(got hardness_mode={hardness_mode!r}, hardness_strength={hardness_strength})"
            )
        self.hardness_mode, self.hardness_strength = hardness_mode, float(hardness_strength)
        self.symmetric = (
            self.directions == ("query_to_doc", "doc_to_query") and partition_mode == "per_direction"
        )

    def forward(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        blocks = infonce_blocks(
            embeddings,
            scale=self.scale,
            directions=self.directions,
            hardness_mode=self.hardness_mode,
            hardness_strength=self.hardness_strength,
        )
        return partitioned_loss(blocks, self.partition_mode)


class SimCSELoss(InfoNCELoss):
    r"""Unsupervised SimCSE: InfoNCE where each text's positive is the same text under other dropout noise.

    .. math::
        \mathcal{L} = -\frac{1}{n}\sum_i \log \frac{e^{\cos(h_i, h'_i)/\tau}}{\sum_j e^{\cos(h_i, h'_j)/\tau}}

    with :math:`h_i, h'_i` two embeddings of text *i* under independent dropout masks.

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    one column (``text``, ``sentence1`` or      none
    ``anchor``)
    ==========================================  ==============================================================

    The trainer feeds the column twice in one forward pass, so the two copies get independent dropout masks.
    ``augment`` (``delete``, ``swap`` or ``cutoff``; :mod:`embforge.data.augment`) makes the second copy an edited
    view of the text as well (``augment_rate`` of its words), applied once when the task is tokenised. The loss
    itself only sees the two embedding tensors either way.

    Paper: Gao, Yao & Chen, 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings".

    Example:
        >>> import torch
        >>> loss = SimCSELoss(temperature=1.0)
        >>> views = torch.eye(2)  # the two dropout views of two texts (here equal)
        >>> round(float(loss([views, views])), 4)
        0.3133
        >>> loss.second_view(["a cat sat"])  # no augment: the second copy is the text itself
        ['a cat sat']
    """

    name = "simcse"
    min_texts = 1
    max_texts = 1
    repeat_single_text = True

    def __init__(
        self,
        temperature: float = 0.05,
        symmetric: bool = False,
        augment: str | None = None,
        augment_rate: float = 0.1,
        augment_seed: int = 0,
    ) -> None:
        super().__init__(temperature=temperature, symmetric=symmetric)
        if augment is not None and augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {', '.join(AUGMENTATIONS)} or none, got {augment!r}")
        if not 0 <= augment_rate <= 1:
            raise ValueError(f"augment_rate must be in [0, 1], got {augment_rate}")
        self.augment = augment
        self.augment_rate = augment_rate
        self.augment_seed = augment_seed

    def second_view(self, texts: list[str]) -> list[str]:
        """The texts of the second copy: an augmented view (``augment``), or the texts themselves."""
        if self.augment is None:
            return list(texts)
        return augment_texts(texts, self.augment, rate=self.augment_rate, seed=self.augment_seed)
