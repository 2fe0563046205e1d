"""The runtime profile: the trainer's own iteration time per (D, P) and its migration costs, as the liveput planner
takes them (a `ThroughputProfile`, calibrated `CostConstants` and the runtime's `ModelSpec`).

Owns: `RuntimeProfile` and its JSON form (`to_json` / `load`, errors naming the file and the field), the runtime's
model spec (`RuntimeModelSpec`, `runtime_spec`), `ProfileError`. A planner input only: it runs nothing, so the
planner (`trainer.control.planning`) can read a profile without importing the driver. Must not touch: measuring
(`trainer.control.measure`: the job that produces a profile), fitting (`trainer.observe.calibration`), the cost formulas
(`liveput.migration.CostModel`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forecasting import jsonio
from liveput import FULL_STOP, CostConstants, CostModel, Layer, ModelSpec, P2PTable, Preparation, ThroughputProfile
from trainer.jsonfile import load_json

FORMAT = "parcae-runtime-profile"
VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot be measured or fitted (too few workers, a migration kind missing, a failed job)."""


class ProfileFormatError(ProfileError):
    """A profile file that cannot be read; the message names the file and the field."""


# ------------------------------------------------------------------------------------------------ model spec


@dataclass(frozen=True)
class RuntimeModelSpec(ModelSpec):
    """A `ModelSpec` whose migratable bytes per parameter follow the runtime's dtype (`ModelSpec` assumes fp32):
    weights plus AdamW's two moments, all of `param_bytes` each."""

    param_bytes: int = 4

    @property
    def bytes_per_param(self) -> int:
        return self.param_bytes * (1 + self.optim_states)


def runtime_spec(model: Any, micro_batch: int = 2) -> RuntimeModelSpec:
    """The liveput spec of a trainer model (a `ModelConfig` or a registered name): its layers' parameter counts,
    counted on the layers themselves (`trainer.runtime.migration.layer_sizes`)."""
    from trainer.config import model_config
    from trainer.runtime.migration import layer_sizes
    from trainer.runtime.model import layer_names, spec_of
    from trainer.runtime.trainspec import shape_profile

    cfg = model_config(model) if isinstance(model, str) else model
    params = layer_sizes(cfg).params
    shapes = shape_profile(spec_of(cfg), cfg.seed)
    return RuntimeModelSpec(
        name=cfg.name, layers=tuple(Layer(n, int(p)) for n, p in zip(layer_names(cfg), params)), optim_states=2,
        micro_batch=micro_batch, seq_len=1, hidden=shapes.activation_per_row,
        source=f"trainer model {cfg.name} ({shapes.param_bytes}-byte parameters): parameters counted per layer",
        param_bytes=shapes.param_bytes,
    )  # fmt: skip


def max_stages(n_layers: int) -> int:
    """The largest P the cost model can cut `n_layers` into (the reference rule needs P <= layers - 1).

    The cost model cuts stages with the reference's rule (`liveput.model_spec`: the embedding rides with the first
    chunk, P <= layers - 1), the trainer balances them by parameter count (`trainer.runtime.pipeline.partition`), so
    a profile stops at P = layers - 1 and the formulas price slightly different stages than the ones measured; the
    fitted constants absorb the difference (`measured["fit"]` shows each pause next to the model).
    """
    return max(1, n_layers - 1)


# ------------------------------------------------------------------------------------------------ the profile


@dataclass(frozen=True)
class RuntimeProfile:
    """What `parcae profile` measured on this machine: the planner's two inputs and the raw measurements behind them.

    `throughput`: iteration ms per (D, P) at the trainer's global batch. `constants`: the cost model's constants,
    calibrated (see the module docstring). `spec`: the runtime model as the cost model sees it. `measured`: the raw
    numbers (per strategy step times, per migration kind pauses / bytes / phases, the fit, the machine). Feed
    `throughput` and `cost_model()` to `liveput.scenarios.ScenarioStore`.
    """

    throughput: ThroughputProfile
    constants: CostConstants
    spec: ModelSpec
    measured: Mapping[str, Any] = field(compare=False)
    created: str = ""
    command: str = ""

    def cost_model(self, preparation: Preparation = FULL_STOP) -> CostModel:
        return CostModel(self.spec, self.constants, preparation)

    def preparation(self, notice_s: float) -> Preparation:
        """This runtime's `Preparation` under a cloud's `notice_s`: every trigger it prepares, with the slowdown
        `parcae profile` measured (`measured.prepared.slowdown`). A profile without that measurement (written by an
        older parcae) raises `ProfileFormatError` naming the field."""
        prepared = self.measured.get("prepared")
        slowdown = prepared.get("slowdown") if isinstance(prepared, Mapping) else None
        if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not 0.0 <= slowdown <= 1.0:
            raise ProfileFormatError(
                "field 'measured.prepared.slowdown' is missing or not in [0, 1] (not measured, "
                "or by an older parcae): measure the profile again with `parcae profile`"
            )
        return Preparation(notice_s=notice_s, slowdown=float(slowdown))

    @property
    def device_type(self) -> str:
        """The kind of device the profile's workers trained on ("cpu", "cuda"); a profile that does not say was
        measured on the CPU (`parcae profile` had no --device before it said)."""
        job = self.measured.get("job")
        kind = job.get("device_type") if isinstance(job, Mapping) else None
        return kind if isinstance(kind, str) else "cpu"

    def stage_costs(self) -> tuple[float, ...]:
        """The per-layer milliseconds `parcae profile` measured (`measured.layer_ms`, `trainer.observe.layer_times`),
        which its job's stages were cut by: a job planning with this profile cuts its stages alike
        (`TrainConfig.stage_costs`). A profile without them (written by an older parcae) raises
        `ProfileFormatError` naming the field."""
        ms = self.measured.get("layer_ms")
        ok = (
            isinstance(ms, list)
            and len(ms) == len(self.spec.layers)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in ms)
        )
        if not ok:
            raise ProfileFormatError(
                f"field 'measured.layer_ms' is missing or not one time >= 0 for each of the {len(self.spec.layers)} "
                "layers (not measured, or by an older parcae): measure the profile again with `parcae profile`"
            )
        return tuple(float(v) for v in ms)  # type: ignore[union-attr]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "created": self.created, "command": self.command,
            "throughput": self.throughput.to_dict(), "constants": _constants_to_dict(self.constants),
            "spec": _spec_to_dict(self.spec), "measured": self.measured,
        }  # fmt: skip

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        text = jsonio.dumps_strict(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, data: Any, where: str = "<profile>") -> RuntimeProfile:
        r = _Reader(where)
        if not isinstance(data, Mapping):
            raise ProfileFormatError(f"{where}: expected a JSON object (a parcae runtime profile), "
                                     f"got {type(data).__name__}")  # fmt: skip
        fmt = data.get("format")
        if fmt != FORMAT:
            raise ProfileFormatError(f"{where}: field 'format': expected {FORMAT!r}, got {fmt!r} — not a profile "
                                     "written by `parcae profile`")  # fmt: skip
        version = r.get(data, "version", int)
        if version != VERSION:
            raise ProfileFormatError(f"{where}: field 'version': this parcae reads version {VERSION}, got {version}")
        try:
            throughput = ThroughputProfile.from_dict(r.get(data, "throughput", Mapping))
        except (ValueError, TypeError, AttributeError) as e:
            raise ProfileFormatError(f"{where}: field 'throughput': {e}") from None
        return cls(
            throughput=throughput, constants=_constants_from_dict(r, r.get(data, "constants", Mapping)),
            spec=_spec_from_dict(r, r.get(data, "spec", Mapping)), measured=dict(r.get(data, "measured", Mapping)),
            created=str(data.get("created", "")), command=str(data.get("command", "")),
        )  # fmt: skip

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuntimeProfile:
        """Read a profile written by `to_json`; a missing, malformed or foreign file raises `ProfileFormatError`
        naming the file and the field."""
        expected = "expected a runtime profile written by `parcae profile`"
        not_json = "not JSON ({reason} at line {line} column {column})"
        data = load_json(path, ProfileFormatError, "the profile", expected, not_json)
        return cls.from_dict(data, str(Path(path)))


class _Reader:
    """Typed field access with errors naming the file and the dotted field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def get(self, d: Mapping[str, Any], key: str, kind: Any, path: str = "") -> Any:
        name = f"{path}.{key}" if path else key
        if key not in d:
            raise ProfileFormatError(f"{self.where}: field {name!r} is missing")
        v = d[key]
        if kind is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        elif kind is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, kind)
        if not ok:
            want = {Mapping: "an object", list: "an array", str: "a string", int: "an integer"}.get(kind, "a number")
            raise ProfileFormatError(f"{self.where}: field {name!r}: expected {want}, got {json.dumps(v)[:60]}")
        return v


_CONST_NUMBERS = ("rendezvous_ms", "extra_restart_ms", "proc_ms", "group_base_ms", "group_add_ms", "group_remove_ms",
                  "replica_add_factor", "checkpoint_ms")  # fmt: skip


def _constants_to_dict(c: CostConstants) -> dict[str, Any]:
    return {
        **{k: getattr(c, k) for k in _CONST_NUMBERS}, "group_mode": c.group_mode,
        "replica_steps": [[int(d), float(ms)] for d, ms in c.replica_steps],
        "build_ms": {str(p): float(ms) for p, ms in sorted(c.build_ms.items())},
        "p2p": {"points": [[int(b), float(us)] for b, us in c.p2p.points], "source": c.p2p.source},
        "source": c.source,
    }  # fmt: skip


def _constants_from_dict(r: _Reader, d: Mapping[str, Any]) -> CostConstants:
    values = {k: float(r.get(d, k, float, "constants")) for k in _CONST_NUMBERS}
    mode = r.get(d, "group_mode", str, "constants")
    if mode not in ("groups", "instances", "replicas"):
        raise ProfileFormatError(f"{r.where}: field 'constants.group_mode': expected groups, instances or replicas, "
                                 f"got {mode!r}")  # fmt: skip
    build: dict[int, float] = {}
    for k, v in r.get(d, "build_ms", Mapping, "constants").items():
        if not k.isdigit() or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProfileFormatError(f"{r.where}: field 'constants.build_ms': expected {{\"P\": ms}}, got "
                                     f"{json.dumps(k)}: {json.dumps(v)}")  # fmt: skip
        build[int(k)] = float(v)
    steps = r.get(d, "replica_steps", list, "constants")
    p2p = r.get(d, "p2p", Mapping, "constants")
    points = r.get(p2p, "points", list, "constants.p2p")
    try:
        replica_steps = tuple((int(a), float(b)) for a, b in steps)
        table = P2PTable(tuple((int(b), float(us)) for b, us in points), str(p2p.get("source", "")))
    except (TypeError, ValueError) as e:
        raise ProfileFormatError(f"{r.where}: field 'constants.replica_steps' or 'constants.p2p.points': {e}") from None
    return CostConstants(**values, group_mode=mode, replica_steps=replica_steps, build_ms=build, p2p=table,
                         source=str(d.get("source", "")))  # fmt: skip


def _spec_to_dict(s: ModelSpec) -> dict[str, Any]:
    return {
        "name": s.name, "optim_states": s.optim_states, "micro_batch": s.micro_batch, "seq_len": s.seq_len,
        "hidden": s.hidden, "param_bytes": getattr(s, "param_bytes", 4), "source": s.source,
        "layers": [{"name": layer.name, "params": layer.params} for layer in s.layers],
    }  # fmt: skip


def _spec_from_dict(r: _Reader, d: Mapping[str, Any]) -> RuntimeModelSpec:
    layers = []
    for i, item in enumerate(r.get(d, "layers", list, "spec")):
        if not isinstance(item, Mapping):
            raise ProfileFormatError(f"{r.where}: field 'spec.layers[{i}]': expected an object {{name, params}}")
        layers.append(Layer(str(r.get(item, "name", str, f"spec.layers[{i}]")),
                            int(r.get(item, "params", int, f"spec.layers[{i}]"))))  # fmt: skip
    if not layers:
        raise ProfileFormatError(f"{r.where}: field 'spec.layers' is empty")
    return RuntimeModelSpec(
        name=r.get(d, "name", str, "spec"), layers=tuple(layers), optim_states=r.get(d, "optim_states", int, "spec"),
        micro_batch=int(d.get("micro_batch", 1)), seq_len=int(d.get("seq_len", 0)), hidden=int(d.get("hidden", 0)),
        source=str(d.get("source", "")), param_bytes=r.get(d, "param_bytes", int, "spec"),
    )  # fmt: skip
