"""The planning horizon: how many intervals K a planner looks ahead. Owns the bounds and the one default every
planner, policy, flow and command uses; the interval T's default is the trace grid's (`forecasting.traces`).

A light module (no scipy, no pandas), so the trainer's driver reads these without loading the optimizer.
"""

from __future__ import annotations

from typing import Final

#: Longest look-ahead K the planner takes: each step adds ~3 ms of DP to every decision (2 cores), so 1024 steps
#: (17 hours of 60 s intervals) already cost seconds per decision and minutes per simulated hour.
MAX_LOOK_AHEAD: Final = 1024
#: The look-ahead K every planner, policy and flow defaults to (the README's simulations and the plan flow use it).
DEFAULT_LOOK_AHEAD: Final = 8
