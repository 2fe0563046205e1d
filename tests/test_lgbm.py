"""Tests for forecasting.lgbm (LightGbmForecaster) and forecasting.corpus (its training traces).

Synthetic series with a known answer, small boosters so the file runs in seconds. Corpus tests that
read ../shared/traces skip when it is absent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _tables import canonical_table, periodic_counts

from forecasting import traces as T
from forecasting.corpus import DUPLICATES, training_corpus
from forecasting.features import FEATURE_NAMES, STEP_FEATURE_NAMES
from forecasting.forecast import Forecast, Forecaster
from forecasting.lgbm import (
    ACTIVITY_EDGES,
    LightGbmForecaster,
    _best_shift,
    _sample_budget,
    activity_bins,
    decode_change,
    encode_change,
)

SHARED_PRESENT = T.shared_traces_dir().is_dir()
needs_shared = pytest.mark.skipif(not SHARED_PRESENT, reason="shared traces not present")

FAST = dict(n_estimators=60, learning_rate=0.1, num_leaves=15, min_child_samples=5)


def table_from_counts(counts: np.ndarray, capacity: int, initial: int | None = None) -> pd.DataFrame:
    """Canonical table whose n_in/n_out are the net positive/negative changes of ``counts``."""
    return canonical_table(counts, capacity, initial=initial)


PERIOD, DROP_AT, DROP_LEN = 20, 12, 3


def periodic(periods: int, capacity: int = 10, low: int = 7) -> pd.DataFrame:
    """Full cluster except a drop to ``low`` at phases DROP_AT..DROP_AT+DROP_LEN-1 of every period."""
    return table_from_counts(periodic_counts(periods, PERIOD, DROP_AT, capacity, low, DROP_LEN), capacity)


def random_walk(n: int, capacity: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    steps = rng.choice([-2, -1, 0, 0, 0, 0, 1, 2], size=n)
    counts = np.clip(capacity + np.cumsum(steps), 0, capacity)
    return table_from_counts(counts, capacity)


@pytest.fixture(scope="module")
def walk_model() -> LightGbmForecaster:
    return LightGbmForecaster(horizon_max=6, seed=3, **FAST).fit(
        [random_walk(600, 16, seed=1), random_walk(400, 8, seed=2)]
    )


# ----------------------------------------------------------------------------------- known answers


def test_constant_series_gives_constant_median_and_zero_width() -> None:
    flat = table_from_counts(np.full(300, 8), capacity=10)
    f = LightGbmForecaster(horizon_max=5, **FAST).fit([flat]).predict(flat.iloc[:200], 5)
    assert isinstance(f, Forecast)
    assert f.last_available == 8 and f.capacity == 10
    np.testing.assert_allclose(f.point, 8.0, atol=1e-6)
    np.testing.assert_allclose(f.quantiles[0.9] - f.quantiles[0.1], 0.0, atol=1e-6)
    assert np.all(f.preemption_prob < 0.01)


def test_periodic_drop_is_predicted_at_the_right_step() -> None:
    model = LightGbmForecaster(horizon_max=8, **{**FAST, "n_estimators": 150}).fit([periodic(40)])
    test = periodic(3)
    for lead in (1, 3, 5, 8):  # the drop begins ``lead`` intervals after the origin
        origin = PERIOD + DROP_AT - lead
        f = model.predict(test.iloc[: origin + 1], 8)
        expected = test["available"].to_numpy()[origin + 1 : origin + 9]
        np.testing.assert_allclose(f.point, expected, atol=0.5, err_msg=f"lead {lead}")
        assert f.preemption_prob[lead - 1] > 0.8, f"lead {lead}: {f.preemption_prob}"
        others = np.delete(f.preemption_prob, lead - 1)
        assert np.all(others < 0.2), f"lead {lead}: {f.preemption_prob}"


def test_recovering_dips_are_forecast_back_at_the_recent_maximum() -> None:
    """A trace whose dips always end after 3 intervals: the anchor follows the recent maximum, so the
    median forecasts the recovery (persistence would keep the dip for the whole horizon)."""
    model = LightGbmForecaster(horizon_max=8, **{**FAST, "n_estimators": 150}).fit([periodic(40)])
    test = periodic(15)  # > ANCHOR_WINDOW intervals of past, so the anchor has scored its experts
    origin = 12 * PERIOD + DROP_AT + 1  # second interval of a dip: N = 7, back to 10 two intervals later
    f = model.predict(test.iloc[: origin + 1], 8)
    assert f.last_available == 7
    np.testing.assert_allclose(f.point[2:], 10.0, atol=0.5)


# ----------------------------------------------------------------------------------- target encoding


def test_dead_zone_encoding_round_trips_and_keeps_the_order() -> None:
    rng = np.random.default_rng(0)
    for capacity in (4, 16, 80):
        k = np.arange(-capacity, capacity + 1, dtype=float)
        for u in (np.zeros_like(k), np.full_like(k, 0.999), rng.uniform(0, 1, len(k))):
            enc = encode_change(k, capacity, u)
            np.testing.assert_array_equal(decode_change(enc, capacity), k)
            assert np.all(np.diff(enc) > 0)  # monotone: decoded quantiles are the integer quantiles


def test_the_no_change_cell_has_the_same_width_at_every_capacity() -> None:
    """A leaf mixing capacities must not turn "mostly no change" into a loss on a large cluster."""
    for capacity in (4, 16, 80):
        assert decode_change(np.array([0.0249, -0.0249]), capacity).tolist() == [0.0, 0.0]
        assert decode_change(np.array([0.026, -0.026]), capacity).tolist() == [1.0, -1.0]


def test_activity_bins_follow_the_edges() -> None:
    counts = np.arange(0, 9)
    bins = activity_bins(counts, np.zeros_like(counts))
    assert bins.tolist() == [int(np.searchsorted(ACTIVITY_EDGES, c, side="right")) for c in counts]
    assert bins[0] == 0 and bins[-1] == len(ACTIVITY_EDGES)


# ----------------------------------------------------------------------------------- calibration


def noisy_walks(n_traces: int, n: int, capacity: int, seed: int) -> list[pd.DataFrame]:
    """Busy traces: every interval moves by -2..2 around the middle of the cluster (clipped)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_traces):
        level = capacity // 2 + np.clip(np.cumsum(rng.integers(-2, 3, n)), -capacity // 2 + 1, capacity // 2 - 1)
        out.append(table_from_counts(level, capacity))
    return out


def test_calibrated_interval_covers_about_80_percent_of_a_held_out_busy_trace() -> None:
    train = noisy_walks(4, 700, 40, seed=1)
    test = noisy_walks(1, 700, 40, seed=2)[0]
    model = LightGbmForecaster(horizon_max=6, seed=1, **FAST).fit(train)
    assert model.calibrated
    assert set(model.shifts) == {"q0.1", "q0.9"} and model.shifts["q0.1"].shape == (6, len(ACTIVITY_EDGES) + 1)
    fcs = model.predict_many(test, range(30, 690), 6)
    truth = np.stack([test["available"].to_numpy()[t + 1 : t + 7] for t in range(30, 690)])
    lo = np.stack([f.quantiles[0.1] for f in fcs])
    hi = np.stack([f.quantiles[0.9] for f in fcs])
    below, above = np.mean(truth < lo), np.mean(truth > hi)
    assert 0.72 <= 1 - below - above <= 0.88, (below, above)
    assert 0.04 <= below <= 0.16 and 0.04 <= above <= 0.16, (below, above)


def test_tail_shift_hits_the_target_rate_with_the_smallest_move() -> None:
    # change -2 (10%), -1 (20%), 0 (50%), +1 (20%); the boosters say "0" everywhere (encoded 0.0)
    change = np.repeat([-2.0, -1.0, 0.0, 1.0], [10, 20, 50, 20])
    raw, cap = np.zeros(100), np.full(100, 10.0)
    lo = _best_shift(change, raw, cap, 0.1, dead_zone=0.05)
    assert decode_change(np.array([lo]), 10.0).tolist() == [-1.0]  # P(change < -1) = 10%
    assert lo == pytest.approx(-0.03)  # the smallest shift that decodes to -1
    # above: 0 leaves 20% over, +1 leaves 0%: equally far from 10%, so the smaller move (none) wins
    assert _best_shift(change, raw, cap, 0.9, dead_zone=0.05) == 0.0


def test_shifts_move_the_tails_but_never_the_point(walk_model: LightGbmForecaster) -> None:
    table = random_walk(200, 16, seed=3)
    before = walk_model.predict_many(table, [150, 199], 6)
    saved = {k: v.copy() for k, v in walk_model.shifts.items()}
    try:
        walk_model.shifts["q0.1"][:] = -0.2  # 3.2 instances lower at every step and bin
        walk_model.shifts["q0.9"][:] = -1.0  # would cross the median: clamped to it
        after = walk_model.predict_many(table, [150, 199], 6)
    finally:
        walk_model.shifts = saved
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a.point, b.point)
        np.testing.assert_array_equal(a.quantiles[0.9], a.quantiles[0.5])
        assert np.all(a.quantiles[0.1] <= b.quantiles[0.1]) and np.any(a.quantiles[0.1] < b.quantiles[0.1])


def test_one_training_trace_is_left_uncalibrated() -> None:
    model = LightGbmForecaster(horizon_max=3, **FAST).fit([random_walk(300, 16, seed=1)])
    assert not model.calibrated
    assert all(np.all(v == 0) for v in model.shifts.values())


# ----------------------------------------------------------------------------------- contract


def test_implements_the_forecaster_protocol(walk_model: LightGbmForecaster) -> None:
    assert isinstance(walk_model, Forecaster)
    assert walk_model.feature_names == (*FEATURE_NAMES, *STEP_FEATURE_NAMES)
    assert set(walk_model.models) == {"q0.1", "q0.5", "q0.9", "preempt"}
    assert walk_model.n_train_rows > 0


def test_quantiles_ordered_and_clipped_to_capacity(walk_model: LightGbmForecaster) -> None:
    table = random_walk(300, 16, seed=9)
    for f in walk_model.predict_many(table, range(0, 300, 7), 6):
        lo, mid, hi = f.quantiles[0.1], f.quantiles[0.5], f.quantiles[0.9]
        assert np.all(lo <= mid) and np.all(mid <= hi)
        assert np.all(lo >= 0) and np.all(hi <= 16)
        np.testing.assert_array_equal(f.point, mid)
        assert np.all((f.preemption_prob >= 0) & (f.preemption_prob <= 1))
        assert len(f.events) == 6


def test_predict_many_equals_predict_on_prefixes(walk_model: LightGbmForecaster) -> None:
    table = random_walk(200, 16, seed=4)
    batch = walk_model.predict_many(table, [10, 99, 199], 4)
    for t, f in zip([10, 99, 199], batch):
        one = walk_model.predict(table.iloc[: t + 1], 4)
        np.testing.assert_array_equal(one.point, f.point)
        np.testing.assert_array_equal(one.preemption_prob, f.preemption_prob)


def test_same_seed_same_predictions() -> None:
    data = [random_walk(500, 16, seed=1), random_walk(300, 8, seed=2)]
    probe = random_walk(120, 16, seed=5)
    # max_rows forces the seeded origin subsample into play
    a = LightGbmForecaster(horizon_max=4, seed=11, max_rows=1200, **FAST).fit(data).predict(probe, 4)
    b = LightGbmForecaster(horizon_max=4, seed=11, max_rows=1200, **FAST).fit(data).predict(probe, 4)
    for q in a.quantiles:
        np.testing.assert_array_equal(a.quantiles[q], b.quantiles[q])
    np.testing.assert_array_equal(a.preemption_prob, b.preemption_prob)


def test_bytes_and_directory_round_trips_predict_identically(walk_model: LightGbmForecaster, tmp_path) -> None:
    table = random_walk(250, 16, seed=6)
    origins = list(range(0, 250, 11))
    want = walk_model.predict_many(table, origins, 6)
    blob = walk_model.to_bytes()
    assert blob.lstrip().startswith(b"{")  # JSON, not a pickle
    for loaded in (LightGbmForecaster.from_bytes(blob), LightGbmForecaster.load(walk_model.save(tmp_path / "m"))):
        assert loaded.get_params() == walk_model.get_params()
        assert loaded.calibrated == walk_model.calibrated
        for key, shift in walk_model.shifts.items():
            np.testing.assert_array_equal(loaded.shifts[key], shift)
        got = loaded.predict_many(table, origins, 6)
        for a, b in zip(want, got):
            for q in a.quantiles:
                np.testing.assert_array_equal(a.quantiles[q], b.quantiles[q])
            np.testing.assert_array_equal(a.preemption_prob, b.preemption_prob)
    assert (tmp_path / "m" / "meta.json").is_file() and (tmp_path / "m" / "q0.5.txt").is_file()


def test_errors_a_user_can_act_on(walk_model: LightGbmForecaster) -> None:
    table = random_walk(50, 16, seed=1)
    with pytest.raises(RuntimeError, match="fit"):
        LightGbmForecaster().predict(table, 3)
    with pytest.raises(ValueError, match="horizon_max"):
        walk_model.predict(table, 7)
    with pytest.raises(ValueError, match="0.5"):
        LightGbmForecaster(quantiles=(0.1, 0.9))
    with pytest.raises(ValueError, match="not a saved"):
        LightGbmForecaster.from_bytes(b'{"format": "other"}')
    with pytest.raises(ValueError, match="retrain"):  # a version-1 model (no anchor, no calibration)
        LightGbmForecaster.from_bytes(b'{"format": "parcae-lightgbm-forecaster", "version": 1}')
    with pytest.raises(ValueError, match="dead_zone"):
        LightGbmForecaster(dead_zone=0.0)


def test_sample_budget_water_fills() -> None:
    assert _sample_budget([100, 5000, 5000], 3000) == [100, 1450, 1450]
    assert _sample_budget([10, 20], 1000) == [10, 20]
    assert sum(_sample_budget([7, 9000, 30000, 12], 2000)) == 2000


# ----------------------------------------------------------------------------------- corpus


def test_corpus_without_shared_is_the_bundled_traces(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(tmp_path / "absent"))
    aws2020 = ["aws2020-g4dn-us-east-1c", "aws2020-g4dn-us-east-1d", "aws2020-p2", "aws2020-p2-us-east-1e"]
    assert list(training_corpus()) == ["p3", "gcp-v100", *aws2020]
    assert list(training_corpus(exclude=("p3",))) == ["gcp-v100", *aws2020]
    capped = training_corpus(max_intervals=500)
    assert all(len(t) == 500 for t in capped.values())
    full = training_corpus()
    pd.testing.assert_frame_equal(
        capped["gcp-v100"], full["gcp-v100"].iloc[-500:].reset_index(drop=True)
    )  # the most recent intervals


@needs_shared
def test_shared_corpus_has_no_copies_one_node_or_flat_traces() -> None:
    corpus = training_corpus(exclude=("p3",))  # one load of every trace: the slowest test here
    assert corpus and "p3" not in corpus
    assert not set(corpus) & DUPLICATES
    assert not any(name.endswith("-scaled") for name in corpus)
    p3 = T.load_trace("p3")["available"].to_numpy().tobytes()
    fingerprints = set()
    for name, table in corpus.items():
        assert table.attrs["capacity"] >= 4, name
        assert np.any(np.diff(table["available"].to_numpy()) != 0), name
        assert len(table) <= 20_000, name
        fingerprints.add(table["available"].to_numpy().tobytes())
    assert len(fingerprints) == len(corpus)  # no two copies of one trace
    assert p3 not in fingerprints  # no copy of the held-out trace under another name
