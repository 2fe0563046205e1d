"""Tests for forecasting.baselines: known answers of persistence, reference ARIMA and ETS on synthetic series.

Series are short and synthetic; ARIMA/ETS fits cost ~50 ms each, so every test makes only a handful.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from _tables import canonical_table

from forecasting.backtest import rolling_origin
from forecasting.baselines import (
    ArimaForecaster,
    EtsForecaster,
    PersistenceForecaster,
    flatten_turnpoint,
    rebuild_with_penalties,
    reference_window,
    remove_outliers,
    table_capacity,
    trend_penalties,
)
from forecasting.forecast import Forecast, Forecaster


def make_table(available, capacity: int, n_in=None, n_out=None, name: str = "synthetic") -> pd.DataFrame:
    """A canonical per-interval table; in/out default to the net change of each interval."""
    return canonical_table(available, capacity, n_in=n_in, n_out=n_out, name=name, source="")


def event_walk(n: int, rng: np.random.Generator, lam: float = 3.0, capacity: int = 1000) -> pd.DataFrame:
    """Random walk of single-instance events: Poisson(lam) arrivals and Poisson(lam) preemptions per interval."""
    n_in, n_out = rng.poisson(lam, n), rng.poisson(lam, n)
    return make_table(capacity // 2 + np.cumsum(n_in - n_out), capacity, n_in, n_out)


def check_shape(fc: Forecast, horizon: int, capacity: int) -> None:
    assert fc.horizon == horizon and fc.capacity == capacity
    assert {0.1, 0.5, 0.9} <= set(fc.quantiles)
    for arr in (fc.point, *fc.quantiles.values()):
        assert arr.shape == (horizon,) and np.all(arr >= 0) and np.all(arr <= capacity)
    assert np.all(fc.quantiles[0.1] <= fc.quantiles[0.5]) and np.all(fc.quantiles[0.5] <= fc.quantiles[0.9])
    assert fc.preemption_prob.shape == (horizon,)
    assert np.all((fc.preemption_prob >= 0) & (fc.preemption_prob <= 1))


ALL = (PersistenceForecaster, ArimaForecaster, EtsForecaster)


@pytest.mark.parametrize("cls", ALL)
def test_implements_the_forecaster_protocol(cls) -> None:
    assert isinstance(cls(), Forecaster)


# ------------------------------------------------------------------------------------ known answers


@pytest.mark.parametrize("cls", ALL)
def test_constant_series_predicts_the_constant_with_zero_width(cls) -> None:
    flat = make_table([20] * 40, capacity=32)
    model = cls().fit([flat])
    fc = model.predict(flat, 6)
    check_shape(fc, 6, 32)
    assert np.all(fc.point == 20)
    for q in (0.1, 0.5, 0.9):
        assert np.all(fc.quantiles[q] == 20)
    assert np.all(fc.preemption_prob == 0)


def test_persistence_follows_a_step_to_the_new_level() -> None:
    table = make_table([10] * 15 + [14] * 5, capacity=32)
    fc = PersistenceForecaster().fit([table]).predict(table, 4)
    assert np.all(fc.point == 14) and fc.last_available == 14


@pytest.mark.parametrize("cls", (ArimaForecaster, EtsForecaster))
def test_periodic_series_gives_ordered_clipped_forecasts(cls) -> None:
    # period 6 hugging the cap of 10: the models' raw paths leave [0, 10], the forecasts may not
    pattern = [10, 10, 9, 6, 7, 9]
    table = make_table(pattern * 5, capacity=10)
    model = cls().fit([table])
    for end in (20, 27):
        fc = model.predict(table.iloc[: end + 1], 6)
        check_shape(fc, 6, 10)
    assert model.fallbacks == 0 and model.fits >= 1  # a window the outlier rule flattens needs no fit


def test_persistence_interval_is_calibrated_on_a_random_walk() -> None:
    # Outcomes are integers, so an inclusive 80% interval of a walk that moves by exactly one instance
    # per interval covers 100% at every h; several single-instance events per interval make it meaningful.
    rng = np.random.default_rng(7)
    model = PersistenceForecaster().fit([event_walk(4000, rng)])
    result = rolling_origin(model, event_walk(1000, rng), 6, start=0, max_history=1)
    inside = (result.truth >= result.quantiles[0.1]) & (result.truth <= result.quantiles[0.9])
    coverage = inside.mean(axis=0)
    assert np.all((coverage >= 0.7) & (coverage <= 0.9)), coverage


# ------------------------------------------------------------------------------------- persistence


def test_unfitted_persistence_has_zero_width_and_the_history_preemption_rate() -> None:
    table = make_table([10, 9, 9, 8, 8, 8, 9, 9], capacity=16)  # 2 of 8 intervals lose an instance
    fc = PersistenceForecaster().predict(table, 3)
    assert np.all(fc.quantiles[0.1] == 9) and np.all(fc.quantiles[0.9] == 9)
    assert np.allclose(fc.preemption_prob, 0.25)
    quiet = make_table([10, 11, 11], capacity=16)
    assert np.all(PersistenceForecaster().predict(quiet, 2).preemption_prob == 0)
    # fitted on tables too short to give a change: still the unfitted behaviour
    assert not PersistenceForecaster().fit([make_table([5], capacity=8)]).fitted


def test_persistence_spread_is_learnt_per_step_and_scales_with_capacity() -> None:
    # +1, -1, +1, -1 ...: one step away the change is +-1 (of 10), two steps away always 0
    train = make_table([5, 6] * 50, capacity=10)
    model = PersistenceForecaster(max_horizon=2).fit(train)  # one table is accepted as is
    assert model.fitted and model.n_origins == 99
    fc = model.predict(make_table([10, 10, 10], capacity=20), 4)
    assert np.allclose(fc.quantiles[0.1], [8, 10, 10, 10])  # -1/10 of capacity 20 = -2; h > 2 reuses h = 2
    assert np.allclose(fc.quantiles[0.9], [12, 10, 10, 10])
    assert np.allclose(fc.preemption_prob, [0.5, 0.5, 0.5, 0.5], atol=0.02)
    assert np.all(fc.point == 10)


def test_persistence_quantiles_stay_inside_the_capacity() -> None:
    model = PersistenceForecaster().fit([make_table([5, 6] * 50, capacity=10)])
    fc = model.predict(make_table([10, 10], capacity=10), 2)
    check_shape(fc, 2, 10)
    assert fc.quantiles[0.9][0] == 10


def test_bad_inputs_raise_actionable_errors() -> None:
    with pytest.raises(ValueError, match="horizon"):
        PersistenceForecaster().predict(make_table([3, 3], 4), 0)
    with pytest.raises(ValueError, match="non-empty canonical table"):
        ArimaForecaster().predict(make_table([3, 3], 4).iloc[:0], 2)


def test_capacity_comes_from_attrs_then_column() -> None:
    table = make_table([3, 4], capacity=12)
    assert table_capacity(table) == 12
    table.attrs = {}
    assert table_capacity(table) == 12


# ---------------------------------------------------------------------- reference post-processing


def test_reference_window_mapping() -> None:
    got = {k: reference_window(k) for k in (3, 5, 6, 7, 8, 9, 10, 11, 12, 14, 20)}
    assert got == {3: 8, 5: 10, 6: 7, 7: 8, 8: 8, 9: 9, 10: 10, 11: 11, 12: 12, 14: 17, 20: 20}


def test_remove_outliers_flattens_short_spikes_only() -> None:
    assert list(remove_outliers(np.array([5, 5, 9, 5, 5]))) == [5, 5, 5, 5, 5]
    assert list(remove_outliers(np.array([5, 1, 2, 3, 5, 6]))) == [5, 5, 5, 5, 5, 6]  # a dip of 3
    four = [5, 9, 9, 9, 9, 5]
    assert list(remove_outliers(np.array(four))) == four  # 4 intervals is a level, not an outlier
    assert remove_outliers(np.array([7, 3, 9]))[-1] == 9  # the origin is never rewritten


def test_flatten_turnpoint() -> None:
    assert list(flatten_turnpoint(np.array([10, 8, 6, 7, 9]))) == [6, 6, 6, 7, 9]
    assert list(flatten_turnpoint(np.array([5, 8, 9, 7, 6]))) == [9, 9, 9, 7, 6]
    assert list(flatten_turnpoint(np.array([6, 4, 6, 4, 7]))) == [4, 4, 4, 4, 7]  # last occurrence
    assert list(flatten_turnpoint(np.array([3, 4, 5]))) == [3, 4, 5]


def test_trend_penalties() -> None:
    assert trend_penalties(np.array([10, 11, 13, 16])) == (0.75, 1.0)
    assert trend_penalties(np.array([10, 12, 20])) == (0.5, 1.0)
    assert trend_penalties(np.array([20, 18, 15, 10])) == (1.0, 0.5)
    assert trend_penalties(np.array([20, 19, 14])) == (1.0, 0.75)
    assert trend_penalties(np.array([9, 9, 9])) == (1.0, 1.0)
    assert trend_penalties(np.array([10, 16, 12])) == (1.0, 1.0)


def test_rebuild_with_penalties() -> None:
    path = rebuild_with_penalties(20, np.array([2, 0, 1]), np.array([0, 4, 0]), 0.5, 0.75)
    assert list(path) == [21, 18, 18]  # 21, 21 - 3, rint(18.5) = 18 (half to even, like np.rint)


# ------------------------------------------------------------------------------------------- ARIMA


NOISY = [20, 21, 21, 23, 22, 24, 23, 25, 24, 26, 25, 24, 26, 27, 26, 28, 27, 26, 28, 29]


def test_arima_warm_up_is_flat_without_fitting() -> None:
    model = ArimaForecaster()
    table = make_table(NOISY, capacity=32)
    fc = model.predict(table.iloc[:8], 8)  # 7 past intervals < W = 8
    assert np.all(fc.point == NOISY[7]) and model.fits == 0 and fc.model == "arima"
    model.predict(table.iloc[:9], 8)
    assert model.fits == 1


def test_arima_quantiles_bracket_the_point_and_calls_are_repeatable() -> None:
    table = make_table(NOISY, capacity=32, n_out=[0, 0, 1, 0, 2, 0, 1, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0])
    model = ArimaForecaster(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any statsmodels warning escaping predict fails the test
        a = model.predict(table, 6)
        b = model.predict(table, 6)
    check_shape(a, 6, 32)
    assert np.array_equal(a.point, b.point) and a.to_dict() == b.to_dict()
    assert np.all(a.quantiles[0.1] <= a.point) and np.all(a.point <= a.quantiles[0.9])
    assert np.any(a.quantiles[0.9] > a.quantiles[0.1])  # the ARIMA band, not persistence's (unfitted: 0 width)
    assert np.array_equal(a.point, np.rint(a.point))
    drops = np.diff(np.concatenate(([a.last_available], a.point))) < 0
    assert np.all(a.preemption_prob[drops] == 1.0)


def test_arima_growth_and_range_clips() -> None:
    # Non-monotone windows (penalties stay 1) whose drift would carry ARIMA past 32 / below 8.
    rising = make_table([10, 12, 11, 14, 16, 15, 18, 20, 19, 22], capacity=32)
    fc = ArimaForecaster(jitter=False).predict(rising, 8)
    assert np.all(fc.point[1:] <= fc.point[0] + 3) and fc.point.max() <= 32
    assert fc.point[-1] == fc.point[0] + 3  # the drift is steep enough to hit the growth clip
    falling = [30, 28, 29, 25, 22, 23, 19, 16, 17, 13]
    fc = ArimaForecaster(jitter=False).predict(make_table(falling, capacity=32), 8)
    assert fc.point.min() == fc.point[0] - 3  # growth clip downwards
    fc = ArimaForecaster(jitter=False).predict(make_table(falling + [11], capacity=32), 8)
    assert np.all(fc.point[1:] >= fc.point[0] - 3)
    assert fc.point.min() == 8  # range clip at 8/32 of capacity, above the growth clip


def test_arima_penalties_are_not_sticky() -> None:
    steep = make_table([10, 10, 12, 14, 16, 18, 20, 22, 24, 25], capacity=32)  # rise of 15 -> in_penalty 0.5
    mild = make_table([20, 21, 20, 22, 21, 23, 22, 24, 23, 25], capacity=32)
    used = ArimaForecaster()
    used.predict(steep, 5)
    assert used.predict(mild, 5).to_dict() == ArimaForecaster().predict(mild, 5).to_dict()


def test_arima_jitter_is_seeded_per_origin() -> None:
    # A flat forecast from a non-flat window (pinned at the cap) gets Poisson removals: same seed and
    # origin, same draws; the draws do change with the seed.
    at_cap = [28, 29, 30, 31, 32, 31, 32, 32, 31, 32, 32]
    table = make_table(at_cap, capacity=32, n_out=[0, 1, 0, 1, 0, 2, 0, 0, 1, 0, 0])
    points = {seed: tuple(ArimaForecaster(seed=seed).predict(table, 8).point) for seed in range(4)}
    assert points[0] == tuple(ArimaForecaster(seed=0).predict(table, 8).point)
    assert len(set(points.values())) > 1


def test_arima_fit_failure_falls_back_to_persistence(monkeypatch: pytest.MonkeyPatch) -> None:
    import statsmodels.tsa.arima.model as sm_arima

    def broken(*args, **kwargs):
        raise np.linalg.LinAlgError("singular")

    monkeypatch.setattr(sm_arima, "ARIMA", broken)
    table = make_table(NOISY, capacity=32)
    model = ArimaForecaster().fit([table])
    fc = model.predict(table, 4)
    assert model.fallbacks == 1 and fc.model == "arima"
    assert np.all(fc.point == NOISY[-1])
    assert fc.to_dict()["quantiles"] == PersistenceForecaster().fit([table]).predict(table, 4).to_dict()["quantiles"]


# --------------------------------------------------------------------------------------------- ETS


def test_ets_forecast_is_repeatable_and_clipped(capsys: pytest.CaptureFixture[str]) -> None:
    table = make_table(NOISY, capacity=29)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = EtsForecaster(seed=1).predict(table, 5)
        b = EtsForecaster(seed=1).predict(table, 5)
    check_shape(a, 5, 29)
    assert a.to_dict() == b.to_dict()
    assert capsys.readouterr() == ("", "")  # library code never prints


def test_ets_fit_failure_falls_back_to_persistence(monkeypatch: pytest.MonkeyPatch) -> None:
    import statsmodels.tsa.holtwinters as sm_hw

    def broken(*args, **kwargs):
        raise ValueError("optimizer failed")

    monkeypatch.setattr(sm_hw, "ExponentialSmoothing", broken)
    model = EtsForecaster()
    fc = model.predict(make_table(NOISY, capacity=32), 3)
    assert model.fallbacks == 1 and np.all(fc.point == NOISY[-1]) and fc.model == "ets"
