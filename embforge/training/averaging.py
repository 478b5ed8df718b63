"""Weight averaging within a run: an exponential moving average (EMA) or a uniform soup of the last k checkpoints.

Both keep one copy of the model's weights next to the model, updated after optimiser steps, and swap the average
into the model after the last step, so the final evaluation, the last checkpoint and the saved model are the
averaged ones (``train`` logs an ``{"event": "averaged", ...}`` record and the model card lists the settings).

- EMA (``ema_decay`` = d, ``ema_start`` = s): from step s on, :math:`\\bar w \\leftarrow d\\,\\bar w + (1-d)\\,w`
  after every step (started at the weights of step s); ``d = 0`` is the plain run. It is torch's
  :class:`torch.optim.swa_utils.AveragedModel` with :func:`~torch.optim.swa_utils.get_ema_multi_avg_fn` (a copy of
  the model, its parameters averaged by one fused ``lerp`` per step; buffers are left as trained: torch's EMA of
  an integer buffer such as BERT's ``position_ids`` would round it).
- Soup (``soup_last`` = k, ``soup_every`` = e): the uniform mean of the weights at the last k steps that are
  multiples of e counting back from the last step (``total, total - e, …, total - (k-1)e``) — the last k
  checkpoints of a run saving every e steps — kept as a float32 running mean of the floating-point weights, so no
  checkpoint needs to stay on disk. (``AveragedModel``'s equal average would fit, but it is a ``lerp`` by
  ``1/(n+1)``, whose rounding differs from this mean's in the last bit: every saved soup would change.)

The average is part of the trainer state (:func:`embforge.training.checkpoints.save_checkpoint` saves it under
``averaging``), so a resumed run continues the same average.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from embforge.fields import setting
from embforge.protocols import TrainableModel
from embforge.ranges import NON_NEGATIVE_INT, finite

EMA_DECAY = finite(0, 1, open_high=True)
_OPT = "optimisation"


@dataclass
class Averaging:
    """The weight average a run asks for (``TrainConfig.averaging``: EMA or soup, or neither). It checks itself."""

    ema_decay: float | None = setting(
        None,
        "final model = EMA of the weights with this decay in [0, 1), e.g. 0.99 (default off)",
        group=_OPT,
        range=EMA_DECAY,
        checked=False,
    )
    ema_start: int = setting(
        0, "first step the EMA follows (default 0)", group=_OPT, range=NON_NEGATIVE_INT, checked=False
    )
    soup_last: int = setting(
        0,
        "final model = mean of the weights at the last K checkpoint steps (default 0)",
        group=_OPT,
        range=NON_NEGATIVE_INT,
        checked=False,
    )
    soup_every: int = setting(  # 0 = save_every
        0,
        "steps between the soup's members (default: --save-every)",
        group=_OPT,
        range=NON_NEGATIVE_INT,
        checked=False,
    )

    def __post_init__(self) -> None:
        if self.ema_decay is not None and not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.ema_start < 0 or self.soup_last < 0 or self.soup_every < 0:
            raise ValueError("ema_start, soup_last and soup_every must be >= 0")
        if self.ema_decay is not None and self.soup_last:
            raise ValueError("choose one weight average: ema_decay or soup_last, not both")

    @property
    def enabled(self) -> bool:
        return self.ema_decay is not None or self.soup_last > 0


def _weights(model: TrainableModel) -> dict[str, Tensor]:
    return {k: v for k, v in model.state_dict().items() if v.is_floating_point()}


class WeightAverage:
    """A running EMA or uniform soup of ``model``'s weights (see the module docstring).

    Args:
        model: The model being trained (the EMA starts from a copy of it).
        total_steps: The run's optimiser steps (the soup's steps are counted back from it; the average is swapped
            into the model after it).
        ema_decay: EMA decay in [0, 1); ``None``: no EMA.
        ema_start: First step the EMA follows (earlier steps are not averaged).
        soup_last: Average the weights of this many steps (0: no soup).
        soup_every: Steps between the soup's members.
    """

    def __init__(
        self,
        model: TrainableModel,
        *,
        total_steps: int,
        ema_decay: float | None = None,
        ema_start: int = 0,
        soup_last: int = 0,
        soup_every: int = 1,
    ) -> None:
        self.total_steps, self.ema_decay, self.ema_start = total_steps, ema_decay, ema_start
        self.soup_last, self.soup_every = soup_last, soup_every
        self.average: dict[str, Tensor] = {}  # the soup's
        self.count = 0  # steps averaged so far
        self.ema: AveragedModel | None = None
        if ema_decay is not None and not soup_last:
            if not isinstance(model, nn.Module):
                raise TypeError(f"an EMA of the weights needs a torch module, got {type(model).__name__}")
            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(ema_decay), use_buffers=False)

    def members(self) -> list[int]:
        """The steps whose weights the soup averages (the EMA: every step from ``ema_start``)."""
        if self.soup_last:
            first = max(1, self.total_steps - (self.soup_last - 1) * self.soup_every)
            return list(range(self.total_steps, first - 1, -self.soup_every))[::-1]
        return list(range(max(1, self.ema_start), self.total_steps + 1))

    def _takes(self, step: int) -> bool:
        if self.soup_last:
            back = self.total_steps - step
            return 0 <= back < self.soup_last * self.soup_every and back % self.soup_every == 0
        return step >= self.ema_start

    @torch.no_grad()
    def update(self, model: TrainableModel, step: int) -> None:
        """Fold the weights after optimiser step ``step`` into the average (when it is one of its steps); after the
        last step :meth:`apply` loads the average into ``model``."""
        if not self._takes(step):
            return
        if self.ema is not None:  # the first update copies the weights, the next ones lerp toward them
            assert isinstance(model, nn.Module)
            self.ema.update_parameters(model)
        elif not self.average:
            self.average = {k: v.detach().float().clone() for k, v in _weights(model).items()}
        else:  # running mean: a_n = a_{n-1} + (w - a_{n-1}) / n
            for k, v in _weights(model).items():
                self.average[k].add_(v.float() - self.average[k], alpha=1.0 / (self.count + 1))
        self.count += 1

    @torch.no_grad()
    def apply(self, model: TrainableModel) -> None:
        """Copy the average into ``model`` (each weight in its own dtype and device)."""
        average = self.averaged()
        for k, v in _weights(model).items():
            if k in average:
                v.copy_(average[k].to(v.device, v.dtype))

    def averaged(self) -> dict[str, Tensor]:
        """The average by weight name (the EMA's: its parameters)."""
        if self.ema is None:
            return self.average
        return {name: p.detach() for name, p in self.ema.module.named_parameters()} if self.count else {}

    def describe(self) -> dict[str, object]:
        """What the final model is, for the log and the summary."""
        if self.soup_last:
            return {"kind": "soup", "steps": self.members(), "count": self.count}
        return {"kind": "ema", "decay": self.ema_decay, "start": self.ema_start, "count": self.count}

    def state_dict(self) -> dict[str, Any]:
        """``{"count", "average": {weight name: tensor}}``: the layout every embforge version saved."""
        return {"count": self.count, "average": {k: v.float().cpu() for k, v in self.averaged().items()}}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
        saved: dict[str, Tensor] = state["average"]
        if self.ema is None:
            self.average = {k: v.float().clone() for k, v in saved.items()}
            return
        params = dict(self.ema.module.named_parameters())
        if self.count and not set(params) <= set(saved):
            raise ValueError(
                "the checkpoint's weight average holds other weights than the model; start a new run"
            )
        for name, param in params.items() if self.count else ():
            param.copy_(saved[name].to(param.device, param.dtype))
        self.ema.n_averaged.fill_(self.count)


def weight_average(
    model: TrainableModel, settings: Averaging, total_steps: int, *, save_every: int
) -> WeightAverage | None:
    """The :class:`WeightAverage` of ``model`` ``settings`` ask for, else ``None`` (a soup's members ``save_every``
    apart unless it sets ``soup_every``)."""
    if not settings.enabled:
        return None
    return WeightAverage(
        model,
        total_steps=total_steps,
        ema_decay=settings.ema_decay,
        ema_start=settings.ema_start,
        soup_last=settings.soup_last,
        soup_every=settings.soup_every or save_every or 1,
    )
