"""A LightGBM availability forecaster: calibrated quantiles of the change from a regime-adaptive anchor.

Owns: `LightGbmForecaster` (a ``forecasting.forecast.Forecaster``), its target encoding (`encode_change`,
`decode_change`), the tail calibration and its pickle-free serialisation. Must not touch: history statistics
(features, targets and the anchor come from ``forecasting.features``), MLflow (``forecasting.registry`` logs and
loads it). The design and why each choice was made: the class docstring.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import lightgbm as lgb
import numpy as np
import pandas as pd

from forecasting.features import (
    FEATURE_NAMES,
    SINCE_CAP,
    STEP_FEATURE_NAMES,
    anchor_gaps,
    features_at,
    stack_steps,
    targets,
)
from forecasting.forecast import QUANTILES, Forecast, recent_preemption_size

__all__ = [
    "ACTIVITY_EDGES",
    "DEAD_ZONE",
    "LightGbmForecaster",
    "TrainingRows",
    "activity_bins",
    "decode_change",
    "encode_change",
]

_FORMAT: Final = "parcae-lightgbm-forecaster"
_VERSION: Final = 3
_PREEMPT: Final = "preempt"

#: Width of the "no change" cell of the encoded target, as a fraction of capacity (see the module docstring).
DEAD_ZONE: Final = 0.05
#: Activity bins of the tail calibration: intervals with an allocation plus intervals with a preemption in
#: the last 60 (``in_count_60 + out_count_60``), split at these edges: [0], [1, 2], [3, 5], [6, ...).
ACTIVITY_EDGES: Final = (1, 3, 6)
#: Tail shifts tried by the calibration, in encoded units (fractions of capacity).
_SHIFTS: Final = np.round(np.linspace(-0.25, 0.25, 101), 6)
#: A (horizon, bin) cell with fewer calibration rows than this uses the shift of its whole horizon.
_MIN_CELL_ROWS: Final = 200


class TrainingRows(NamedTuple):
    """Stacked (origin, step) training rows: features and exact targets.

    ``change`` is ``N_{t+h} - anchor_{t,h}`` in whole instances (the quantile target before encoding);
    ``trace`` is the index of the history each row came from (the calibration splits by it).
    """

    X: np.ndarray
    change: np.ndarray
    preempt: np.ndarray
    capacity: np.ndarray
    trace: np.ndarray


def _quantile_key(q: float) -> str:
    return f"q{q:g}"


def encode_change(
    change: np.ndarray, capacity: np.ndarray | float, u: np.ndarray, dead_zone: float = DEAD_ZONE
) -> np.ndarray:
    """Whole-instance changes -> a point ``u`` (in [0, 1)) of the way through each one's cell.

    Cells: 0 -> ``[-dz/2, dz/2]``; k > 0 -> ``dz/2 + ((k-1)/c, k/c]``; k < 0 mirrored. Monotone in k.
    The outer cells are open at the inner end, which `decode_change` gives to the smaller change.
    """
    k = np.rint(np.asarray(change, dtype=np.float64))
    a = np.abs(k)
    c = np.asarray(capacity, dtype=np.float64)
    lo = np.where(a == 0, -dead_zone / 2, dead_zone / 2 + (a - 1) / c)
    width = np.where(a == 0, dead_zone, 1.0 / c)
    t = lo + np.where(a == 0, u, 1.0 - u) * width
    out: np.ndarray = np.where(k < 0, -t, t)
    return out


def decode_change(encoded: np.ndarray, capacity: float | np.ndarray, dead_zone: float = DEAD_ZONE) -> np.ndarray:
    """Inverse of `encode_change`: the whole-instance change whose cell holds each encoded value."""
    t = np.asarray(encoded, dtype=np.float64)
    a = np.abs(t)
    k = np.where(a <= dead_zone / 2, 0.0, np.ceil((a - dead_zone / 2) * capacity - 1e-9))
    out: np.ndarray = np.sign(t) * k
    return out


def activity_bins(in_count_60: np.ndarray, out_count_60: np.ndarray) -> np.ndarray:
    """Calibration bin (0..len(ACTIVITY_EDGES)) of each origin from its event counts of the last 60 intervals."""
    out: np.ndarray = np.searchsorted(
        np.asarray(ACTIVITY_EDGES), np.asarray(in_count_60) + np.asarray(out_count_60), side="right"
    )
    return out


def _sample_budget(lengths: Sequence[int], budget: int) -> list[int]:
    """Origins to draw per trace: all of a short trace, an equal share of what is left for long ones.

    Water-filling keeps every trace represented (a 20,000-interval trace cannot drown a 700-interval
    one) while using the whole row budget.
    """
    take = [0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    left = budget
    for rank, i in enumerate(order):
        share = left // (len(lengths) - rank)
        take[i] = min(lengths[i], share)
        left -= take[i]
    return take


def _best_shift(change: np.ndarray, raw: np.ndarray, capacity: np.ndarray, level: float, dead_zone: float) -> float:
    """The shift (in ``_SHIFTS``) whose tail rate is closest to its target; ties go to the smallest |shift|.

    Lower levels (< 0.5) target P(change < quantile) = level, upper ones P(change > quantile) = 1 - level.
    """
    decoded = decode_change(raw[:, None] + _SHIFTS[None, :], capacity[:, None], dead_zone)
    if level < 0.5:
        rate = np.mean(change[:, None] < decoded, axis=0)
        target = level
    else:
        rate = np.mean(change[:, None] > decoded, axis=0)
        target = 1.0 - level
    miss = np.round(np.abs(rate - target), 12)
    best = np.lexsort((np.abs(_SHIFTS), miss))[0]
    return float(_SHIFTS[best])


class LightGbmForecaster:
    """Gradient-boosted quantile forecaster around the anchor, over capacity-normalised history features.

    Parameters are plain values (logged as-is by the tracking layer); ``lgbm_params`` adds or overrides
    LightGBM settings shared by every booster. ``max_rows`` caps the stacked (origin, step) training
    rows; origins are subsampled per trace with ``seed``. ``calibrate`` turns on the cross-fitted tail
    calibration (it needs at least two training traces; with one, the tails are the boosters' own).
    The defaults are small, heavily regularised trees, chosen by leave-one-trace-out on the corpus
    without p3: 31-leaf trees learnt trace-specific dynamics that did not transfer and lost 5-18% MAE to
    persistence there; 4-leaf trees stay level with it and keep the Brier gain.

    Design (every choice below was made by leave-one-trace-out on the corpus *without* p3, the test trace;
    p3 numbers are reported, never used to choose):

    * **Around an anchor.** The target is the change in whole instances from the anchor of its step
      (``features.anchor_levels``: N_t, or nearer the recent maximum on a trace whose dips have recently been
      short, chosen per step ahead), not from N_t. Learnt from the corpus alone, the median shrinks to "no
      change" on every held-out trace (most traces are calm); the anchor carries the one transferable
      regularity, which regime *this* trace is in, and the boosters learn corrections, the spread and the
      preemption odds around it.
    * **One model per quantile, horizon as a feature.** Training rows are the pairs (origin t, step h) with
      the origin's features plus the step columns of ``features.stack_steps``. Per-horizon ("direct")
      models would need ``H x (Q + 1)`` boosters, each fitted on 1/H of the rows, for a target whose law
      changes smoothly with h.
    * **Dead-zone jitter.** The change k is a whole number, mostly 0, and LightGBM's quantile gradient cannot
      learn a quantile at such ties. The target is a uniform draw inside k's *cell*: the cell of 0 is
      ``[-dead_zone/2, dead_zone/2]`` (a fixed fraction of capacity), the cell of k > 0 is
      ``dead_zone/2 + [(k-1)/c, k/c]`` (mirrored for k < 0). The map is monotone, so decoding a predicted
      quantile gives the integer quantile exactly. Plain ``(k + U)/c`` jitter made the width of the 0-cell
      depend on c: a leaf mixing 4- and 16-instance traces put its median a fraction of a 16-node cell below
      0, which decodes to -1 or -2 instances on the 80-instance gcp-v100 (held out: 7% *worse* than
      persistence; with the dead zone: level with it).
    * **Calibrated tails (split conformal, cross-fitted by trace).** Trained on other traces, the 10/90%
      boosters were too wide on held-out ones (coverage 0.89-0.99). ``fit`` splits the training traces into
      two groups, fits the tail boosters on each and predicts the other, and per horizon and *activity bin*
      (intervals with an event in the last 60, ``ACTIVITY_EDGES``) picks the shift of each tail that makes
      the out-of-group rate of outcomes below q0.1 (above q0.9) closest to 10%. Binning by activity keeps the
      calm traces, where ties make any interval cover more than 80%, from narrowing the intervals of busy ones.
    * **Preemption probability** from one binary classifier on the same stacked rows: P(n_out >= 1 in
      interval t+h). The planner's law per interval comes from this hazard (``events_from_hazard``): on
      the busiest two one-hour windows of five non-p3 traces (``benchmarks/forecast_decision_quality.py
      --segments validation``) it gives the planner 0.978 of the oracle's samples, the same as the point
      path alone; the quantile law (``events_from_quantiles``) gave 0.961: its per-interval spread made
      the planner give up throughput for losses that did not come.
    * **Post-processing** in count space: anchor + decoded change, sorted across levels per step (no
      crossing), clipped to [0, c]. The point forecast is the median (MAE-optimal), a whole number.
    * **Deterministic**: ``deterministic=True, force_row_wise=True, seed, n_jobs=1`` (docs/stack.md section 5)
      and seeded origin subsampling and jitter, so one seed gives one model.
    * **Serialisation without pickle**: LightGBM's text model format per booster plus JSON metadata holding
      the calibration (``to_bytes``/``from_bytes`` as one JSON document, ``save``/``load`` as a directory).
      Predictions always go through ``Booster.predict`` so a loaded model predicts bit-for-bit like the
      fitted one.
    """

    name: str = "lightgbm"

    def __init__(
        self,
        horizon_max: int = 12,
        quantiles: Sequence[float] = QUANTILES,
        seed: int = 0,
        n_estimators: int = 300,
        learning_rate: float = 0.03,
        num_leaves: int = 4,
        min_child_samples: int = 1000,
        max_rows: int = 120_000,
        dead_zone: float = DEAD_ZONE,
        calibrate: bool = True,
        lgbm_params: Mapping[str, Any] | None = None,
    ) -> None:
        qs = tuple(sorted(float(q) for q in quantiles))
        if not qs or any(not 0.0 < q < 1.0 for q in qs) or len(set(qs)) != len(qs):
            raise ValueError(f"quantiles must be distinct levels in (0, 1), got {quantiles!r}")
        if 0.5 not in qs:
            raise ValueError(f"quantiles must include 0.5 (the point forecast is the median), got {qs}")
        if horizon_max < 1:
            raise ValueError(f"horizon_max must be >= 1, got {horizon_max}")
        if not 0.0 < dead_zone < 1.0:
            raise ValueError(f"dead_zone must be in (0, 1) (a fraction of capacity), got {dead_zone}")
        self.horizon_max = int(horizon_max)
        self.quantiles = qs
        self.seed = int(seed)
        self.n_estimators = int(n_estimators)
        self.learning_rate = float(learning_rate)
        self.num_leaves = int(num_leaves)
        self.min_child_samples = int(min_child_samples)
        self.max_rows = int(max_rows)
        self.dead_zone = float(dead_zone)
        self.calibrate = bool(calibrate)
        self.lgbm_params = dict(lgbm_params or {})
        self.feature_names: tuple[str, ...] = (*FEATURE_NAMES, *STEP_FEATURE_NAMES)
        #: Fitted models by key ("q0.1", "q0.5", ..., "preempt"): the scikit-learn estimators after
        #: ``fit``, LightGBM ``Booster`` objects after ``load``/``from_bytes`` (MLflow logs either).
        self.models: dict[str, lgb.LGBMModel | lgb.Booster] = {}
        self._boosters: dict[str, lgb.Booster] = {}
        #: Tail shifts by quantile key: (horizon_max, activity bins) in encoded units; zeros = uncalibrated.
        self.shifts: dict[str, np.ndarray] = {}
        self.calibrated: bool = False
        self.n_train_rows: int = 0

    def history_window(self, horizon: int) -> int | None:
        """Features look back at most ``SINCE_CAP`` intervals (older event ages saturate)."""
        return SINCE_CAP + 1

    # ----------------------------------------------------------------------------- parameters

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments as JSON-able values (what ``save`` stores and MLflow logs)."""
        return {
            "horizon_max": self.horizon_max,
            "quantiles": list(self.quantiles),
            "seed": self.seed,
            "n_estimators": self.n_estimators,
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_child_samples": self.min_child_samples,
            "max_rows": self.max_rows,
            "dead_zone": self.dead_zone,
            "calibrate": self.calibrate,
            "lgbm_params": dict(self.lgbm_params),
        }

    def _booster_params(self) -> dict[str, Any]:
        return {
            "n_estimators": self.n_estimators,
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_child_samples": self.min_child_samples,
            "deterministic": True,
            "force_row_wise": True,
            "seed": self.seed,
            "n_jobs": 1,
            "verbose": -1,
            **self.lgbm_params,
        }

    # ----------------------------------------------------------------------------- training data

    def _stack(self, feats: pd.DataFrame, horizon: int) -> np.ndarray:
        """(origin, step) rows in ``feature_names`` order (see ``features.stack_steps``)."""
        out: np.ndarray = stack_steps(feats, horizon)[list(self.feature_names)].to_numpy(dtype=np.float64)
        return out

    def training_rows(self, histories: Sequence[pd.DataFrame]) -> TrainingRows:
        """Stacked design matrix and exact targets for ``histories`` (no jitter; see ``fit``).

        Origins are those with at least one future interval; long traces are subsampled (seeded) so
        that the stacked rows stay under ``max_rows``. Rows whose step lies past the trace end are dropped.
        """
        H = self.horizon_max
        usable = [max(len(t) - 1, 0) for t in histories]
        take = _sample_budget(usable, max(self.max_rows // H, 1))
        rng = np.random.default_rng(self.seed)
        xs, ks, ps, cs, ts = [], [], [], [], []
        for i, (table, n_usable, k) in enumerate(zip(histories, usable, take)):
            if k == 0:
                continue
            origins = np.arange(n_usable) if k >= n_usable else np.sort(rng.choice(n_usable, k, replace=False))
            feats = features_at(table, origins)
            delta, preempt = targets(table, origins, H)
            c = float(table["capacity"].iloc[-1])
            gap = anchor_gaps(feats, H)  # (anchor - N_t) / c, per step
            xs.append(self._stack(feats, H))
            ks.append(np.rint(c * (delta.to_numpy() - gap)).reshape(-1))
            ps.append(preempt.to_numpy().reshape(-1))
            cs.append(np.full(len(origins) * H, c))
            ts.append(np.full(len(origins) * H, i))
        if not xs:
            raise ValueError("no training rows: every history is shorter than two intervals")
        X, change, preempted, capacity, trace = (np.concatenate(a) for a in (xs, ks, ps, cs, ts))
        keep = ~np.isnan(change)
        return TrainingRows(X[keep], change[keep], preempted[keep], capacity[keep], trace[keep])

    # ----------------------------------------------------------------------------- Forecaster API

    def fit(self, histories: Sequence[pd.DataFrame]) -> LightGbmForecaster:
        """Fit one quantile booster per level and the preemption classifier; calibrate the tails."""
        if isinstance(histories, pd.DataFrame):
            histories = [histories]
        histories = list(histories)
        rows = self.training_rows(histories)
        frame = pd.DataFrame(rows.X, columns=list(self.feature_names))
        u = np.random.default_rng([self.seed, 1]).uniform(0.0, 1.0, size=len(rows.change))
        y = encode_change(rows.change, rows.capacity, u, self.dead_zone)
        models: dict[str, lgb.LGBMModel] = {}
        for q in self.quantiles:
            models[_quantile_key(q)] = self._quantile_model(q).fit(frame, y)
        # a history without any preemption still fits: LightGBM then predicts ~0 for every row
        models[_PREEMPT] = lgb.LGBMClassifier(objective="binary", **self._booster_params()).fit(
            frame, rows.preempt.astype(np.int64)
        )
        self.models = dict(models)
        self._boosters = {k: m.booster_ for k, m in models.items()}
        self.n_train_rows = len(rows.X)
        self._calibrate(rows, frame, y, len(histories))
        return self

    def _quantile_model(self, q: float) -> lgb.LGBMRegressor:
        return lgb.LGBMRegressor(objective="quantile", alpha=q, **self._booster_params())

    def _calibrate(self, rows: TrainingRows, frame: pd.DataFrame, y: np.ndarray, n_traces: int) -> None:
        """Split-conformal tail shifts per (horizon, activity bin), cross-fitted over two trace groups.

        Group g holds the training traces with index i % 2 == g; the tail boosters fitted on one group
        predict the other, so every calibration row is scored by a model that never saw its trace.
        """
        tails = [q for q in self.quantiles if q != 0.5]
        n_bins = len(ACTIVITY_EDGES) + 1
        self.shifts = {_quantile_key(q): np.zeros((self.horizon_max, n_bins)) for q in tails}
        self.calibrated = False
        if not self.calibrate or n_traces < 2 or not tails:
            return
        group = rows.trace % 2
        if len(np.unique(group)) < 2:
            return
        raw = {q: np.empty(len(y)) for q in tails}
        for g in (0, 1):
            train, test = group != g, group == g
            for q in tails:
                model = self._quantile_model(q).fit(frame[train], y[train])
                raw[q][test] = model.booster_.predict(rows.X[test])
        names = list(self.feature_names)
        step = rows.X[:, names.index("horizon_step")].astype(np.int64)
        bins = activity_bins(rows.X[:, names.index("in_count_60")], rows.X[:, names.index("out_count_60")])
        for q in tails:
            table = self.shifts[_quantile_key(q)]
            for h in range(1, self.horizon_max + 1):
                at_h = step == h
                if not at_h.any():
                    continue
                pooled = _best_shift(rows.change[at_h], raw[q][at_h], rows.capacity[at_h], q, self.dead_zone)
                for b in range(n_bins):
                    cell = at_h & (bins == b)
                    table[h - 1, b] = (
                        _best_shift(rows.change[cell], raw[q][cell], rows.capacity[cell], q, self.dead_zone)
                        if cell.sum() >= _MIN_CELL_ROWS
                        else pooled
                    )
        self.calibrated = True

    def _check_ready(self, horizon: int) -> None:
        if not self._boosters:
            raise RuntimeError(f"{self.name}: call fit() (or load a saved model) before predict()")
        if not 1 <= horizon <= self.horizon_max:
            raise ValueError(f"{self.name}: horizon must be in 1..{self.horizon_max} (horizon_max), got {horizon}")

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        """Forecast the ``horizon`` intervals after the last row of ``history``."""
        return self.predict_many(history, [len(history) - 1], horizon)[0]

    def predict_many(self, table: pd.DataFrame, origins: Sequence[int] | np.ndarray, horizon: int) -> list[Forecast]:
        """Forecasts from several origins (row positions) of one table, in one batched model call.

        Equal to ``[predict(table.iloc[:t + 1], horizon) for t in origins]``: features at t use rows <= t
        only. Backtests use this to avoid recomputing the features once per origin.
        """
        self._check_ready(horizon)
        idx = np.asarray(origins, dtype=np.int64).reshape(-1)
        feats = features_at(table, idx)
        X = self._stack(feats, horizon)
        c = float(table["capacity"].iloc[-1])
        last = table["available"].to_numpy(dtype=np.int64)[idx]
        anchor = np.rint(last[:, None] + c * anchor_gaps(feats, horizon))
        bins = activity_bins(feats["in_count_60"].to_numpy(), feats["out_count_60"].to_numpy())
        steps = np.arange(horizon)
        per_level = []
        for q in self.quantiles:
            raw = np.asarray(self._boosters[_quantile_key(q)].predict(X)).reshape(len(idx), horizon)
            shift = self.shifts.get(_quantile_key(q))
            if shift is not None:
                raw = raw + shift[steps[None, :], bins[:, None]]
            per_level.append(anchor + decode_change(raw, c, self.dead_zone))
        levels = np.stack(per_level)
        median = self.quantiles.index(0.5)
        # No crossing, outward from the median: a calibrated tail shifted past the median is clamped to
        # it, never the other way round (sorting would move the point forecast).
        for i in range(median - 1, -1, -1):
            levels[i] = np.minimum(levels[i], levels[i + 1])
        for i in range(median + 1, len(self.quantiles)):
            levels[i] = np.maximum(levels[i], levels[i - 1])
        levels = np.clip(levels, 0.0, c)
        prob = np.clip(np.asarray(self._boosters[_PREEMPT].predict(X)).reshape(len(idx), horizon), 0.0, 1.0)
        n_out = table["n_out"].to_numpy()
        out = []
        for j in range(len(idx)):
            qs = {q: levels[i, j].copy() for i, q in enumerate(self.quantiles)}
            out.append(
                Forecast(
                    model=self.name,
                    last_available=int(last[j]),
                    capacity=int(c),
                    point=levels[median, j].copy(),
                    quantiles=qs,
                    preemption_prob=prob[j].copy(),
                    preemption_size=recent_preemption_size(n_out[: idx[j] + 1]),
                )
            )
        return out

    # ----------------------------------------------------------------------------- persistence

    def _document(self) -> dict[str, Any]:
        if not self._boosters:
            raise RuntimeError(f"{self.name}: nothing to save, the forecaster is not fitted")
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "params": self.get_params(),
            "feature_names": list(self.feature_names),
            "n_train_rows": self.n_train_rows,
            "models": sorted(self._boosters),
            "calibrated": self.calibrated,
            "activity_edges": list(ACTIVITY_EDGES),
            "shifts": {k: v.tolist() for k, v in sorted(self.shifts.items())},
        }

    @classmethod
    def _from_document(cls, doc: Mapping[str, Any], texts: Mapping[str, str]) -> LightGbmForecaster:
        if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
            raise ValueError(
                f"not a saved {_FORMAT} v{_VERSION}: format={doc.get('format')!r}, version={doc.get('version')!r}"
                "; retrain it with this version (`parcae forecast train`)"
            )
        model = cls(**doc["params"])
        if tuple(doc["feature_names"]) != model.feature_names or tuple(doc.get("activity_edges", ())) != ACTIVITY_EDGES:
            raise ValueError(
                "saved model uses a different feature set than forecasting.features now builds; retrain it"
            )
        model._boosters = {k: lgb.Booster(model_str=texts[k]) for k in doc["models"]}
        model.models = dict(model._boosters)
        model.n_train_rows = int(doc.get("n_train_rows", 0))
        model.calibrated = bool(doc.get("calibrated", False))
        model.shifts = {k: np.asarray(v, dtype=np.float64) for k, v in doc.get("shifts", {}).items()}
        return model

    def to_bytes(self) -> bytes:
        """One UTF-8 JSON document: metadata plus each booster in LightGBM's text model format."""
        doc = self._document()
        doc["model_text"] = {k: b.model_to_string() for k, b in sorted(self._boosters.items())}
        return json.dumps(doc).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> LightGbmForecaster:
        doc = json.loads(data.decode("utf-8"))
        return cls._from_document(doc, doc.get("model_text", {}))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``path/meta.json`` and ``path/<model>.txt`` per booster; returns the directory."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        doc = self._document()
        for key, booster in self._boosters.items():
            booster.save_model(str(out / f"{key}.txt"))
        (out / "meta.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LightGbmForecaster:
        src = Path(path)
        doc = json.loads((src / "meta.json").read_text(encoding="utf-8"))
        texts = {k: (src / f"{k}.txt").read_text(encoding="utf-8") for k in doc["models"]}
        return cls._from_document(doc, texts)
