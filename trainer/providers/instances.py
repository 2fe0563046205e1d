"""The instance provider's interface, and the bookkeeping providers share — without torch.

Owns: `InstanceProvider` (start instances, preempt them with notice, kill them without, list the live ones),
`NumberedInstances` (ids handed out in start order) and `NoticeDeadlines` (a notice's SIGTERM now, its kill at the
deadline). Must not touch: how an instance runs its worker (`trainer.providers.local`: local processes; the others
beside it), the job's control plane.

Why a module of its own: the instance agent (`trainer.providers.agent`), which every instance of a remote provider
starts before its worker, uses these; importing them from `trainer.providers.local`, which starts workers and so
imports torch, cost each instance ~1.5 s (2.5 s of CPU) before its worker even started.
"""

from __future__ import annotations

import abc
import signal as _signal
import threading
import time
from collections.abc import Iterable


class InstanceProvider(abc.ABC):
    """Where a job's instances come from. Ids are stable: 0, 1, ... in the order `start` handed them out."""

    @abc.abstractmethod
    def start(self, n: int) -> list[int]:
        """Start `n` new instances (each runs a worker process that joins the job); their ids."""

    @abc.abstractmethod
    def preempt(self, ids: Iterable[int], notice_s: float) -> None:
        """Reclaim `ids` after `notice_s` seconds (those still running then are killed)."""

    @abc.abstractmethod
    def kill(self, ids: Iterable[int]) -> None:
        """Reclaim `ids` now, without notice."""

    @abc.abstractmethod
    def alive(self) -> set[int]:
        """Ids of the instances running now."""


class NumberedInstances(InstanceProvider):
    """The id bookkeeping every provider shares: `start(n)` hands out the next n ids (0, 1, ... in start order),
    `start_ids(ids, next_id)` starts given ids (a resumed job starts those its schedule had alive; ids need not be
    contiguous) and later `start`s number on past them. Subclasses launch (`_launch`, all or nothing: ids whose
    launch failed are not handed out) and say why some ids cannot start again (`_taken`). Thread-safe."""

    def __init__(self) -> None:
        self._next_id = 0
        self._lock = threading.RLock()

    @abc.abstractmethod
    def _launch(self, ids: list[int]) -> None:
        """Start an instance for each of `ids` (called with the lock held)."""

    def _taken(self, ids: list[int]) -> str | None:
        """Why some of `ids` cannot be started now (e.g. they are running), or None."""
        return None

    def start(self, n: int) -> list[int]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        with self._lock:
            ids = list(range(self._next_id, self._next_id + n))
            self._launch(ids)
            self._next_id += n
            return ids

    def start_ids(self, ids: Iterable[int], next_id: int) -> list[int]:
        ids = list(dict.fromkeys(ids))
        with self._lock:
            why = self._taken(ids)
            if why is not None:
                raise ValueError(why)
            self._launch(ids)
            self._next_id = max([self._next_id, next_id, *(w + 1 for w in ids)])
            return ids


class NoticeDeadlines:
    """A preemption with notice as clouds give it, for the driver's view of instances (`LocalProcessProvider`,
    `trainer.providers.agent.AgentInstances`): `preempt(ids, notice_s)` sends SIGTERM (unless `notify` is False: they
    have their notice already) and `_reclaim_due()` kills whatever still runs at the deadline, listing it in
    `reclaimed`. The class using it provides `signal`, `kill`, `exitcodes` and the two attributes."""

    _reclaim_at: dict[int, float]
    reclaimed: list[tuple[int, float]]  # (id, wall time) of instances killed at a notice's deadline

    def preempt(self, ids: Iterable[int], notice_s: float, *, notify: bool = True) -> None:
        """Give `ids` notice (SIGTERM, unless `notify` is False: they already have it) and kill those still running
        `notice_s` seconds from now (an earlier deadline already set stands)."""
        ids = list(ids)
        deadline = time.monotonic() + notice_s
        for w in ids:
            self._reclaim_at[w] = min(self._reclaim_at.get(w, deadline), deadline)
        if notify:
            self.signal(ids, _signal.SIGTERM)  # type: ignore[attr-defined]

    def _reclaim_due(self) -> None:
        now = time.monotonic()
        due = [w for w, t in self._reclaim_at.items() if t <= now]
        for w in due:
            self._reclaim_at.pop(w)
        codes = self.exitcodes()  # type: ignore[attr-defined]
        running = [w for w in due if w in codes and codes[w] is None]
        if running:
            at = time.time()
            self.kill(running)  # type: ignore[attr-defined]
            codes = self.exitcodes()  # type: ignore[attr-defined]
            self.reclaimed.extend((w, at) for w in running if codes.get(w) == -_signal.SIGKILL)
