"""Tests for forecasting.backtest: no future leaks into a forecaster, and scores match hand-checked numbers.

Stub forecasters keep these fast; only the fan plot and the leave-one-out test touch real baselines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
from _tables import canonical_table

from forecasting.backtest import (
    BacktestResult,
    leave_one_trace_out,
    pinball_loss,
    plot_fans,
    rolling_origin,
)
from forecasting.baselines import ArimaForecaster, PersistenceForecaster
from forecasting.forecast import Forecast


def make_table(available, capacity: int = 32, name: str = "synthetic") -> pd.DataFrame:
    """A canonical per-interval table whose in/out are the net change of each interval."""
    return canonical_table(available, capacity, name=name, source="")


@dataclass
class BandForecaster:
    """Point = last N, band = last -/+ 1, preemption probability 0.5 per step: easy to score by hand."""

    name: str = "band"
    fitted_on: list[str] = field(default_factory=list)

    def fit(self, histories: Sequence[pd.DataFrame]) -> BandForecaster:
        self.fitted_on = [h.attrs["name"] for h in histories]
        return self

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        last = int(history["available"].iloc[-1])
        flat = np.full(horizon, float(last))
        return Forecast(self.name, last, 32, flat, {0.1: flat - 1, 0.5: flat, 0.9: flat + 1}, np.full(horizon, 0.5))


@dataclass
class RecordingForecaster(BandForecaster):
    """Records every history it gets and checks that its last row is the origin it was called for."""

    name: str = "recorder"
    seen: list[tuple[int, int]] = field(default_factory=list)  # (rows, last interval)

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        origin = len(history) - 1  # tables in these tests start at interval 0
        assert int(history["interval"].iloc[-1]) == origin == int(history["interval"].max())
        self.seen.append((len(history), int(history["interval"].iloc[-1])))
        return super().predict(history, horizon)


@dataclass
class CheatingForecaster(BandForecaster):
    """Tries every way it can think of to read past the origin and predicts the future when it succeeds."""

    name: str = "cheater"
    reach: list[int] = field(default_factory=list)  # longest row count reachable from each history

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        rows = len(history)
        longest = rows
        for arr in (history["available"].to_numpy(), history.to_numpy(), history["available"].values):
            while arr is not None:  # climb the .base chain of views towards any larger parent buffer
                longest = max(longest, max(arr.shape, default=0))  # rows, once rows > the 8 columns
                arr = arr.base if isinstance(arr.base, np.ndarray) else None
        future = history.loc[rows : rows + horizon - 1, "available"]  # label-based peek past the end
        longest = max(longest, rows + len(future))
        self.reach.append(longest)
        if len(future) == horizon:  # it saw the truth: a perfect forecast
            truth = future.to_numpy(dtype=float)
            return Forecast(
                self.name,
                int(history["available"].iloc[-1]),
                32,
                truth,
                {0.1: truth, 0.5: truth, 0.9: truth},
                np.zeros(horizon),
            )
        return super().predict(history, horizon)


NOISY = [20, 21, 19, 22, 22, 18, 23, 20, 21, 24, 19, 22, 25, 21, 20, 23, 18, 22, 24, 20] * 2


# ------------------------------------------------------------------------------------ no look-ahead


def test_only_the_past_reaches_the_forecaster() -> None:
    model = RecordingForecaster()
    result = rolling_origin(model, make_table(NOISY), 3)
    origins = list(range(24, len(NOISY) - 3))  # default start 24, every origin with 3 steps of truth
    assert list(result.origins) == origins and result.n_origins == len(origins)
    assert model.seen == [(t + 1, t) for t in origins]
    assert np.array_equal(result.truth[0], NOISY[25:28])


def test_a_cheating_forecaster_cannot_read_beyond_its_history() -> None:
    model = CheatingForecaster()
    result = rolling_origin(model, make_table(NOISY), 3, start=10)  # > 8 rows: the row axis is the longest
    assert model.reach == [t + 1 for t in result.origins]  # a plain iloc view would reach all 40 rows
    assert result.mae_mean > 0  # it never got the truth to copy


def test_max_history_hands_over_only_the_last_rows() -> None:
    model = RecordingForecaster()

    def check(history: pd.DataFrame, horizon: int) -> Forecast:
        assert len(history) <= 4
        return BandForecaster.predict(model, history, horizon)

    model.predict = check  # type: ignore[method-assign]
    result = rolling_origin(model, make_table(NOISY), 2, start=10, max_history=4)
    assert result.n_origins == len(NOISY) - 2 - 10


def test_step_stop_and_empty_ranges() -> None:
    result = rolling_origin(BandForecaster(), make_table(NOISY), 2, start=3, step=5, stop=20)
    assert list(result.origins) == [3, 8, 13, 18]
    with pytest.raises(ValueError, match="no origin"):
        rolling_origin(BandForecaster(), make_table(NOISY[:20]), 2)  # default start 24 > 17
    with pytest.raises(ValueError, match="horizon"):
        rolling_origin(BandForecaster(), make_table(NOISY), 0)


# --------------------------------------------------------------------------------- hand-checked scores


def tiny_result() -> BacktestResult:
    # N: 10 10 11 9 9 12 -> origins 2 and 3 with 2 steps of truth: [9, 9] and [9, 12]
    return rolling_origin(BandForecaster(), make_table([10, 10, 11, 9, 9, 12]), 2, start=2)


def test_mae_by_hand() -> None:
    r = tiny_result()
    # origin 2 predicts 11: errors 2, 2; origin 3 predicts 9: errors 0, 3
    assert np.allclose(r.mae, [1.0, 2.5])
    assert r.mae_mean == pytest.approx(1.75)


def test_pinball_by_hand() -> None:
    assert pinball_loss(np.array([10.0]), np.array([8.0]), 0.9) == pytest.approx(1.8)  # under: 0.9 x 2
    assert pinball_loss(np.array([10.0]), np.array([12.0]), 0.9) == pytest.approx(0.2)  # over: 0.1 x 2
    r = tiny_result()
    # q0.1: 0.9 0.9 0.1 0.4 | q0.5: 1 1 0 1.5 | q0.9: 0.3 0.3 0.1 1.8  -> (0.575 + 0.875 + 0.625) / 3
    assert r.pinball == pytest.approx(2.075 / 3)


def test_coverage_by_hand() -> None:
    # origin 2: [10, 12] misses 9 twice; origin 3: [8, 10] holds 9, misses 12 -> 1 of 4
    assert tiny_result().coverage80 == pytest.approx(0.25)


def test_brier_by_hand() -> None:
    # P(>= 1 preemption within h) = 0.5, 0.75. Origin 2: interval 3 loses 2 -> happened [1, 1];
    # origin 3: nothing lost in 4, 5 -> [0, 0].  (0.25 + 0.0625 + 0.25 + 0.5625) / 4
    assert tiny_result().brier == pytest.approx(0.28125)


def test_to_dict() -> None:
    d = tiny_result().to_dict()
    assert set(d) == {"mae", "mae_mean", "pinball", "coverage80", "pit_coverage80", "brier"}
    assert d["mae"] == [1.0, 2.5] and d["coverage80"] == 0.25


# ------------------------------------------------------------------------------- leave one trace out


def test_leave_one_trace_out_never_trains_on_the_held_out_trace() -> None:
    tables = {name: make_table(NOISY[i:] + NOISY[:i], name=name) for i, name in enumerate("abc")}
    made: list[BandForecaster] = []

    def make() -> BandForecaster:
        made.append(BandForecaster())
        return made[-1]

    results = leave_one_trace_out(make, tables, 3, start=30)
    assert list(results) == ["a", "b", "c"]
    assert [m.fitted_on for m in made] == [["b", "c"], ["a", "c"], ["a", "b"]]
    assert all(r.n_origins == len(NOISY) - 3 - 30 for r in results.values())
    only = leave_one_trace_out(PersistenceForecaster, tables, 2, held_out=["b"], start=30)
    assert list(only) == ["b"] and only["b"].model == "persistence"
    with pytest.raises(KeyError, match="held_out"):
        leave_one_trace_out(BandForecaster, tables, 2, held_out=["z"])


# ---------------------------------------------------------------------------------------- fan plot


def test_plot_fans_writes_a_png(tmp_path) -> None:
    table = make_table(NOISY)
    models = {"persistence": PersistenceForecaster().fit([table]), "arima": ArimaForecaster()}
    out = plot_fans(table, models, origins=[12, 26], horizon=6, path=tmp_path / "fans" / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the last row: a forecast of what has not happened yet, drawn past the table's end
    assert plot_fans(table, models, origins=[len(NOISY) - 1], horizon=2, path=tmp_path / "end.png").is_file()
    with pytest.raises(ValueError, match="row positions"):
        plot_fans(table, models, origins=[len(NOISY)], horizon=2, path=tmp_path / "x.png")


def test_tie_aware_coverage_counts_a_band_of_whole_instances_for_what_it_says():
    """`pit_coverage`: a forecast whose every quantile is the count that came covers 8/9 of the central band (its
    mass at that count spans [0.05, 0.95] of the PIT), one that missed covers nothing; the plain "inside [q10,
    q90]" says 1 and 0. On counts that mostly repeat (Poisson(0.5), quantiles exact), the plain coverage of a
    calibrated forecast is far above 0.8 (ties), the tie-aware one is near it."""
    from scipy.stats import poisson

    from forecasting import pit_coverage

    came = np.full((5, 3), 7.0)
    levels = (0.1, 0.5, 0.9)
    assert pit_coverage(came, {t: np.full_like(came, 7.0) for t in levels}) == pytest.approx(8 / 9)
    assert pit_coverage(came, {t: np.full_like(came, 8.0) for t in levels}) == 0.0
    assert np.isnan(pit_coverage(came, {}))
    y = np.random.default_rng(0).poisson(0.5, size=(20_000, 1)).astype(float)
    exact = {t: np.full_like(y, poisson.ppf(t, 0.5)) for t in levels}
    plain = float(((y >= exact[0.1]) & (y <= exact[0.9])).mean())
    assert plain > 0.9 and abs(pit_coverage(y, exact) - 0.8) < 0.02
