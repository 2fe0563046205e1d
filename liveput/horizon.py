"""The planning horizon: how long an interval T lasts and how many intervals K a planner looks ahead. Owns the
bounds and the one default of each that every planner, policy, flow, command and trace grid uses (`forecasting`
cuts traces on this grid and imports it from here), and the most instances a plan or a trace may count.

A light module (no scipy, no pandas), so the trainer's driver reads these without loading the optimizer.
"""

from __future__ import annotations

from typing import Final

#: Longest look-ahead K the planner takes: each step adds ~3 ms of DP to every decision (2 cores), so 1024 steps
#: (17 hours of 60 s intervals) already cost seconds per decision and minutes per simulated hour.
MAX_LOOK_AHEAD: Final = 1024
#: The look-ahead K every planner, policy and flow defaults to (the README's simulations and the plan flow use it).
DEFAULT_LOOK_AHEAD: Final = 8

#: The interval T (seconds) every planner, policy, flow and trace grid defaults to: the reference hard-codes 60 s
#: intervals (reference doc A.4).
DEFAULT_INTERVAL_S: Final = 60.0
#: Interval lengths T (seconds) the command line and the flows accept: a second (shorter than any migration) to a
#: day. The trace grid itself takes any T > 0 (the trainer's replays compress time).
INTERVAL_S_RANGE: Final = (1.0, 86_400.0)
#: Instances alive at once: far above any spot fleet (the largest trace we know has 80), far below int64 overflow.
MAX_INSTANCES: Final = 1_000_000
