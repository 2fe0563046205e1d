"""Tests for forecasting.features: hand-checked values, targets, and the look-ahead-leakage guard.

Runs on hand-made tables and the bundled p3/gcp-v100 traces only (no ../shared needed).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from _tables import canonical_table

from forecasting.features import (
    ANCHOR_STEPS,
    ANCHOR_WINDOW,
    FEATURE_NAMES,
    SINCE_CAP,
    STEP_FEATURE_NAMES,
    anchor_levels,
    features_at,
    stack_steps,
    targets,
)
from forecasting.traces import load_trace

# (prev_available, n_in, n_out, available) per interval of a 10-instance cluster; row 4 has gross flows.
HAND_ROWS = [
    (10, 0, 0, 10),
    (10, 0, 0, 10),
    (10, 0, 2, 8),
    (8, 0, 0, 8),
    (8, 2, 1, 9),
    (9, 0, 3, 6),
    (6, 0, 0, 6),
    (6, 4, 0, 10),
]


def make_table(
    rows: list[tuple[int, int, int, int]], capacity: int, start: str | None = None, interval_s: float = 60.0
) -> pd.DataFrame:
    """A canonical table (forecasting.traces.COLUMNS) from explicit rows."""
    prev, n_in, n_out, avail = (np.array(c, dtype=np.int64) for c in zip(*rows))
    return canonical_table(
        avail, capacity, prev=prev, n_in=n_in, n_out=n_out, start=start, interval_s=interval_s, name="hand"
    )


def random_table(n: int, capacity: int, seed: int, start: str | None = None) -> pd.DataFrame:
    """A random walk with gross flows, for the leakage guard."""
    rng = np.random.default_rng(seed)
    rows, prev = [], capacity
    for _ in range(n):
        n_out = int(rng.binomial(min(prev, 3), 0.2))
        n_in = int(rng.binomial(min(capacity - prev + n_out, 3), 0.25))
        avail = prev - n_out + n_in
        rows.append((prev, n_in, n_out, avail))
        prev = avail
    return make_table(rows, capacity, start)


@pytest.fixture(scope="module")
def hand() -> pd.DataFrame:
    return make_table(HAND_ROWS, capacity=10)


# ----------------------------------------------------------------------------------- hand-checked


def test_columns_are_the_documented_feature_names(hand: pd.DataFrame) -> None:
    f = features_at(hand)
    assert tuple(f.columns) == FEATURE_NAMES
    assert list(f.index) == list(range(len(hand)))
    assert f.index.name == "origin"
    assert (f.dtypes == np.float64).all()


def test_level_differences_and_windows_at_origin_5(hand: pd.DataFrame) -> None:
    f = features_at(hand, [5]).iloc[0]
    # N = 10 10 8 8 9 [6]
    assert f["level"] == pytest.approx(0.6)
    assert f["headroom"] == pytest.approx(0.4)
    assert f["diff_1"] == pytest.approx(-0.3)
    assert f["diff_2"] == pytest.approx(-0.2)
    assert f["diff_3"] == pytest.approx(-0.2)
    assert math.isnan(f["diff_6"]) and math.isnan(f["diff_24"])  # lag before the first row
    assert f["mean_6"] == pytest.approx(0.85)
    assert f["min_6"] == pytest.approx(0.6)
    assert f["max_6"] == pytest.approx(1.0)
    assert f["std_6"] == pytest.approx(math.sqrt(11.5 / 6) / 10)  # population std of 10 10 8 8 9 6
    for w in (12, 24, 60):  # fewer rows than the window: the partial window
        assert f[f"mean_{w}"] == pytest.approx(0.85)
        assert f[f"std_{w}"] == pytest.approx(f["std_6"])


def test_event_counts_sizes_and_recency(hand: pd.DataFrame) -> None:
    f = features_at(hand, [1, 5, 7])
    at1, at5, at7 = (f.loc[t] for t in (1, 5, 7))
    # preemptions at rows 2 (2), 4 (1), 5 (3); allocations at rows 4 (2), 7 (4)
    assert at5["out_count_6"] == 3 and at5["out_size_6"] == pytest.approx(0.6)
    assert at5["in_count_6"] == 1 and at5["in_size_6"] == pytest.approx(0.2)
    assert at7["out_count_6"] == 3 and at7["in_count_6"] == 2 and at7["in_size_6"] == pytest.approx(0.6)
    assert at7["mean_6"] == pytest.approx(47 / 60)  # rows 2..7: 8 8 9 6 6 10
    assert at5["log_since_out"] == 0.0  # a preemption in the origin's own interval
    assert at5["log_since_in"] == pytest.approx(math.log1p(1))
    assert at7["log_since_out"] == pytest.approx(math.log1p(2))
    assert at7["log_since_in"] == 0.0
    assert at1["out_count_60"] == 0
    assert at1["log_since_out"] == pytest.approx(math.log1p(SINCE_CAP))  # none seen: the cap


def test_since_last_event_is_capped() -> None:
    rows = [(5, 0, 1, 4)] + [(4, 0, 0, 4)] * (SINCE_CAP + 50)
    f = features_at(make_table(rows, 8), [10, SINCE_CAP, SINCE_CAP + 50])
    assert list(np.expm1(f["log_since_out"]).round(6)) == [10, SINCE_CAP, SINCE_CAP]


def test_calendar_is_nan_without_absolute_time_and_set_with_it(hand: pd.DataFrame) -> None:
    f = features_at(hand)
    assert f[["tod_sin", "tod_cos", "dow"]].isna().all().all()
    # 2024-01-01 is a Monday; 06:00 UTC is a quarter of the day
    timed = features_at(make_table(HAND_ROWS, 10, start="2024-01-01 06:00"), [0, 1])
    assert timed.loc[0, "tod_sin"] == pytest.approx(1.0)
    assert timed.loc[0, "tod_cos"] == pytest.approx(0.0, abs=1e-12)
    assert timed.loc[0, "dow"] == 0
    assert timed.loc[1, "tod_sin"] == pytest.approx(math.sin(2 * math.pi * (6 * 60 + 1) / 1440))


def test_capacity_normalisation_makes_scaled_clusters_identical() -> None:
    small = random_table(200, 8, seed=3)
    big = small.copy()
    for col in ("prev_available", "n_in", "n_out", "available", "capacity"):
        big[col] = small[col] * 4
    pd.testing.assert_frame_equal(
        features_at(small).drop(columns=[c for c in FEATURE_NAMES if "count" in c]),
        features_at(big).drop(columns=[c for c in FEATURE_NAMES if "count" in c]),
    )


def test_targets_hand_checked(hand: pd.DataFrame) -> None:
    delta, preempt = targets(hand, [1, 5], horizon=3)
    assert list(delta.columns) == [1, 2, 3]
    assert delta.loc[1].tolist() == pytest.approx([-0.2, -0.2, -0.1])
    assert preempt.loc[1].tolist() == [1.0, 0.0, 1.0]
    assert delta.loc[5, 1] == 0.0 and delta.loc[5, 2] == pytest.approx(0.4)
    assert preempt.loc[5, 1] == 0.0 and preempt.loc[5, 2] == 0.0
    assert math.isnan(delta.loc[5, 3]) and math.isnan(preempt.loc[5, 3])  # past the end


def test_bad_inputs_are_reported(hand: pd.DataFrame) -> None:
    with pytest.raises(IndexError, match="row positions"):
        features_at(hand, [len(hand)])
    with pytest.raises(ValueError, match="missing columns"):
        features_at(hand.drop(columns=["n_out"]))
    with pytest.raises(ValueError, match="horizon"):
        targets(hand, [0], horizon=0)


# ----------------------------------------------------------------------------------- anchor


def dips(n: int, capacity: int = 10, period: int = 20, low: int = 7, length: int = 3) -> np.ndarray:
    """Full cluster with a dip to ``low`` for ``length`` intervals every ``period``."""
    counts = np.full(n, capacity)
    for start in range(12, n, period):
        counts[start : start + length] = low
    return counts


def test_anchor_follows_the_recent_maximum_where_dips_have_been_short() -> None:
    """Dips last 3 intervals: from a dip's first interval the anchor keeps the dip one step ahead (it still
    holds) and is back at the recent maximum from the third step on, when the dip has always ended."""
    table = canonical_table(dips(400), 10)
    t = 12 + 15 * 20  # first interval of a dip, long after the anchor's window has filled
    f = features_at(table, [t]).iloc[0]
    assert table["available"].iloc[t] == 7
    levels = anchor_levels(table, [t])[0]
    assert levels.shape == (ANCHOR_STEPS,)
    assert levels[0] == 7.0
    np.testing.assert_array_equal(levels[2:], 10.0)
    assert f["anchor_gap_1"] == 0.0 and f["anchor_gap_12"] == pytest.approx(0.3)
    # 12 steps ahead persistence misses 6 origins of each 20 by 3 (dip under way or due), the 12-interval
    # maximum only the 3 whose target lies in the next dip: half the loss
    assert f["revert_skill"] == pytest.approx(0.5)


def test_anchor_gap_at_step_is_the_anchor_of_that_step() -> None:
    table = canonical_table(dips(400), 10)
    t = 12 + 15 * 20
    stacked = stack_steps(features_at(table, [t]), ANCHOR_STEPS + 2)
    gaps = stacked["anchor_gap_at_step"].to_numpy()
    expected = (anchor_levels(table, [t])[0] - 7) / 10
    np.testing.assert_array_equal(gaps[:ANCHOR_STEPS], expected)
    np.testing.assert_array_equal(gaps[ANCHOR_STEPS:], expected[-1])  # later steps keep the last anchor


def test_anchor_is_persistence_when_losses_last() -> None:
    counts = np.concatenate([np.full(60, 10), np.full(80, 7), np.full(60, 10), np.full(100, 6)])
    table = canonical_table(counts, 10)
    levels = anchor_levels(table)
    # reverting never beat persistence here, so persistence keeps most of the weight at every step
    np.testing.assert_array_equal(levels, np.repeat(counts[:, None], ANCHOR_STEPS, axis=1))


def test_anchor_is_persistence_before_any_forecast_has_been_scored() -> None:
    table = canonical_table(dips(ANCHOR_STEPS + 5), 10)
    levels = anchor_levels(table)
    counts = table["available"].to_numpy()
    for h in range(1, ANCHOR_STEPS + 1):  # no h-step forecast is scored before row h: all tie, persistence wins
        np.testing.assert_array_equal(levels[:h, h - 1], counts[:h])


def test_the_last_since_cap_rows_give_the_features_of_the_whole_past() -> None:
    """``LightGbmForecaster.history_window`` hands LightGBM only SINCE_CAP + 1 rows in backtests."""
    assert ANCHOR_WINDOW + ANCHOR_STEPS + 12 <= SINCE_CAP
    df = random_table(900, 16, seed=5, start="2023-05-06 23:30")
    full = features_at(df)
    for t in (SINCE_CAP + 1, 500, 899):
        window = df.iloc[t - SINCE_CAP : t + 1].reset_index(drop=True)
        window.attrs = df.attrs
        got = features_at(window, [SINCE_CAP]).reset_index(drop=True)
        pd.testing.assert_frame_equal(got, full.loc[[t]].reset_index(drop=True), check_exact=True)


# ----------------------------------------------------------------------------------- leakage guard


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(lambda: load_trace("p3"), id="p3"),
        pytest.param(lambda: load_trace("gcp-v100"), id="gcp-v100-with-clock"),
        pytest.param(lambda: random_table(400, 16, seed=1, start="2023-05-06 23:30"), id="random-walk"),
    ],
)
def test_features_at_t_depend_only_on_rows_up_to_t(table) -> None:
    """The look-ahead guard: the prefix iloc[:t+1] gives exactly the features the full table gives."""
    df = table()
    full = features_at(df)
    n = len(df)
    checked = sorted({0, 1, 2, 5, 23, 24, 25, 59, 60, 61, n - 2, n - 1, *range(0, n, 37)})
    for t in checked:
        prefix = features_at(df.iloc[: t + 1], [t])
        pd.testing.assert_frame_equal(prefix, full.loc[[t]], check_exact=True)


def test_changing_the_future_does_not_change_past_features() -> None:
    df = random_table(300, 12, seed=7)
    other = random_table(300, 12, seed=8)
    t = 150
    mixed = pd.concat([df.iloc[: t + 1], other.iloc[t + 1 :]]).reset_index(drop=True)
    mixed.attrs = df.attrs
    pd.testing.assert_frame_equal(features_at(df, range(t + 1)), features_at(mixed, range(t + 1)), check_exact=True)


def test_stack_steps_adds_the_step_and_the_event_ages_at_the_target(hand: pd.DataFrame) -> None:
    stacked = stack_steps(features_at(hand, [5, 7]), horizon=3)
    assert len(stacked) == 6
    assert tuple(stacked.columns) == (*FEATURE_NAMES, *STEP_FEATURE_NAMES)
    assert stacked.index.tolist() == [(5, 1), (5, 2), (5, 3), (7, 1), (7, 2), (7, 3)]
    at5 = stacked.loc[5]
    assert at5["horizon_step"].tolist() == [1.0, 2.0, 3.0]
    # at origin 5 the last preemption is in row 5 (age 0) and the last allocation in row 4 (age 1)
    assert np.expm1(at5["log_since_out_at_step"]).round(9).tolist() == [1, 2, 3]
    assert np.expm1(at5["log_since_in_at_step"]).round(9).tolist() == [2, 3, 4]
    assert (at5["level"] == 0.6).all()
    capped = stack_steps(features_at(hand, [1]), horizon=2)  # no preemption seen: stays at the cap
    assert np.expm1(capped["log_since_out_at_step"]).round(6).tolist() == [SINCE_CAP, SINCE_CAP]
