"""Fixtures shared by the trainer tests; a test module activates them by importing them."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainer.observe.observer import JobObserver
from trainer.runtime.store import connect_store, read_token_file


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # 2 cores shared with other test processes; one intra-op thread is faster and deterministic
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def _no_orphans():
    yield
    alive = [p for p in mp.active_children() if p.name.startswith("parcae-worker")]
    assert not alive, f"worker processes left running: {alive}"


@contextmanager
def warm_worker_starts() -> Iterator[None]:
    """Local worker processes forked from a warm server ("forkserver": torch imported once, ~0.1 s a start) where
    the job asked for cold ones ("spawn": ~3 s of importing torch a start on these 2 cores, during which the driver
    waits for the join): for tests that go through `parcae train` or the flows (whose options keep the cold default)
    and check what a job trains, not how its processes start — the suite must fit in 20 minutes. Cold starts stay
    tested where a user meets them: the README's and the docs' commands, `parcae train` under the market as the
    issue writes it, Ctrl-C, the deployment on the real servers."""
    from trainer.providers.local import LocalProcessProvider

    cold_init = LocalProcessProvider.__init__

    def warm_init(self: LocalProcessProvider, host: str, port: int, token: str | None = None,
                  start_method: str = "spawn", driver_key: str | None = None) -> None:  # fmt: skip
        cold_init(self, host, port, token, "forkserver", driver_key=driver_key)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalProcessProvider, "__init__", warm_init)
        yield


@pytest.fixture
def warm_starts() -> Iterator[None]:
    """`warm_worker_starts` for one test (a module takes it with `pytestmark = pytest.mark.usefixtures(...)`)."""
    with warm_worker_starts():
        yield


def until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Wait until `predicate()` holds; AssertionError naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------------- the cloud

Condition = Callable[[dist.Store], bool]
Action = Callable[[dist.Store], None]


def started(step: int, workers: Iterable[int]) -> Condition:
    """A worker of `workers` started `step`: the step before it is applied everywhere. (Not a step's loss key: the
    coordinator deletes each as it reads it, so a script polling one may never see it.)"""
    from trainer.runtime import keys

    ids = list(workers)
    return lambda st: any(int(st.get_if(keys.step_at(w)) or -1) >= step for w in ids)


class StepScales(JobObserver):
    """Each step's loss scale after it and whether it was skipped, as the driver reports it (a float16 job's)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float | None, bool]] = {}

    def on_step(self, step: Any) -> None:
        self.seen[step.step] = (step.loss_scale, step.skipped)


class Cloud(JobObserver):
    """Runs `script` — (condition, action) pairs, in order — on a thread with its own store client, from the job's
    start; `done` lists the actions taken."""

    def __init__(self, *script: tuple[Condition, Action]) -> None:
        self.script = list(script)
        self.done: list[int] = []
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def on_start(self, info: dict[str, Any]) -> None:
        token = read_token_file(info["token_file"])
        self.thread = threading.Thread(target=self._run, args=(info["host"], info["port"], token), daemon=True)
        self.thread.start()

    def _run(self, host: str, port: int, token: str) -> None:
        try:
            store = connect_store(host, port, token, 30)
            for i, (when, act) in enumerate(self.script):
                end = time.monotonic() + 60
                while not when(store):
                    if time.monotonic() > end:
                        raise TimeoutError(f"cloud: condition {i} never came")
                    time.sleep(0.002)
                act(store)
                self.done.append(i)
        except BaseException as e:  # noqa: BLE001 — reported by `finish`
            self.error = e

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=10)
        assert self.error is None, f"the cloud script failed: {self.error!r}"
        assert self.done == list(range(len(self.script))), f"cloud actions taken: {self.done}"


# ----------------------------------------------------------------------------------------------- the local market


def warm_forkserver() -> None:
    """Start the server that "forkserver" workers are forked from, and wait until it has imported torch: a market's
    clock runs from the job's first request, and a cold server (the first job of a test process, ~3-6 s here) made
    the first instances boot past the market's first seconds — a test alone saw its market empty before it trained.
    """
    from trainer.providers.local import FORKSERVER_PRELOAD

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    warm = ctx.Process(target=time.sleep, args=(0,), name="warm-forkserver")
    warm.start()
    warm.join()


def market_job(out_dir: Any, market: Any, *, steps: int, max_instances: int, interval_s: float = 1.0,
               options: dict[str, Any] | None = None, fleet: dict[str, Any] | None = None,
               planning: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
               **fields: Any) -> Any:  # fmt: skip
    """A live-fleet job under the local market whose capacity follows `market` (a trace name, or a path such as a
    `ts_ms,count` CSV): the rule planner, a 2 s notice grace, a 300 s deadline; `options`, `fleet`, `planning` and
    `train` and `fields` add to or override the market's options, the `FleetConfig`, the `PlanningConfig`, the
    `TrainConfig` and the `JobConfig`."""
    from trainer.config import (
        AvailabilityConfig,
        ControlPlaneConfig,
        FleetConfig,
        JobConfig,
        PlanningConfig,
        ProviderConfig,
        TrainConfig,
    )

    warm_forkserver()
    return JobConfig(
        out_dir=str(out_dir), train=TrainConfig(**{"steps": steps, **(train or {})}),
        availability=AvailabilityConfig(interval_seconds=interval_s),
        control=ControlPlaneConfig(notice_grace_s=2.0, timeout_s=300),
        provider=ProviderConfig(name="market", start_method="forkserver",
                                options={"trace": str(market), **(options or {})}),
        planning=PlanningConfig(**{"planner": "rule", **(planning or {})}),
        fleet=FleetConfig(max_instances=max_instances, **(fleet or {})),
        **fields,
    )  # fmt: skip
