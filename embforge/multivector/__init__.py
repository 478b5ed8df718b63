"""Multi-vector (late-interaction, ColBERT) models: token matrices, MaxSim scoring, PLAID search."""

from __future__ import annotations

from embforge.multivector.folder import ColBERTSettings
from embforge.multivector.model import MultiVectorEncoder, pad_matrices
from embforge.multivector.scoring import maxsim, maxsim_pairwise

__all__ = ["ColBERTSettings", "MultiVectorEncoder", "maxsim", "maxsim_pairwise", "pad_matrices"]
