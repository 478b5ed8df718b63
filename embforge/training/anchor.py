"""An anchor to the weights a run starts from, so that fine-tuning keeps what the base model could do.

Four ways, alone or together (the fields of :class:`Anchoring`, ``TrainConfig.anchor``: ``l2sp``, ``ewc``,
``wise_ft``, ``lines``):

- **L2-SP** (Li et al., 2018, "Explicit Inductive Bias for Transfer Learning with Convolutional Networks"),
  decoupled from the gradient as AdamW decouples weight decay: after every optimiser step,

  .. math:: \\theta \\leftarrow \\theta - \\eta_t\\,\\lambda\\,(\\theta - \\theta_0)

  with :math:`\\eta_t` the step's learning rate and :math:`\\lambda` = ``l2sp``. It is weight decay toward the
  starting weights :math:`\\theta_0` instead of toward zero: a weight may move as far as the tasks keep pushing it
  (Adam moves a weight by about :math:`\\eta_t` a step, so it settles about :math:`1/\\lambda` away when every
  step pushes it the same way), while drift the tasks do not ask for decays back. ``l2sp = 1000`` at ``lr = 5e-5``
  pulls 5 % of the distance back each step at the peak rate. One fused operation over every weight a step
  (``torch._foreach_lerp_``), whatever the model's size or the batch.
- **EWC** (Kirkpatrick et al., 2017, "Overcoming catastrophic forgetting in neural networks"), decoupled the
  same way: each weight is pulled back at its own rate, :math:`\\min(1, \\eta_t\\,\\lambda\\,F_k)`, with
  :math:`F_k` the starting model's Fisher information for weight :math:`k` divided by its mean over every weight
  (:mod:`embforge.training.fisher`: how fast moving it changes which texts the model finds alike, on a sample of
  the run's own texts) and :math:`\\lambda` = ``ewc``. The weights that carry what the base does are held
  near it; those it barely uses are free for the new tasks — where L2-SP holds all alike. The Fisher is
  computed at set-up, before the first step, from the model the run is given (on a resume: the same base, the
  same numbers — no dropout, seeded); three fused operations over every weight a step.
- **WiSE-FT** (Wortsman et al., 2022, "Robust fine-tuning of zero-shot models"): after the last step (and after a
  weight average, :mod:`embforge.training.averaging`), the model becomes
  :math:`(1 - w)\\,\\theta_0 + w\\,\\theta` with :math:`w` = ``wise_ft`` — the linear merge of ``embforge merge``
  with the base, done by the run itself, so the final evaluation, the last checkpoint and the saved model are the
  mixed ones.
- **LiNeS** (Wang et al., 2025, "LiNeS: Post-training Layer Scaling Prevents Forgetting and Enhances Model
  Merging"): after the last step each weight's change is scaled by its depth,
  :math:`\\theta_0 + (\\alpha + (1 - \\alpha)\\,d)\\,(\\theta - \\theta_0)` with :math:`\\alpha` = ``lines`` and
  :math:`d` the weight's depth in [0, 1] (:func:`embforge.merge.layer_depths`: embeddings 0, layer ``l`` of
  ``L`` at ``(l + 1) / L``, what follows the layers 1) — the shallow layers, which carry what every task shares,
  go most of the way back to the base; the last layer keeps its whole change. ``embforge merge
  --layer-scaling`` done by the run itself; with ``wise_ft`` too, the two scales multiply.

:math:`\\theta_0` is a copy of every trainable weight taken before the first step; checkpoints save it (under
``anchor``), so a resumed run keeps pulling toward the weights the run started from, not the checkpoint's.

>>> import torch
>>> layer = torch.nn.Linear(2, 2)
>>> anchor = Anchor(layer, l2sp=1000.0, wise_ft=0.5)
>>> start = layer.weight.detach().clone()
>>> with torch.no_grad():
...     _ = layer.weight.add_(1.0)
>>> anchor.pull(5e-5)                      # 5 % of the way back
>>> round(float((layer.weight - start).mean()), 4)
0.95
>>> anchor.mix()                           # halfway to the start
>>> round(float((layer.weight - start).mean()), 4)
0.475
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from embforge.fields import setting
from embforge.kinds import is_single_vector, kind_of
from embforge.merge import layer_scales
from embforge.protocols import TrainableModel
from embforge.ranges import NON_NEGATIVE, RATIO, check, integers
from embforge.training.fisher import fisher_diagonal, probe_texts

if TYPE_CHECKING:
    from embforge.training.tasks import Task

_OPT = "optimisation"


@dataclass
class Anchoring:
    """The anchor a run asks for (``TrainConfig.anchor``; every field 0 or ``None``: none). It checks itself."""

    l2sp: float = setting(
        0.0,
        "after each step pull lr x L2SP of the way back to the starting weights, e.g. 1000 (default 0: off)",
        group=_OPT,
        range=NON_NEGATIVE,
        checked=False,
    )
    wise_ft: float | None = setting(
        None,
        "final model = (1 - W) x starting + W x fine-tuned weights, W in [0, 1], e.g. 0.5 (default off)",
        group=_OPT,
        range=RATIO,
        checked=False,
    )
    lines: float | None = setting(
        None,
        "final model: each weight keeps (A + (1 - A) x its depth) of its change (LiNeS; embeddings A, last layer "
        "all), A in [0, 1], e.g. 0.5 (default off)",
        group=_OPT,
        range=RATIO,
        checked=False,
    )
    ewc: float = setting(
        0.0,
        "after each step pull each weight lr x EWC x its Fisher importance of the way back, e.g. 1000 (default 0)",
        group=_OPT,
        range=NON_NEGATIVE,
        checked=False,
    )
    ewc_texts: int = 2048  # texts of the run's tasks the starting model's Fisher information is estimated on

    def __post_init__(self) -> None:
        check("l2sp", self.l2sp, NON_NEGATIVE, hint="0 = no pull toward the start")
        check("ewc", self.ewc, NON_NEGATIVE, hint="0 = no pull toward the start")
        check("ewc_texts", self.ewc_texts, integers(3), hint="texts the Fisher information is estimated on")
        if self.wise_ft is not None and not 0.0 <= self.wise_ft <= 1.0:
            raise ValueError(
                f"wise_ft must be in [0, 1] (1 = the fine-tuned weights alone), got {self.wise_ft}"
            )
        if self.lines is not None and not 0.0 <= self.lines <= 1.0:
            raise ValueError(
                f"lines must be in [0, 1] (the share of the embeddings' change kept; 1 = all), got {self.lines}"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.l2sp or self.ewc or self.wise_ft is not None or self.lines is not None)


class Anchor:
    """The starting weights of ``model``, the pulls toward them and the final mix (see the module docstring).

    Args:
        model: The model being trained (its parameters that require a gradient are anchored).
        l2sp: :math:`\\lambda` of the decoupled L2-SP pull after every step; 0 = none.
        ewc: :math:`\\lambda` of the decoupled EWC pull after every step; 0 = none.
        importance: With ``ewc``: each trained weight's Fisher information over its mean, in ``named_parameters``
            order (:func:`embforge.training.fisher.fisher_diagonal`).
        wise_ft: Weight of the fine-tuned weights in the final model; ``None`` = no mix.
        lines: :math:`\\alpha` of the final depth scaling (LiNeS): the embeddings keep ``lines`` of their
            change, the last layer all of it; ``None`` = none.
    """

    def __init__(
        self,
        model: TrainableModel,
        *,
        l2sp: float = 0.0,
        wise_ft: float | None = None,
        ewc: float = 0.0,
        importance: Sequence[Tensor] = (),
        lines: float | None = None,
    ) -> None:
        self.l2sp, self.wise_ft, self.ewc, self.lines = l2sp, wise_ft, ewc, lines
        trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in trained]
        scales = layer_scales(self.names, lines) if lines is not None else {}
        keep = 1.0 if wise_ft is None else wise_ft
        self.kept = [keep * scales.get(n, 1.0) for n in self.names]  # each weight's share of its change
        self.weights: list[Tensor] = [p for _, p in trained]
        self.starts = [p.detach().clone() for p in self.weights]
        self.importance = (
            [f.to(w.device) for f, w in zip(importance, self.weights, strict=True)] if ewc else []
        )

    @torch.no_grad()
    def pull(self, lr: float) -> None:
        """After an optimiser step at learning rate ``lr``: move every weight ``lr * l2sp`` of the way back, then
        each weight ``lr * ewc * importance`` of the way back (at most all of it)."""
        if self.l2sp > 0:
            torch._foreach_lerp_(self.weights, self.starts, min(1.0, lr * self.l2sp))
        if self.ewc > 0:
            rates = torch._foreach_mul(self.importance, lr * self.ewc)
            torch._foreach_clamp_max_(rates, 1.0)
            torch._foreach_addcmul_(self.weights, torch._foreach_sub(self.starts, self.weights), rates)

    @torch.no_grad()
    def mix(self) -> None:
        """After the last step: each weight becomes ``start + kept * (weight - start)``, ``kept`` = ``wise_ft``
        times the LiNeS scale of its depth (1 for what neither asks for)."""
        for weight, start, kept in zip(self.weights, self.starts, self.kept, strict=True):
            if kept != 1.0:
                weight.lerp_(start, 1.0 - kept)

    def describe(self) -> dict[str, object]:
        """The settings, for the log and the summary."""
        return {
            "l2sp": self.l2sp, "ewc": self.ewc, "wise_ft": self.wise_ft, "lines": self.lines,
            "weights": len(self.weights),
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"starts": {name: start.cpu() for name, start in zip(self.names, self.starts, strict=True)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved: dict[str, Tensor] = state["starts"]
        if sorted(saved) != sorted(self.names):
            raise ValueError(
                "the checkpoint's anchor holds other weights than the model trains; start a new run"
            )
        self.starts = [
            saved[name].to(w.device, w.dtype) for name, w in zip(self.names, self.weights, strict=True)
        ]


def start_anchor(
    model: TrainableModel, tasks: Sequence[Task], settings: Anchoring, *, seed: int
) -> Anchor | None:
    """The :class:`Anchor` ``settings`` ask for, else ``None`` (with ``ewc``: the Fisher information of ``model`` on
    ``settings.ewc_texts`` texts of ``tasks``, drawn with ``seed``, computed now)."""
    if not settings.enabled:
        return None
    importance: list[Tensor] = []
    if settings.ewc > 0:
        if not is_single_vector(model):
            raise ValueError(f"ewc needs a dense or static embedding model, not a {kind_of(model).value} one")
        texts = probe_texts(tasks, settings.ewc_texts, seed)
        importance = fisher_diagonal(model, texts, seed=seed)
    return Anchor(
        model,
        l2sp=settings.l2sp,
        wise_ft=settings.wise_ft,
        ewc=settings.ewc,
        importance=importance,
        lines=settings.lines,
    )
