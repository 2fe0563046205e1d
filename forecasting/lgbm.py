"""A LightGBM availability forecaster: quantiles of the capacity-normalised change, plus preemption odds.

This module owns the learnt forecaster that implements ``forecasting.forecast.Forecaster``. It consumes
features and targets from ``forecasting.features`` (it never computes history statistics itself) and
returns ``Forecast`` objects; evaluation code scores it like any other forecaster.

Design:

* **One model per quantile, horizon as a feature.** Training rows are the pairs (origin t, step h) with
  the origin's features plus the step columns of ``features.stack_steps`` (h, and the age of the last
  preemption/allocation as of t+h); the target is ``(N_{t+h} - N_t) / c``. Per-horizon ("direct")
  models would need ``H x (Q + 1)`` boosters (48 at H = 12), each fitted on 1/H of the rows, for a
  target whose distribution changes smoothly with h; the stacked model shares that data and is H times
  cheaper to fit, store and log. Its one weakness, that "a preemption is due at t+h" is an interaction
  of the origin's event age and h which greedy trees cannot find, is removed by the age-at-step columns.
* **Quantile objective on jittered counts.** The change is a whole number of instances, mostly exactly
  0; LightGBM's quantile gradient cannot tell a "no change" row from a "drop" row at such a tie, so the
  median model would never learn a drop. Training adds U(-1/2, 1/2) instance of seeded noise (the
  jittering device for quantiles of counts); prediction rounds back to whole instances
  (``round_to_instances``), which is the exact inverse: round(Q_{Y+U}(a)) = Q_Y(a).
* **Preemption probability** from one binary classifier on the same stacked rows: P(n_out >= 1 in
  interval t+h).
* **Post-processing** in count space: ``N_t + c * delta``, rounded, sorted across levels per step (no
  crossing), clipped to [0, c]. The point forecast is the median (MAE-optimal), a float holding a whole
  number of instances.
* **Deterministic**: ``deterministic=True, force_row_wise=True, seed, n_jobs=1`` (docs/stack.md section 5)
  and a seeded origin subsample, so one seed gives one model.
* **Serialisation without pickle**: LightGBM's text model format per booster plus JSON metadata
  (``to_bytes``/``from_bytes`` as one JSON document, ``save``/``load`` as a directory). Predictions
  always go through ``Booster.predict`` so a loaded model predicts bit-for-bit like the fitted one.
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

from forecasting.features import FEATURE_NAMES, STEP_FEATURE_NAMES, features_at, stack_steps, targets
from forecasting.forecast import QUANTILES, Forecast, recent_preemption_size

__all__ = ["LightGbmForecaster", "TrainingRows"]

_FORMAT: Final = "parcae-lightgbm-forecaster"
_VERSION: Final = 1
_PREEMPT: Final = "preempt"


class TrainingRows(NamedTuple):
    """Stacked (origin, step) training rows: features, exact targets, and each row's capacity."""

    X: np.ndarray
    delta: np.ndarray
    preempt: np.ndarray
    capacity: np.ndarray


def _quantile_key(q: float) -> str:
    return f"q{q:g}"


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


class LightGbmForecaster:
    """Gradient-boosted quantile forecaster over capacity-normalised history features.

    Parameters are plain values (logged as-is by the tracking layer); ``lgbm_params`` adds or overrides
    LightGBM settings shared by every booster. ``max_rows`` caps the stacked (origin, step) training
    rows; origins are subsampled per trace with ``seed``. The defaults are small, heavily regularised
    trees, chosen by leave-one-trace-out on six traces other than p3 (gcp-v100, aws2020-p2, both
    aws2020-g4dn, skypilot-16node-us-east-2b, skypilot-4node-us-east-1f): 31-leaf trees learnt
    trace-specific dynamics that did not transfer and lost 5-18% MAE to persistence there; 4-leaf
    trees stay within 1% of it and keep the Brier gain.
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
        max_rows: int = 200_000,
        round_to_instances: bool = True,
        lgbm_params: Mapping[str, Any] | None = None,
    ) -> None:
        qs = tuple(sorted(float(q) for q in quantiles))
        if not qs or any(not 0.0 < q < 1.0 for q in qs) or len(set(qs)) != len(qs):
            raise ValueError(f"quantiles must be distinct levels in (0, 1), got {quantiles!r}")
        if 0.5 not in qs:
            raise ValueError(f"quantiles must include 0.5 (the point forecast is the median), got {qs}")
        if horizon_max < 1:
            raise ValueError(f"horizon_max must be >= 1, got {horizon_max}")
        self.horizon_max = int(horizon_max)
        self.quantiles = qs
        self.seed = int(seed)
        self.n_estimators = int(n_estimators)
        self.learning_rate = float(learning_rate)
        self.num_leaves = int(num_leaves)
        self.min_child_samples = int(min_child_samples)
        self.max_rows = int(max_rows)
        self.round_to_instances = bool(round_to_instances)
        self.lgbm_params = dict(lgbm_params or {})
        self.feature_names: tuple[str, ...] = (*FEATURE_NAMES, *STEP_FEATURE_NAMES)
        #: Fitted models by key ("q0.1", "q0.5", ..., "preempt"): the scikit-learn estimators after
        #: ``fit``, LightGBM ``Booster`` objects after ``load``/``from_bytes`` (MLflow logs either).
        self.models: dict[str, lgb.LGBMModel | lgb.Booster] = {}
        self._boosters: dict[str, lgb.Booster] = {}
        self.n_train_rows: int = 0

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
            "round_to_instances": self.round_to_instances,
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
        return stack_steps(feats, horizon)[list(self.feature_names)].to_numpy(dtype=np.float64)

    def training_rows(self, histories: Sequence[pd.DataFrame]) -> TrainingRows:
        """Stacked design matrix and exact targets for ``histories`` (no jitter; see ``fit``).

        Origins are those with at least one future interval; long traces are subsampled (seeded) so
        that the stacked rows stay under ``max_rows``. Rows whose step lies past the trace end are dropped.
        """
        H = self.horizon_max
        usable = [max(len(t) - 1, 0) for t in histories]
        take = _sample_budget(usable, max(self.max_rows // H, 1))
        rng = np.random.default_rng(self.seed)
        xs, ds, ps, cs = [], [], [], []
        for table, n_usable, k in zip(histories, usable, take):
            if k == 0:
                continue
            origins = np.arange(n_usable) if k >= n_usable else np.sort(rng.choice(n_usable, k, replace=False))
            feats = features_at(table, origins)
            delta, preempt = targets(table, origins, H)
            xs.append(self._stack(feats, H))
            ds.append(delta.to_numpy().reshape(-1))
            ps.append(preempt.to_numpy().reshape(-1))
            cs.append(np.full(len(origins) * H, float(table["capacity"].iloc[-1])))
        if not xs:
            raise ValueError("no training rows: every history is shorter than two intervals")
        X, d, p, c = (np.concatenate(a) for a in (xs, ds, ps, cs))
        keep = ~np.isnan(d)
        return TrainingRows(X[keep], d[keep], p[keep], c[keep])

    # ----------------------------------------------------------------------------- Forecaster API

    def fit(self, histories: Sequence[pd.DataFrame]) -> LightGbmForecaster:
        """Fit one quantile booster per level and the preemption classifier on all ``histories``."""
        if isinstance(histories, pd.DataFrame):
            histories = [histories]
        rows = self.training_rows(list(histories))
        frame = pd.DataFrame(rows.X, columns=list(self.feature_names))
        params = self._booster_params()
        # Jitter (Machado & Santos Silva's device for quantiles of counts): the change is a whole number
        # of instances, mostly exactly 0. On such ties LightGBM's quantile gradient is the same for
        # "no change" and "drop" rows (sign(pred - y) with pred = y = 0 counts as >= 0), so the median
        # model could never learn a drop. Spreading each count uniformly over +-half an instance
        # removes the ties and keeps the quantiles: the alpha-quantile of Y + U rounds to Y's.
        noise = np.random.default_rng([self.seed, 1]).uniform(-0.5, 0.5, size=len(rows.delta)) / rows.capacity
        jittered = rows.delta + noise
        models: dict[str, lgb.LGBMModel] = {}
        for q in self.quantiles:
            models[_quantile_key(q)] = lgb.LGBMRegressor(objective="quantile", alpha=q, **params).fit(frame, jittered)
        # a history without any preemption still fits: LightGBM then predicts ~0 for every row
        models[_PREEMPT] = lgb.LGBMClassifier(objective="binary", **params).fit(frame, rows.preempt.astype(np.int64))
        self.models = dict(models)
        self._boosters = {k: m.booster_ for k, m in models.items()}
        self.n_train_rows = len(rows.X)
        return self

    def _check_ready(self, horizon: int) -> None:
        if not self._boosters:
            raise RuntimeError(f"{self.name}: call fit() (or load a saved model) before predict()")
        if not 1 <= horizon <= self.horizon_max:
            raise ValueError(f"{self.name}: horizon must be in 1..{self.horizon_max} (horizon_max), got {horizon}")

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        """Forecast the ``horizon`` intervals after the last row of ``history``."""
        return self.predict_many(history, [len(history) - 1], horizon)[0]

    def predict_many(
        self, table: pd.DataFrame, origins: Sequence[int] | np.ndarray, horizon: int
    ) -> list[Forecast]:
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
        raw = np.stack([self._boosters[_quantile_key(q)].predict(X) for q in self.quantiles])
        levels = last[None, :, None] + c * raw.reshape(len(self.quantiles), len(idx), horizon)
        if self.round_to_instances:
            levels = np.rint(levels)  # undoes the training jitter: round(Q_{Y+U}(a)) = Q_Y(a)
        levels = np.clip(np.sort(levels, axis=0), 0.0, c)
        prob = np.clip(self._boosters[_PREEMPT].predict(X).reshape(len(idx), horizon), 0.0, 1.0)
        median = self.quantiles.index(0.5)
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
        }

    @classmethod
    def _from_document(cls, doc: Mapping[str, Any], texts: Mapping[str, str]) -> LightGbmForecaster:
        if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
            raise ValueError(
                f"not a saved {_FORMAT} v{_VERSION}: format={doc.get('format')!r}, version={doc.get('version')!r}"
            )
        model = cls(**doc["params"])
        if tuple(doc["feature_names"]) != model.feature_names:
            raise ValueError(
                "saved model uses a different feature set than forecasting.features now builds; retrain it"
            )
        model._boosters = {k: lgb.Booster(model_str=texts[k]) for k in doc["models"]}
        model.models = dict(model._boosters)
        model.n_train_rows = int(doc.get("n_train_rows", 0))
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
