"""Token-budget dynamic batching: concurrent requests are merged into model calls bounded by padded-token cost.

Each request puts its items (token-id lists, or text pairs) on one queue, each item with a cost (its token count;
1 when no cost is given). The queue is kept sorted by cost. A batch is the cheapest waiting items, taken while the
padded cost of the batch — its longest item times its item count, TEI's ``--max-batch-tokens`` for padded models —
stays within ``max_batch_tokens`` and the count within ``max_batch_size``. So one 512-token text never pads 63 short
ones to 512: the short ones form their own batch and are answered first, the long one runs in a batch of its
length. A request's items may be spread over several batches; it is answered when its last item is done.

Long items cannot starve: an item passed over by ``patience`` batches leads the next batch, which it fills with the
longest waiting items that fit its width.

The wait is adaptive: only while requests come concurrently (the previous batch merged several requests) and no
batch is inside the model does the worker wait up to ``max_wait_ms`` for a batch to fill; a lone client's request
runs at once (on MiniLM, 2 cores, a fixed 5 ms wait cost 28 % of throughput at one client), and with several
streams a free stream takes what is queued while another runs (waiting there left each of two OpenVINO streams
idle a quarter of the time under 16 clients).

With ``concurrency`` above 1 (a runtime with several inference streams, e.g. OpenVINO's throughput mode), up to
that many batches run at once, each on its own thread: a new batch is formed as soon as a stream is free, so one
slow batch never leaves the other streams idle. The work in the server is shared out: a batch takes at most an equal
share (items queued plus items inside the model, over the streams), so 16 clients with 4 texts each keep two
streams busy with 32 texts each rather than one stream with 64 while the other waits for the clients' next request.

A failing model call never fails the requests that merely shared its batch: the batch is split by request in halves
and each half run again, down to single requests, so only a request whose own items make the model fail gets the
error. A full queue (``max_queue`` items) refuses new requests at once with :class:`QueueFull` (the server answers
429), so one overloaded model never makes requests wait behind it, and other models keep their own queues.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Rows = np.ndarray | tuple[np.ndarray, ...]  # what a batched function returns: one array, or several, by row


class QueueFull(Exception):
    """The batcher's queue holds ``max_queue`` items; the request was not queued."""


@dataclass
class _Job:
    """One request: its items, where their rows go, and the future its caller awaits."""

    items: list[object]
    future: asyncio.Future = field(repr=False)
    left: int = 0
    result: Rows | None = None  # filled row by row


@dataclass(order=True)
class _Entry:
    """One queued item; ordered by cost, then arrival."""

    cost: int
    seq: int
    job: _Job = field(compare=False, repr=False)
    index: int = field(compare=False)
    batch_no: int = field(compare=False)  # batches formed when it arrived (for the starvation guard)


class MicroBatcher:
    """Merge concurrent ``submit`` calls into batched calls of ``fn(items) -> array with one row per item``.

    Args:
        fn: The model call, run in a single worker thread; returns an array (or a tuple of arrays) whose first
            axis matches the items it was given.
        max_batch_size: Most items per call.
        max_batch_tokens: Most padded tokens per call (longest item's cost times the item count); ``None``: no
            token bound. An item costlier than the budget runs alone.
        max_wait_ms: Longest wait for a batch to fill (only while requests come concurrently, see above).
        max_queue: Most items waiting; a request that would exceed it gets :class:`QueueFull`.
        patience: Batches an item may be passed over before it leads one.
        on_batch: Called with the item count and the model's seconds of each batch run (for metrics).
        concurrency: Most batches running at once (the model must accept concurrent calls when above 1).
    """

    def __init__(
        self,
        fn: Callable[[list[Any]], Any],
        *,
        max_batch_size: int = 64,
        max_batch_tokens: int | None = None,
        max_wait_ms: float = 5.0,
        max_queue: int | None = None,
        patience: int = 8,
        on_batch: Callable[[int, float], None] | None = None,
        concurrency: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.patience = patience
        self.on_batch = on_batch
        self.concurrency = concurrency
        self._queue: list[_Entry] = []  # sorted by (cost, seq)
        self._seq = itertools.count()
        self._batches = 0
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._busy = 0  # batches running
        self._running_items = 0  # items inside the model
        self._concurrent = False  # did the last batch merge several requests? then waiting pays off
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="embforge-model"
        )

    @property
    def queued(self) -> int:
        """Items waiting for a batch."""
        return len(self._queue)

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def stop(self) -> None:
        """Finish the queued requests, then stop the worker and its thread."""
        while (self._queue or self._busy) and not (self._task is None or self._task.done()):
            await asyncio.sleep(0.005)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, items: Sequence[Any], costs: Sequence[int] | None = None) -> Any:
        """Queue ``items`` (with their ``costs``, default 1 each) and wait for their rows of the model output.

        Raises:
            QueueFull: the queue has no room for ``items`` (nothing was queued).
        """
        if self._arrived is None:
            raise RuntimeError("MicroBatcher.start() was not called (the app's lifespan starts it)")
        if self.max_queue is not None and self._queue and len(self._queue) + len(items) > self.max_queue:
            raise QueueFull(f"{len(self._queue)} items are waiting (the limit is {self.max_queue})")
        if not items:
            return []
        job = _Job(list(items), asyncio.get_running_loop().create_future(), left=len(items))
        for i, cost in enumerate(costs if costs is not None else [1] * len(items)):
            entry = _Entry(int(cost), next(self._seq), job, i, self._batches)
            bisect.insort(self._queue, entry)
        self._arrived.set()
        return await job.future

    def _share(self) -> int:
        """Most items the next batch may take: ``max_batch_size``, or with several streams an equal share of the
        items in the server (queued and inside the model), so that every stream gets work."""
        if self.concurrency == 1:
            return self.max_batch_size
        share = -(-(len(self._queue) + self._running_items) // self.concurrency)
        return max(1, min(self.max_batch_size, share))

    def _full(self) -> bool:
        """Whether the waiting items already fill a batch (no point waiting for more)."""
        if len(self._queue) >= self._share():
            return True
        budget = self.max_batch_tokens
        return budget is not None and len(self._queue) * self._queue[-1].cost >= budget

    def _take(self) -> list[_Entry]:
        """Remove and return the next batch: the cheapest items within the budgets, or, when an item has been
        passed over ``patience`` times, that item with the costliest items no wider than it."""
        self._queue = [e for e in self._queue if not e.job.future.done()]  # timed-out or failed requests
        if not self._queue:
            return []
        oldest = min(self._queue, key=lambda e: e.seq)
        if self._batches - oldest.batch_no >= self.patience:
            stop = bisect.bisect_right(self._queue, oldest)
            candidates = self._queue[:stop][::-1]  # from the starving item down to cheaper ones
        else:
            candidates = self._queue
        chosen: list[_Entry] = []
        width = 0
        most = self._share()
        for entry in candidates:
            new_width = max(width, entry.cost)
            full = len(chosen) + 1 > most or (
                self.max_batch_tokens is not None and new_width * (len(chosen) + 1) > self.max_batch_tokens
            )
            if chosen and full:
                break
            chosen.append(entry)
            width = new_width
        taken = {id(e) for e in chosen}
        self._queue = [e for e in self._queue if id(e) not in taken]
        self._batches += 1
        return sorted(chosen)

    async def _worker(self) -> None:
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        running: set[asyncio.Task] = set()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            if self._concurrent and not self._busy:  # a stream is busy: the free one takes what is queued
                deadline = loop.time() + self.max_wait
                while not self._full() and loop.time() < deadline:
                    self._arrived.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            batch = self._take()
            if not batch:
                continue
            self._concurrent = len({id(e.job) for e in batch}) > 1
            self._busy += 1
            self._running_items += len(batch)
            task = loop.create_task(self._run_counted(loop, batch))
            running.add(task)
            task.add_done_callback(running.discard)
            if len(running) >= self.concurrency:  # every stream busy: wait for one
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)

    async def _run_counted(self, loop: asyncio.AbstractEventLoop, batch: list[_Entry]) -> None:
        try:
            await self._run(loop, batch)
        except Exception as err:  # after the model call (rows, metrics hook): answer, never hang
            for entry in batch:
                if not entry.job.future.done():
                    entry.job.future.set_exception(err)
        finally:
            self._busy -= 1
            self._running_items -= len(batch)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Entry]) -> None:
        """Run ``batch`` as one model call and hand out the rows; if the call fails, bisect by request."""
        batch = [e for e in batch if not e.job.future.done()]
        if not batch:
            return
        try:
            result, seconds = await loop.run_in_executor(
                self._executor, _timed, self.fn, [e.job.items[e.index] for e in batch]
            )
            _check_rows(result, len(batch))
        except Exception as err:
            jobs = list({id(e.job): e.job for e in batch}.values())
            if len(jobs) == 1:
                if not jobs[0].future.done():
                    jobs[0].future.set_exception(err)
                return
            first = {id(j) for j in jobs[: len(jobs) // 2]}
            await self._run(loop, [e for e in batch if id(e.job) in first])
            await self._run(loop, [e for e in batch if id(e.job) not in first])
            return
        if self.on_batch is not None:
            self.on_batch(len(batch), seconds)
        _deliver(batch, result)


def _timed(fn: Callable[[list[Any]], Any], items: list[Any]) -> tuple[Any, float]:
    """``fn(items)`` and the seconds it took (timed in the model's thread, not counting the wait for it)."""
    start = time.perf_counter()
    result = fn(items)
    return result, time.perf_counter() - start


def _check_rows(result: object, n: int) -> None:
    parts = result if isinstance(result, tuple) else (result,)
    for part in parts:
        if not isinstance(part, np.ndarray) or len(part) != n:
            raise TypeError(f"the batched function must return arrays of {n} rows, got {type(part).__name__}")


def _deliver(batch: list[_Entry], result: Rows) -> None:
    """Copy each item's row into its request's result; answer the requests whose last item this was."""
    by_job: dict[int, tuple[_Job, list[int], list[int]]] = {}
    for pos, entry in enumerate(batch):
        _, rows, where = by_job.setdefault(id(entry.job), (entry.job, [], []))
        rows.append(pos)
        where.append(entry.index)
    for job, rows, where in by_job.values():
        if job.future.done():
            continue
        if job.result is None:
            job.result = _allocate(result, len(job.items))
        _put(job.result, result, where, rows)
        job.left -= len(rows)
        if job.left == 0:
            job.future.set_result(job.result)


def _allocate(result: Rows, n: int) -> Rows:
    if isinstance(result, tuple):
        return tuple(np.empty((n, *part.shape[1:]), dtype=part.dtype) for part in result)
    return np.empty((n, *result.shape[1:]), dtype=result.dtype)


def _put(target: Rows, result: Rows, where: list[int], rows: list[int]) -> None:
    targets = target if isinstance(target, tuple) else (target,)
    results = result if isinstance(result, tuple) else (result,)
    for t, r in zip(targets, results):
        t[where] = r[rows]
