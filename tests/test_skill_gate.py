"""Tests of the online skill gate (`forecasting.skill_gate`): per step, a model's point forecast only where it has
beaten persistence on the trace's own past; persistence while that past is short; never a read of the future; the
wrapper's forecast at each origin equal to the rule on the whole trace (also on the truncated history a backtest
hands it); the model's quantiles and preemption odds kept; and the names that pick it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pytest
from _tables import canonical_table

import forecasting
from forecasting import Forecast, PersistenceForecaster, SkillGated, rolling_origin, skill_gated
from forecasting.skill_gate import gate_choices, past_forecasts, past_points


@dataclass
class Recovery:
    """A toy learned model: the maximum of the last `window` intervals (right where dips end quickly, wrong where
    a lost instance stays lost), with a band from N_t to it and a fixed preemption probability."""

    window: int = 6
    name: str = "recovery"

    def fit(self, histories: Any) -> Recovery:
        return self

    def history_window(self, horizon: int) -> int | None:
        return self.window

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        return self.predict_many(history, [len(history) - 1], horizon)[0]

    def predict_many(self, table: pd.DataFrame, origins: Any, horizon: int) -> list[Forecast]:
        n = table["available"].to_numpy(dtype=np.float64)
        c = int(table["capacity"].iloc[-1])
        out = []
        for o in origins:
            top = float(n[max(0, o - self.window + 1) : o + 1].max())
            out.append(Forecast(model=self.name, last_available=int(n[o]), capacity=c, point=np.full(horizon, top),
                                quantiles={0.1: np.full(horizon, n[o]), 0.5: np.full(horizon, top),
                                           0.9: np.full(horizon, top)},
                                preemption_prob=np.full(horizon, 0.25)))  # fmt: skip
        return out


class RecoveryOneByOne(Recovery):
    """The same model without ``predict_many``: the gate asks it once per origin."""

    predict_many = property()  # type: ignore[assignment]  # hides the batch method

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        return Recovery.predict_many(self, history, [len(history) - 1], horizon)[0]


def dips(rows: int, length: int, every: int = 10, capacity: int = 8) -> np.ndarray:
    """A fleet of `capacity` that loses two instances every `every` intervals, for `length` intervals each time."""
    n = np.full(rows, capacity)
    for start in range(3, rows, every):
        n[start : start + length] = capacity - 2
    return n


def choices_of(model: Any, n: np.ndarray, horizon: int, **gate: Any) -> np.ndarray:
    table = canonical_table(n.tolist(), int(n.max()))
    origins = np.arange(len(n))
    return gate_choices(n, past_points(past_forecasts(model, table, origins, horizon), len(n), origins), **gate)


def test_the_gate_trusts_the_model_where_it_has_beaten_persistence_and_only_there():
    recovers, stays = dips(400, 2), dips(400, 9)  # dips that end after 2 intervals, or after 9 of 10
    gated = choices_of(Recovery(), recovers, 6)
    assert gated[300:, 2:].all()  # 3+ steps ahead the dip is over: the recovery is right, persistence wrong
    assert not choices_of(Recovery(), stays, 6)[24:].any()  # a lost instance stays lost: persistence, always
    # a short past cannot tell: persistence until min_origins origins of each step are scored
    assert not gated[: 24 + 1].any() and gated[24 + 3 :, 2].all()
    # the margin asks for a clear win; a window of a few origins forgets fast
    assert not choices_of(Recovery(), recovers, 6, margin=0.999)[24:].any()
    assert choices_of(Recovery(), recovers, 6, window=30, min_origins=30).sum() < gated.sum()


def test_the_gate_never_reads_the_future():
    """Two traces identical up to row t give identical choices at every row up to t, at every step."""
    a = dips(300, 2)
    b = a.copy()
    t = 180
    b[t + 1 :] = dips(300, 9)[t + 1 :]  # the regime changes after t
    ca, cb = choices_of(Recovery(), a, 6), choices_of(Recovery(), b, 6)
    assert (ca[: t + 1] == cb[: t + 1]).all()
    assert (ca[t + 1 :] != cb[t + 1 :]).any()  # (and later rows do see the change)


@pytest.mark.parametrize("model", [Recovery(), RecoveryOneByOne()], ids=["batched", "one-by-one"])
def test_the_wrapper_forecasts_what_the_rule_chooses_at_every_origin(model):
    """A backtest of `SkillGated` (each origin's history a truncated copy, `history_window` rows) equals the rule
    applied to the whole trace: the model's point where chosen, N_t elsewhere; the model's quantiles and odds."""
    n = np.concatenate([dips(120, 2), dips(120, 9)])  # recovering, then lost instances stay lost
    table = canonical_table(n.tolist(), 8)
    horizon, gate = 4, {"window": 40, "min_origins": 10}
    wrapped = SkillGated(model, **gate)
    assert wrapped.name == "recovery-gated" and wrapped.history_window(horizon) == 6 + 40 + horizon
    result = rolling_origin(wrapped, table, horizon, step=3, max_history=wrapped.history_window(horizon))
    chosen = choices_of(Recovery(), n, horizon, **gate)[result.origins]
    ungated = rolling_origin(Recovery(), table, horizon, step=3)
    assert chosen.any() and not chosen.all()
    want = np.where(chosen, ungated.point, n[result.origins][:, None])
    assert np.array_equal(result.point, want)
    assert all(np.array_equal(result.quantiles[q], ungated.quantiles[q]) for q in ungated.quantiles)
    assert np.array_equal(result.preemption_prob, ungated.preemption_prob)
    assert result.model == "recovery-gated"
    # where it kept persistence's point the planner's law follows that point (the events are recomputed from it)
    fc = wrapped.predict(table.iloc[:200], horizon)
    assert not wrapped.chosen.any() and (fc.point == n[199]).all()
    assert fc.events == Forecast(**{**_fields(fc), "events": ()}).events


def _fields(fc: Forecast) -> dict[str, Any]:
    return {k: getattr(fc, k) for k in ("model", "last_available", "capacity", "point", "quantiles",
                                        "preemption_prob", "preemption_size")}  # fmt: skip


def test_persistence_and_gated_models_are_left_as_they_are_and_bad_settings_name_the_fix():
    persistence = PersistenceForecaster()
    assert skill_gated(persistence) is persistence
    gated = skill_gated(Recovery())
    assert isinstance(gated, SkillGated) and skill_gated(gated) is gated
    assert "lightgbm-gated" in forecasting.FORECASTERS
    model = forecasting.make_forecaster("lightgbm-gated", 6)
    assert isinstance(model, SkillGated) and model.base.name == "lightgbm" and model.name == "lightgbm-gated"
    with pytest.raises(ValueError, match="window and min_origins must be >= 1 and margin in"):
        SkillGated(Recovery(), margin=1.0)
    with pytest.raises(ValueError, match="points has 3 rows, the trace 4"):
        gate_choices(np.ones(4), np.ones((3, 2)))
