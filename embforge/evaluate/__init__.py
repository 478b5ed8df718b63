"""Evaluators: each takes a model and data and returns ``dict[str, float]``."""

from embforge.evaluate.sts import evaluate_sts, sts_evaluator

__all__ = ["evaluate_sts", "sts_evaluator"]
