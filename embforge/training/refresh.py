"""ANCE-style negative refresh during training: re-encode the corpus with the current weights, re-mine, swap tasks.

:class:`NegativeRefresher` is given to :func:`embforge.training.loop.train` as ``refresher``; the trainer calls it after
every optimiser step with ``(step, model)`` and, when it returns a list of tasks, re-prepares them and continues
with fresh batches. Every ``every`` steps the refresher snapshots the weights (a CPU copy of the model) and mines
with that copy (on the model's device) **in a background thread**, so training keeps going while the corpus is
re-encoded; the new negatives are used from the first step after the job finishes, and at the latest when the next
refresh is due (training waits for it then, logged as stall). ``background=False`` mines in place (training
stalls). Each refresh is logged to ``<output>/refresh.jsonl`` with the seconds training stalled for it (the
snapshot copy, or the whole mining when not in the background) and the seconds the mining took.

Each applied refresh is also written (atomically) to ``<output>/refresh/negatives-<step>.jsonl``; the trainer records
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from embforge.data.retrieval import RetrievalData
from embforge.data.tables import Dataset
from embforge.files import append_jsonl, read_jsonl, write_jsonl
from embforge.retrieval.mining import MiningConfig, mine_positions
from embforge.retrieval.search import embed
from embforge.training.checkpoints import find_latest, read_progress
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


def hard_ratio_at(config: RefreshConfig, step: int, total_steps: int) -> float:
    """The linear schedule's hard-negative ratio at ``step``."""
    progress = min(1.0, step / max(1, total_steps))
    return config.hard_ratio_start + (config.hard_ratio_end - config.hard_ratio_start) * progress


class NegativeRefresher:
    """Builds ``anchor, positive, negative_1..n`` tasks from retrieval data with the current model's negatives.

    ``log_dir`` is the training run's output folder: ``refresh.jsonl`` and the refreshed negatives go there, and
    :meth:`resume` reads its ``checkpoints``.
    """

    def __init__(
        self,
        data: RetrievalData,
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
        position = {d: i for i, d in enumerate(data.doc_ids)}
        self.documents = data.documents
        self.queries: list[str] = []
        self.positives: list[list[int]] = []
        for qid, text in zip(data.query_ids, data.query_texts):
            pos = [position[d] for d, g in data.qrels.get(qid, {}).items() if g > 0]
            if pos:
                self.queries.append(text)
                self.positives.append(pos)
        if not self.queries:
            raise ValueError(
                f"negative refresh: no query of {data.name or 'the data'} has a relevant document"
            )
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
        return self.log_dir / "refresh" / f"negatives-{step}.jsonl"

    def _save(self, data: Dataset, step: int) -> Path:
        """Write the refreshed rows atomically, before the trainer saves a checkpoint that refers to them."""
        path = self.negatives_file(step)
        names = data.text_columns
        return write_jsonl(path, ({c: data.columns[c][r] for c in names} for r in range(len(data))))

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
        if not path.exists():
            raise FileNotFoundError(
                f"{checkpoint}: trains on the negatives refreshed at step {step}, but {path} is missing; "
                "restore it or start the run again without --resume"
            )
        rows = [row for _, row in read_jsonl(path)]
        anchors = [self.queries[qi] for qi, pos in enumerate(self.positives) for _ in pos]
        if [r.get("anchor") for r in rows] != anchors:
            raise ValueError(
                f"{path}: its rows are not this training data's queries (was the data changed?); "
                "start the run again without --resume"
            )
        columns = {c: [r[c] for r in rows] for c in rows[0]}
        data = Dataset(f"{self.name}@{step}", columns, list(range(1, len(rows) + 1)))
        self._log({"event": "resume", "checkpoint": checkpoint.name, "refreshed_at": step, "file": str(path)})
        return [Task(self.name, data, self.loss)]

    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            append_jsonl(self.log_file, record)


def retrieval_training(
    model: Any,
    *,
    data: RetrievalData,
    loss: BaseLoss,
    refresh: RefreshConfig | None,
    total_steps: int,
    output: str | Path,
    other_tasks: list[Task],
    resume: bool = False,
) -> tuple[list[Task], Any]:
    """The tasks and trainer hook for training on retrieval data (``embforge train --retrieval-train DIR``).

    ``refresh=None`` trains on ``anchor, positive`` pairs only (in-batch negatives); otherwise the first negatives
    are mined with the initial model (``refresh.mining``) at ``refresh.hard_ratio_start`` and, with
    ``refresh.every > 0``, re-mined ANCE-style during training (in a background thread unless ``refresh.background``
    is false). With ``resume``, the negatives in use at the latest checkpoint in ``output`` are restored instead.
    Returns ``(all tasks, refresher hook or None)``.
    """
    if refresh is None:
        from embforge.data.retrieval import training_pairs

        return [*other_tasks, Task(data.name or "retrieval", training_pairs(data), loss)], None
    refresher = NegativeRefresher(
        data, loss, refresh, total_steps=total_steps, log_dir=output, name="retrieval"
    )
    mined = (refresher.resume() if resume else None) or refresher.build_tasks(model, 0)
    if not refresh.every:
        return [*other_tasks, *mined], None

    return [*other_tasks, *mined], _RefreshHook(refresher, other_tasks)


class _RefreshHook:
    """The trainer's ``refresher``: refreshed retrieval tasks next to the run's other tasks."""

    def __init__(self, refresher: NegativeRefresher, other_tasks: list[Task]) -> None:
        self.refresher = refresher
        self.other_tasks = other_tasks

    def __call__(self, step: int, model: Any) -> list[Task] | None:
        fresh = self.refresher(step, model)
        return None if fresh is None else [*self.other_tasks, *fresh]

    def close(self) -> None:
        self.refresher.close()
