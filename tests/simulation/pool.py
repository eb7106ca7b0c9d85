"""Concurrency the simulation controls: requests "in flight" that run in an order a seed picks.

The connector keeps several pages in flight on a thread pool. Here the pool runs nothing on
its own: a task runs when someone waits for it, or when the service is about to answer
another request (so a request sent earlier may be answered before, or after, one sent
later). One thread, so every run of a seed sends the same requests in the same order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any


class SimFuture(Future):
    def __init__(self, pool: SimPool, call: Callable[[], Any]) -> None:
        super().__init__()
        self.pool, self.call = pool, call

    def run(self) -> None:
        if not self.set_running_or_notify_cancel():
            return
        try:
            self.set_result(self.call())
        except Exception as error:  # handed to whoever waits, as a pool does (a kill is not)
            self.set_exception(error)

    def cancel(self) -> bool:
        """Cancelled before it was sent, or (as the seed chooses) already on its way: then
        it is sent and answered now, and its answer goes unread, as a thread's would."""
        if self.done() or self not in self.pool.pending:
            return super().cancel()
        if self.pool.rng.random() < self.pool.in_flight_at_cancel:
            self.pool.pending.remove(self)
            self.run()
            return False
        self.pool.pending.remove(self)
        return super().cancel()

    def result(self, timeout: float | None = None) -> Any:
        self.pool.run_until(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.pool.run_until(self)
        return super().exception(timeout)


# Tasks answered within another's request at most this deep: a pool's threads, not one
# task per patient nested in the one before (a run with hundreds pending overflowed the stack).
IN_FLIGHT = 8


class Scheduler:
    """Every pool of one simulated run shares it: the tasks pending anywhere, and the seed's
    choice of which runs next."""

    def __init__(self, rng: random.Random, eagerness: float, in_flight_at_cancel: float) -> None:
        self.rng, self.eagerness = rng, eagerness
        self.in_flight_at_cancel = in_flight_at_cancel
        self.pending: list[SimFuture] = []
        self.running = 0  # tasks running now, each inside the one before

    def interleave(self) -> None:
        """Before the service answers a request: maybe a task sent earlier is answered first."""
        while self.pending and self.running < IN_FLIGHT and self.rng.random() < self.eagerness:
            self._run(self.rng.choice(self.pending))

    def run_until(self, wanted: SimFuture) -> None:
        while not wanted.done():
            if wanted not in self.pending:
                return  # running further up this very call chain
            others = [f for f in self.pending if f is not wanted]
            free = bool(others) and self.running < IN_FLIGHT
            pick = wanted if not free or self.rng.random() < 0.6 else self.rng.choice(others)
            self._run(pick)

    def _run(self, task: SimFuture) -> None:
        self.pending.remove(task)
        self.running += 1
        try:
            task.run()
        finally:
            self.running -= 1


class SimPool(Executor):
    """`concurrent.futures.Executor` over the shared `Scheduler` (`Wire.pool`)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.mine: list[SimFuture] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future = SimFuture(self.scheduler, lambda: fn(*args, **kwargs))
        self.scheduler.pending.append(future)
        self.mine.append(future)
        return future

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        futures = [self.submit(fn, *args) for args in zip(*iterables, strict=False)]

        def results() -> Iterator[Any]:
            try:
                for future in futures:
                    yield future.result()
            finally:
                for future in futures:
                    self._drop(future)

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for future in list(self.mine):
            if cancel_futures:
                self._drop(future)
            elif wait:
                self.scheduler.run_until(future)
        self.mine.clear()

    def _drop(self, future: SimFuture) -> None:
        """A task no one will wait for."""
        future.cancel()
