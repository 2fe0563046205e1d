"""Fixtures shared by the trainer tests; a test module activates them by importing them."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch


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
