"""Helpers shared by the flow tests: a free local port, and a runtime profile file to plan with.

Imported as a top-level module (``from _flow_fixtures import ...``): ``tests/`` is on ``sys.path`` under pytest.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

from liveput.migration import CostConstants
from liveput.throughput import ThroughputProfile
from trainer.observe.profile import RuntimeProfile, runtime_spec


def free_port() -> int:
    """A TCP port nobody listens on right now (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime_profile_file(path: Path, fastest: tuple[int, int], max_instances: int = 4,
                         layer_ms: Sequence[float] | None = None) -> Path:  # fmt: skip
    """A tiny-gpt runtime profile written as `parcae profile` writes one (test input, not a measurement): every
    strategy on up to ``max_instances`` instances at 100 ms a step but ``fastest`` at 10 ms, the reference cost
    constants in groups mode, and ``layer_ms`` as its per-layer times (None: none, as an older parcae wrote). A
    liveput planner on it picks ``fastest`` whenever the instances allow."""
    iteration = {(d, p): 100.0 for p in range(1, max_instances + 1) for d in range(1, max_instances // p + 1)}
    iteration[fastest] = 10.0
    throughput = ThroughputProfile("tiny-gpt", 16, 2, iteration, source="test input")
    constants = CostConstants(group_mode="groups", build_ms={p: 50.0 for p in range(1, max_instances + 2)})
    measured = {} if layer_ms is None else {"layer_ms": list(layer_ms)}
    RuntimeProfile(throughput, constants, runtime_spec("tiny-gpt"), measured, "", "test input").to_json(path)
    return path
