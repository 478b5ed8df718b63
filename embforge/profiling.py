"""Counting the operations a piece of code dispatches — the figure a CPU hides and an accelerator exposes.

On a GPU every dispatched tensor operation costs a kernel launch (5-10 µs of host time) however small its
tensor, so a training step whose operation count grows with the batch is launch-bound where the peer's is not.
The count is deterministic, so unlike a timing it can be asserted in a test and compared across machines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.profiler import profile


def aten_ops(fn: Callable[[], object]) -> Counter[str]:
    """Run ``fn`` under ``torch.profiler`` (CPU activities) and count its ``aten::`` events by name — every
    operator call, nested ones included (the measure sentence-transformers' figures in
    ``benchmarks/README.md`` are taken with)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return _aten_events(prof)


def _aten_events(prof: profile) -> Counter[str]:
    """The ``aten::`` events a finished profile recorded, counted by name."""
    return Counter(event.name for event in prof.events() if event.name.startswith("aten::"))


def op_count(fn: Callable[[], object]) -> int:
    """The number of ``aten::`` operator calls ``fn`` dispatches (:func:`aten_ops`, summed)."""
    return sum(aten_ops(fn).values())


def step_ops(run: Callable[[Callable[[int], None]], object], *, step: int = 2) -> int:
    """Operations of training step ``step`` alone: ``run(on_step)`` trains (e.g. ``lambda cb: train(...,
    on_step=cb)``) with ``max_steps >= step``; counting starts after step ``step - 1`` and stops after ``step``
    (so set-up, the first step's one-time work and the final save are left out)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    counted: list[int] = []

    def on_step(done: int) -> None:
        if done == step - 1:
            prof.start()
        elif done == step:
            prof.stop()
            counted.append(sum(_aten_events(prof).values()))

    run(on_step)
    if not counted:
        raise ValueError(f"the run ended before step {step}")
    return counted[0]
