"""Hard negatives in training, one mechanism: mined when a task starts and, ANCE-style, refreshed as it trains.

A task's ``mine = {...}`` (a pipeline file) or ``--retrieval-train`` with ``--num-negatives`` (a single run) is a
:class:`RefreshConfig` (:func:`refresh_config`); :class:`NegativeRefresher` mines the task's first negatives
(:meth:`NegativeRefresher.start`) and, with ``every > 0``, refreshes them: re-encode the corpus with the current
weights, re-mine, swap tasks.

Its :class:`RefreshHook` is given to :func:`embforge.training.loop.train` as ``refresher``; the trainer calls it after
every optimiser step with ``(step, model)`` and, when it returns a list of tasks, re-prepares them and continues
with fresh batches. Every ``every`` steps the refresher snapshots the weights (a CPU copy of the model) and mines
with that copy (on the model's device) **in a background thread**, so training keeps going while the corpus is
re-encoded; the new negatives are used from the first step after the job finishes, and at the latest when the next
refresh is due (training waits for it then, logged as stall). ``background=False`` mines in place (training
stalls). Each refresh is logged to ``<output>/refresh.jsonl`` with the seconds training stalled for it (the
snapshot copy, or the whole mining when not in the background) and the seconds the mining took.

The negatives mined at the start and each applied refresh are written (atomically) to
``<output>/refresh/<task>/negatives-<step>.jsonl``; the trainer records
that step in the checkpoint's progress (``refreshed_at``), so a resumed run (:meth:`NegativeRefresher.resume`)
continues with the negatives that were in use at its checkpoint — never with a refresh that landed after it. A
background refresh still running when the run was killed is lost; the next one starts at the next multiple of
``every``.

The hard-negative ratio follows a linear schedule over training: at step ``s`` of ``T`` a row gets a mined hard
negative with probability ``start + (end − start)·s/T`` and a random corpus document otherwise (never a known
positive, see :mod:`embforge.retrieval.mining`).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from embforge.data.retrieval import RetrievalData
from embforge.data.tables import Dataset
from embforge.files import append_jsonl, read_jsonl, write_jsonl
from embforge.retrieval.mined_rows import mining_queries
from embforge.retrieval.mining import MiningConfig, mine_positions
from embforge.retrieval.search import embed
from embforge.retrieval.sharded import sharded
from embforge.training.artifacts import MINED
from embforge.training.checkpoints import find_latest, read_progress
from embforge.training.distributed import barrier, is_main
from embforge.training.tasks import Task

if TYPE_CHECKING:
    from embforge.losses.base import BaseLoss


@dataclass
class RefreshConfig:
    """When and how to refresh. ``every=0`` mines once at the start and never refreshes."""

    every: int = 0
    hard_ratio_start: float = 0.3
    hard_ratio_end: float = 0.9
    background: bool = True
    mining: MiningConfig = field(default_factory=lambda: MiningConfig(num_negatives=1, relative_margin=0.05))

    def __post_init__(self) -> None:
        for name in ("hard_ratio_start", "hard_ratio_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.every < 0:
            raise ValueError(f"refresh every must be >= 0 steps, got {self.every}")


# the keys of a task's ``mine = {...}`` that schedule it; every other key is a MiningConfig field
SCHEDULE_KEYS = ("refresh_every", "hard_ratio_start", "hard_ratio_end")


def refresh_config(mine: Mapping[str, Any]) -> RefreshConfig:
    """A task's ``mine = {...}`` (:class:`MiningConfig` fields, plus ``refresh_every`` to re-mine every N steps
    and the hard-negative ratio's ``hard_ratio_start``/``hard_ratio_end``, default 1: every row gets its mined
    negatives when it has enough) as the one mining description of training.

    Raises:
        ValueError: an unknown key or a value out of range, naming it.
    """
    settings = dict(mine)
    start = settings.pop("hard_ratio_start", 1.0)
    schedule = {
        "every": settings.pop("refresh_every", 0),
        "hard_ratio_start": start,
        "hard_ratio_end": settings.pop("hard_ratio_end", start),
    }
    try:
        return RefreshConfig(**schedule, mining=MiningConfig(**settings))
    except TypeError as err:  # an unknown key
        known = sorted([*SCHEDULE_KEYS, *(f.name for f in fields(MiningConfig) if f.name != "stats")])
        raise ValueError(f"{err}; valid keys: {', '.join(known)}") from None


def hard_ratio_at(config: RefreshConfig, step: int, total_steps: int) -> float:
    """The linear schedule's hard-negative ratio at ``step``."""
    progress = min(1.0, step / max(1, total_steps))
    return config.hard_ratio_start + (config.hard_ratio_end - config.hard_ratio_start) * progress


class NegativeRefresher:
    """Builds ``anchor, positive, negative_1..n`` tasks from retrieval data (a :class:`RetrievalData`, or
    ``anchor, positive`` rows whose positives make the corpus) with the current model's negatives.

    ``log_dir`` is the training run's output folder: ``refresh.jsonl`` and the negatives in use go there
    (``refresh/<name>/negatives-<step>.jsonl``), and :meth:`resume` reads its ``checkpoints``.
    """

    def __init__(
        self,
        data: RetrievalData | Dataset,
        loss: BaseLoss,
        config: RefreshConfig,
        *,
        total_steps: int,
        log_dir: str | Path | None = None,
        name: str = "mined",
    ) -> None:
        self.config = config
        self.loss = loss
        self.total_steps = total_steps
        self.name = name
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.log_file = self.log_dir / "refresh.jsonl" if self.log_dir is not None else None
        self.documents, _, self.queries, self.positives = mining_queries(data, None)
        if not self.queries:
            where = data.name if isinstance(data, RetrievalData) else data.path
            raise ValueError(f"negative refresh: no query of {where or 'the data'} has a relevant document")
        self.history: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._result: list[Task] | None = None
        self._error: BaseException | None = None
        self._job: dict[str, Any] = {}

    # ------------------------------------------------------------------ mining
    def build_tasks(self, model: Any, step: int) -> list[Task]:
        """Mine with ``model`` now and return the task (one row per relevant query-document pair)."""
        mining = self.config.mining
        ratio = hard_ratio_at(self.config, step, self.total_steps)
        q = d = None
        if mining.method != "bm25":
            q = embed(model, self.queries, batch_size=mining.batch_size, max_tokens=mining.max_tokens)
            d = embed(model, self.documents, batch_size=mining.batch_size, max_tokens=mining.max_tokens)
        hard = mine_positions(self.queries, self.positives, self.documents, mining, query_emb=q, doc_emb=d)
        seed = mining.seed + step
        rand_config = replace(mining, hard_ratio=0.0, seed=seed, stats={})
        rand = mine_positions(
            self.queries, self.positives, self.documents, rand_config, query_emb=q, doc_emb=d
        )
        rng = np.random.default_rng(seed)
        use_hard = (rng.random(len(self.queries)) < ratio) & (hard.negatives >= 0).all(axis=1)
        negatives = np.where(use_hard[:, None], hard.negatives, rand.negatives)
        for bad in np.flatnonzero((negatives < 0).any(axis=1)):  # rare (tiny corpora): any other non-positive
            others = [i for i in range(len(self.documents)) if i not in self.positives[int(bad)]]
            if not others:
                raise ValueError(
                    f"negative refresh: query {self.queries[int(bad)]!r} has no non-positive document"
                )
            negatives[bad] = [others[(seed + j) % len(others)] for j in range(negatives.shape[1])]
        columns: dict[str, list] = {"anchor": [], "positive": []}
        neg_cols: list[list[str]] = [[] for _ in range(negatives.shape[1])]
        for qi, (text, pos) in enumerate(zip(self.queries, self.positives)):
            for p in pos:  # the same rows at every refresh, so the trainer keeps its place in the epoch
                columns["anchor"].append(text)
                columns["positive"].append(self.documents[p])
                for j, neg in enumerate(negatives[qi]):
                    neg_cols[j].append(self.documents[neg])
        columns.update({f"negative_{j + 1}": col for j, col in enumerate(neg_cols)})
        self._job.update(hard_ratio=ratio, hard_rows=int(use_hard.sum()), rows=len(columns["anchor"]))
        data = Dataset(f"{self.name}@{step}", columns, list(range(1, len(columns["anchor"]) + 1)))
        return [Task(self.name, data, self.loss)]

    # ------------------------------------------------------------------ trainer hook
    def __call__(self, step: int, model: Any) -> list[Task] | None:
        """Called after optimiser step ``step``; returns new tasks when a refresh has finished, else ``None``.

        At most one refresh runs at a time. When the next one is due while the previous is still running (a fast
        trainer, e.g. on a GPU), training waits for it (the wait is logged as stall), so every refresh lands
        within one interval of its start and the schedule is kept.
        """
        due = bool(self.config.every) and step % self.config.every == 0 and step < self.total_steps
        fresh = None
        if self._thread is not None and (due or not self._thread.is_alive()):
            waited = time.perf_counter()
            self._thread.join()
            self._job["stall_seconds"] = self._job.get("stall_seconds", 0.0) + time.perf_counter() - waited
            fresh = self._collect(step)
        if not due:
            return fresh
        started = time.perf_counter()
        self._job = {"started_step": step, "t0": started}
        if not self.config.background:
            self._result = self.build_tasks(model, step)
            self._job["stall_seconds"] = time.perf_counter() - started
            return self._collect(step)
        snapshot = copy.deepcopy(model).eval()  # same device: a GPU run re-encodes on the GPU
        self._job["stall_seconds"] = time.perf_counter() - started

        def work() -> None:
            try:
                self._result = self.build_tasks(snapshot, step)
            except BaseException as err:  # surfaced on the training thread by _collect
                self._error = err

        self._thread = threading.Thread(target=work, name="embforge-negative-refresh", daemon=True)
        self._thread.start()
        return fresh

    def wait(self) -> None:
        """Block until a running background refresh ends (tests, or before the process exits)."""
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """End of training: wait for a refresh still running (its negatives are not used) and log it."""
        if self._thread is not None:
            self._thread.join()
            self._thread, self._result, self._error = None, None, None
            self._log({"event": "refresh_unused", "started_step": self._job.get("started_step")})

    def _collect(self, step: int) -> list[Task] | None:
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(
                f"negative refresh started at step {self._job.get('started_step')} failed"
            ) from error
        tasks, self._result = self._result, None
        saved = self._save(cast(Dataset, tasks[0].data), step) if tasks and self.log_dir is not None else None
        record: dict[str, Any] = {
            "event": "refresh",
            "started_step": self._job.get("started_step"),
            "applied_step": step,
            **({"file": f"refresh/{saved.name}"} if saved is not None else {}),
            "stall_seconds": round(self._job.get("stall_seconds", 0.0), 3),
            "mining_seconds": round(time.perf_counter() - self._job["t0"], 3),
            **{k: self._job[k] for k in ("hard_ratio", "hard_rows", "rows") if k in self._job},
        }
        self._log(record)
        return tasks

    # ------------------------------------------------------------------ resume
    def negatives_file(self, step: int) -> Path:
        """Where the negatives applied after optimiser step ``step`` are kept (needs ``log_dir``)."""
        if self.log_dir is None:
            raise ValueError("negative refresh: no log_dir (the run's output folder) to keep negatives in")
        return self.log_dir / MINED / self.name / f"negatives-{step}.jsonl"

    def _save(self, data: Dataset, step: int) -> Path:
        """Write the refreshed rows atomically, before the trainer saves a checkpoint that refers to them."""
        path = self.negatives_file(step)
        names = data.text_columns
        return write_jsonl(path, ({c: data.columns[c][r] for c in names} for r in range(len(data))))

    def start(self, model: Any, *, resume: bool = False) -> list[Task]:
        """The task a run starts with: on ``resume`` the negatives in use at its latest checkpoint
        (:meth:`resume`); else the ones mined at step 0 and kept in ``log_dir`` (a stage restarted before its
        first checkpoint trains on the same rows); else mined now with ``model`` (under torchrun each process
        encodes a share, rank 0 keeps the rows)."""
        restored = self.resume() if resume and self.log_dir is not None else None
        if restored is not None:
            return restored
        if self.log_dir is None:
            return self.build_tasks(sharded(model), 0)
        first = self.negatives_file(0)
        if not first.exists():
            tasks = self.build_tasks(sharded(model), 0)
            if is_main():
                self._save(cast(Dataset, tasks[0].data), 0)
            barrier()
        return [Task(self.name, self._read(first, 0), self.loss)]  # every process trains on the file's rows

    def resume(self) -> list[Task] | None:
        """The refreshed tasks in use at the run's latest checkpoint, or ``None`` if none was refreshed by then.

        Call it before :func:`~embforge.training.loop.train` with ``resume=True`` and train on what it returns (on
        ``None``, on :meth:`build_tasks` at step 0, as the run started). The checkpoint's ``refreshed_at`` names
        the file, so a refresh applied after the checkpoint is not used.
        """
        if self.log_dir is None:
            raise ValueError("negative refresh: resume needs log_dir, the run's output folder")
        checkpoint = find_latest(self.log_dir / "checkpoints")  # the folder train() writes; it warns if none
        step = read_progress(checkpoint).get("refreshed_at") if checkpoint is not None else None
        if checkpoint is None or step is None:
            return None
        path = self.negatives_file(int(step))
        if not path.exists() and (self.log_dir / MINED / path.name).exists():
            path = self.log_dir / MINED / path.name  # a run from before the per-task folders
        if not path.exists():
            raise FileNotFoundError(
                f"{checkpoint}: trains on the negatives refreshed at step {step}, but {path} is missing; "
                "restore it or start the run again without --resume"
            )
        data = self._read(path, int(step))
        self._log({"event": "resume", "checkpoint": checkpoint.name, "refreshed_at": step, "file": str(path)})
        return [Task(self.name, data, self.loss)]

    def _read(self, path: Path, step: int) -> Dataset:
        """Negatives kept in ``path``, checked to be rows of this data's queries."""
        rows = [row for _, row in read_jsonl(path)]
        anchors = [self.queries[qi] for qi, pos in enumerate(self.positives) for _ in pos]
        if [r.get("anchor") for r in rows] != anchors:
            raise ValueError(
                f"{path}: its rows are not this training data's queries (was the data changed?); "
                "start the run again without --resume"
            )
        columns = {c: [r[c] for r in rows] for c in rows[0]}
        return Dataset(f"{self.name}@{step}", columns, list(range(1, len(rows) + 1)))

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            append_jsonl(self.log_file, record)


class RefreshHook:
    """The trainer's ``refresher`` (:func:`~embforge.training.loop.train`): the run's tasks, with the refreshed
    one in the place of the task its refresher mines for."""

    def __init__(self, refresher: NegativeRefresher, tasks: list[Task]) -> None:
        self.refresher = refresher
        self.tasks = tasks
        self.index = next(i for i, t in enumerate(tasks) if t.name == refresher.name)

    def __call__(self, step: int, model: Any) -> list[Task] | None:
        fresh = self.refresher(step, model)
        if fresh is None:
            return None
        self.tasks = [*self.tasks[: self.index], *fresh, *self.tasks[self.index + 1 :]]
        return self.tasks

    def close(self) -> None:
        self.refresher.close()
