"""The training spec: what a user hands parcae to train their own model — and the loader and checks of one.

Owns: `TrainSpec` and `Layer` (the contract users write against, re-exported as `parcae.TrainSpec` /
`parcae.Layer`), `load_spec` (a `ModelConfig` -> its spec: a registered name, a ``parcae.models`` entry point or a
``module:function`` path, called with the config's args), `check_spec` (everything that can be checked before a
process starts) and the spec's `fingerprint` (part of a job's identity). Must not touch: torch.distributed,
processes, files.

What the runtime relies on, and why each rule exists:

* **layers are ordered, named factories**: any stage can build any layer, so a migration moves a layer by
  building it on the receiver and installing the sender's state. parcae seeds torch's generator per layer
  (`layer_seed`) before calling the factory, so a layer's initial weights do not depend on
  which stage builds it. A factory must build a new module each call, and no parameter may be shared between
  layers (tied weights would couple two stages' optimisers).
* **`batch(step)` is the global batch of a step, a pure function of the step**: any D x P split of it, and any
  sequence of strategies across migrations, sees the same data. Inputs and targets are a tensor or a tuple of
  tensors whose leading dimension is the row count, the same at every step (the global batch B).
* **`loss(outputs, targets)` is a SUM over the rows given**: parcae divides by B, so the gradients summed over
  micro-batches and replicas are exactly the gradient of the mean loss over the global batch, whatever the split.
* **`optimizer(params)` is called once per layer** (that has parameters): a layer's optimiser state moves with
  the layer.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Union, cast

import torch
import torch.nn as nn

from trainer.config import (
    MODELS,
    JobConfig,
    ModelConfig,
    TrainConfig,
    UnknownModelError,
    installed_models,
    model_entry,
)
from trainer.runtime.loss_scale import LossScaling
from trainer.runtime.spec_model import run_layer
from trainer.runtime.validation import Validation, metric_sum

if TYPE_CHECKING:
    from typing import TypeAlias

#: A batch side, an activation or an output: a tensor, or a tuple of tensors with one leading (row) dimension.
Tree: TypeAlias = Union[torch.Tensor, tuple[torch.Tensor, ...]]  # noqa: UP007 — evaluated on 3.11 by dataclasses

log = logging.getLogger(__name__)

NORMALIZERS = ("rows", "count")
AUTOCASTS = ("bfloat16", "float16")
LAYER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class SpecError(ValueError):
    """A training spec that cannot train: the message names the spec, the layer (where there is one) and the fix."""


@dataclass(frozen=True)
class Layer:
    """One layer of a `TrainSpec`: a name (unique; checkpoints and migrations key layers by it), a factory that
    builds the module, and optionally its `cost` (e.g. measured time or FLOPs), which the stage cut balances instead
    of parameter counts when every layer has one."""

    name: str
    build: Callable[[], nn.Module]
    cost: float | None = None


@dataclass(frozen=True)
class TrainSpec:
    """A model and its training, in the form parcae can cut into stages and live-migrate.

    `layers`: the ordered `Layer`s; `batch(step)`: the global batch of `step` as (inputs, targets); `loss(outputs,
    targets)`: the SUM of the rows' losses (a scalar); `optimizer(params)`: the optimiser of one layer (a layer without
    parameters gets none). Optional: `lr(step)`: the learning rate of `step` (set on every layer's optimiser before it
    steps: a schedule that is a function of the step has no state to migrate); `clip_grad_norm`: clip gradients to this
    global L2 norm; `exact` (default True): refuse dropout, whose masks would make a run depend on D x P (False allows
    it, and the run is then only statistically the same under another strategy); `normalizer`: "rows" (the loss is a
    mean over the global batch's rows) or "count" (`loss` returns (sum, count) — e.g. the non-padding tokens — and the
    loss is the global sum over the global count, whatever the split); `autocast`: "bfloat16" or "float16" runs each
    stage's forward and the loss under `torch.autocast` (parameters, gradients and optimiser state stay in their dtype;
    activations cross stages in the autocast dtype); `loss_scaling`: a `parcae.LossScaling` (the loss multiplied
    before the backward, the gradients divided after it, a step that overflowed skipped by every rank), None (none),
    or "auto" (the default: `LossScaling()` under float16 autocast, where small gradients would round to zero, and
    none otherwise); `prefetch` (default True): a worker loads its rows of the next step in a helper thread while
    it trains this one (`batch` is then called from that thread, never twice at once; False: on the thread that
    trains, before each step); `validation`: a `parcae.Validation` — held-out batches whose mean loss (and the
    validation's own metrics) is measured every `every` steps and at the end, whatever the strategy (none by
    default).
    """

    layers: Sequence[Layer]
    batch: Callable[[int], tuple[Any, Any]]  # (inputs, targets), each a Tree
    loss: Callable[[Any, Any], torch.Tensor]  # (outputs, targets) -> a scalar
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    lr: Callable[[int], float] | None = None
    clip_grad_norm: float | None = None
    exact: bool = True
    normalizer: str = "rows"
    autocast: str | None = None
    loss_scaling: LossScaling | str | None = "auto"
    prefetch: bool = True
    validation: Validation | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))

    @property
    def scaling(self) -> LossScaling | None:
        """The loss scaling the job applies ("auto" resolved)."""
        if self.loss_scaling == "auto":
            return LossScaling() if self.autocast == "float16" else None
        return self.loss_scaling if isinstance(self.loss_scaling, LossScaling) else None

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]


# ------------------------------------------------------------------------------------------------ loading


def resolve(name: str) -> tuple[str, dict[str, Any]]:
    """The ``module:function`` path of model `name` and its default args: a registered name (`MODELS`), an entry
    point of an installed package, or the path itself."""
    entry = model_entry(name)
    if entry is not None:
        return entry.entry, dict(entry.args)
    if ":" in name:
        return name, {}
    installed = installed_models()
    if name in installed:
        return installed[name], {}
    known = sorted({*MODELS, *installed})
    raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(known)}, or give module:function")


def _import_function(path: str, where: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SpecError(f"{where}: {path!r} is not module:function; give e.g. mypkg.train:spec")
    try:
        module = _import_file(module_name) if module_name.endswith(".py") else _import_module(module_name)
    except FileNotFoundError:
        raise SpecError(f"{where}: no such file {module_name!r}; give the path of the spec's file (relative to "
                        "the folder the job runs in) or an importable module name") from None  # fmt: skip
    except ImportError as exc:
        raise SpecError(f"{where}: cannot import module {module_name!r} ({exc}); make it importable where the job "
                        "runs (run from the folder that holds it, pip install it, or add its folder to PYTHONPATH)"
                        ) from None  # fmt: skip
    except Exception as exc:  # noqa: BLE001 — the user's module failed while it ran: say where, whatever it raised
        raise SpecError(f"{where}: importing {module_name!r} raised {type(exc).__name__}: {exc}; fix the "
                        "module") from None  # fmt: skip
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise SpecError(f"{where}: module {module_name!r} has no {attr!r}; define it, or fix the name after ':'")
        fn = getattr(fn, part)
    if not callable(fn):
        raise SpecError(f"{where}: {path!r} is a {type(fn).__name__}, not a function; point at a function that "
                        "returns a parcae.TrainSpec")  # fmt: skip
    return cast(Callable[..., Any], fn)


def _import_module(name: str) -> Any:
    """A spec's module by name: installed, on PYTHONPATH, or in the folder the job runs in — where a spec's file is
    looked for too, and where `python -m`, uvicorn or celery find a user's module. That folder is appended to the
    path, so a module there never shadows an installed one of the same name."""
    import os
    import sys

    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    return importlib.import_module(name)


#: Held while a spec file runs: two jobs of one process (threads) that load one file get its whole module, never the
#: half-run one that sys.modules holds meanwhile ("has no 'spec'" was seen with two fleet jobs in one test process).
#: (`importlib.import_module` has such locks of its own; a file imported by path does not.)
_FILE_IMPORT = threading.RLock()


def _import_file(path: str) -> Any:
    """A spec's module given as a file (``path/to/train.py:spec``), imported once under a name of its own."""
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(path)
    name = "parcae_spec_" + hashlib.sha256(str(file).encode()).hexdigest()[:12]
    with _FILE_IMPORT:
        if name in sys.modules:
            return sys.modules[name]
        found = importlib.util.spec_from_file_location(name, file)
        assert found is not None and found.loader is not None  # a .py file always has a source loader
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        try:
            found.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


@functools.lru_cache(maxsize=64)
def _function(name: str) -> tuple[str, dict[str, Any], Callable[..., Any], bool]:
    """Model `name`'s ``module:function`` path, default args, the function, and whether it takes `train`."""
    path, defaults = resolve(name)
    fn = _import_function(path, f"model {name!r}")
    try:
        takes_train = "train" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: it takes no `train`
        takes_train = False
    return path, defaults, fn, takes_train


def load_spec(model: ModelConfig, train: TrainConfig | None = None) -> TrainSpec:
    """The spec of `model`: its function called with the config's args (and `train=` — the job's `TrainConfig` —
    when the function takes it, as the built-in GPTs do to read the batch size, learning rate and data seed).

    Cached per process by what the function sees: every caller in a worker gets the same spec object (its batch
    function, its loss), and a function without `train` is called once whatever `train` the caller has.
    """
    takes_train = _function(model.name)[3]
    return _call(model, (train if train is not None else TrainConfig()) if takes_train else None)


def clear_cache() -> None:
    """Forget the specs this process loaded (a spec's module changed since: it is imported and called afresh)."""
    _call.cache_clear()
    _function.cache_clear()
    _checked.cache_clear()


@functools.lru_cache(maxsize=16)
def _call(model: ModelConfig, train: TrainConfig | None) -> TrainSpec:
    where = f"model {model.name!r}"
    path, defaults, fn, _ = _function(model.name)
    kwargs = {**defaults, **model.args}
    if train is not None:
        kwargs["train"] = train
    try:
        spec = fn(**kwargs)
    except SpecError as exc:  # the spec function's own message, already naming the fix
        raise SpecError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise SpecError(f"{where}: calling {path}(**{model.args!r}) failed: {exc}; give the arguments it takes in "
                        "--model-args (model.args)") from None  # fmt: skip
    except (ValueError, KeyError) as exc:
        raise SpecError(f"{where}: {path} refused its arguments {model.args!r}: {exc}; fix --model-args") from None
    except Exception as exc:  # noqa: BLE001 — a user's function (a missing data file, ...): name it, no traceback
        raise SpecError(f"{where}: {path}(**{model.args!r}) raised {type(exc).__name__}: {exc}; fix the spec "
                        "function or its arguments") from None  # fmt: skip
    if not isinstance(spec, TrainSpec):
        raise SpecError(f"{where}: {path} returned a {type(spec).__name__}, not a parcae.TrainSpec; return "
                        "parcae.TrainSpec(layers=..., batch=..., loss=..., optimizer=...)")  # fmt: skip
    _check_fields(spec, where)
    return spec


def _check_fields(spec: TrainSpec, where: str) -> None:
    if not spec.layers:
        raise SpecError(f"{where}: the spec has no layers; give at least one parcae.Layer")
    seen: set[str] = set()
    for i, layer in enumerate(spec.layers):
        if not isinstance(layer, Layer):
            raise SpecError(f"{where}: layers[{i}] is a {type(layer).__name__}, not a parcae.Layer; wrap it: "
                            "parcae.Layer(name, factory)")  # fmt: skip
        if not isinstance(layer.name, str) or not LAYER_NAME.match(layer.name):
            raise SpecError(f"{where}: layers[{i}] has the name {layer.name!r}; use letters, digits, '_', '.', '-'")
        if layer.name in seen:
            raise SpecError(f"{where}: two layers are named {layer.name!r}; give every layer its own name")
        seen.add(layer.name)
        if layer.cost is not None and not (
            isinstance(layer.cost, (int, float)) and not isinstance(layer.cost, bool) and layer.cost > 0
        ):
            raise SpecError(f"{where}: layer {layer.name!r}: cost {layer.cost!r} must be a positive number")
        if not callable(layer.build):
            raise SpecError(f"{where}: layer {layer.name!r}: its factory is a {type(layer.build).__name__}, not "
                            "callable; give a function that builds the module (lambda: nn.Linear(8, 8))")  # fmt: skip
    hinted = [layer.cost is not None for layer in spec.layers]
    if any(hinted) and not all(hinted):
        missing = [layer.name for layer in spec.layers if layer.cost is None]
        raise SpecError(f"{where}: layers {missing[:3]} have no cost while others do; give every layer a cost, or "
                        "none (the cut then balances parameter counts)")  # fmt: skip
    for name in ("batch", "loss", "optimizer"):
        if not callable(getattr(spec, name)):
            raise SpecError(f"{where}: the spec's {name} is not callable; give a function")
    if spec.autocast is not None and spec.autocast not in AUTOCASTS:
        raise SpecError(f"{where}: autocast {spec.autocast!r}; choose one of {', '.join(AUTOCASTS)}, or None")
    if not (spec.loss_scaling in ("auto", None) or isinstance(spec.loss_scaling, LossScaling)):
        raise SpecError(f'{where}: loss_scaling {spec.loss_scaling!r}; give a parcae.LossScaling, None or "auto"')
    if isinstance(spec.loss_scaling, LossScaling) and spec.loss_scaling.problems():
        raise SpecError(f"{where}: loss_scaling: {'; '.join(spec.loss_scaling.problems())}")
    if spec.validation is not None and not isinstance(spec.validation, Validation):
        raise SpecError(f"{where}: validation is a {type(spec.validation).__name__}; give a "
                        "parcae.Validation(batch=..., batches=..., every=...) or None")  # fmt: skip
    if spec.validation is not None and spec.validation.problems():
        raise SpecError(f"{where}: validation: {'; '.join(spec.validation.problems())}")
    if spec.normalizer not in NORMALIZERS:
        raise SpecError(f"{where}: normalizer {spec.normalizer!r}; choose one of {', '.join(NORMALIZERS)}")
    if spec.lr is not None and not callable(spec.lr):
        raise SpecError(f"{where}: the spec's lr is not callable; give lr=lambda step: ... or leave it out")
    if spec.clip_grad_norm is not None and not (
        isinstance(spec.clip_grad_norm, (int, float)) and spec.clip_grad_norm > 0
    ):
        raise SpecError(f"{where}: clip_grad_norm {spec.clip_grad_norm!r} must be a positive number or None")


# ------------------------------------------------------------------------------------------------ trees


def leaves(tree: Any) -> tuple[torch.Tensor, ...]:
    """The tensors of a tensor-or-tuple."""
    return tree if isinstance(tree, tuple) else (tree,)


def rebuild(like: Any, tensors: Sequence[torch.Tensor]) -> Tree:
    """`tensors` in the form of `like` (a tensor or a tuple)."""
    return tuple(tensors) if isinstance(like, tuple) else tensors[0]


def is_tree(x: Any) -> bool:
    return torch.is_tensor(x) or (isinstance(x, tuple) and len(x) > 0 and all(torch.is_tensor(t) for t in x))


def rows(tree: Tree) -> int:
    """The leading dimension shared by every tensor of `tree` (ValueError when they disagree or have none)."""
    sizes = {t.shape[0] if t.dim() else None for t in leaves(tree)}
    if None in sizes or len(sizes) != 1:
        raise ValueError(f"tensors with leading dimensions {sorted(map(str, sizes))}: every tensor needs the same "
                         "number of rows")  # fmt: skip
    return int(next(iter(sizes)))  # type: ignore[arg-type]


def to_device(tree: Any, device: torch.device | str) -> Any:
    """A tensor or tuple of tensors on `device` (the same tensors where they are there already; "meta": shapes only)."""
    return rebuild(tree, [t.to(device) for t in leaves(tree)])


# ------------------------------------------------------------------------------------------------ checks


@dataclass(frozen=True)
class SpecSummary:
    """What `check_spec` learnt: the global batch B (rows per step) and the layer names."""

    global_batch: int
    names: tuple[str, ...]


def stable_seed(tag: str, seed: int, index: int) -> int:
    """A 63-bit seed for (tag, seed, index), the same in every process (Python's hash() is salted per process): a
    layer's initial weights ("layer"), an epoch's order of a dataset ("epoch"), a step's corpus batch ("batch")."""
    digest = hashlib.sha256(f"{tag}:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def layer_seed(seed: int, index: int) -> int:
    """Stable seed of layer `index` (independent of process, stage cut and build order)."""
    return stable_seed("layer", seed, index)


def seeded_build(spec: TrainSpec, seed: int, index: int, device: torch.device | str | None = None) -> nn.Module:
    """Layer `index`, built with torch's generator seeded by (seed, index) (on `device`, e.g. "meta")."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(layer_seed(seed, index))
        if device is None:
            module = spec.layers[index].build()
        else:
            with torch.device(device):
                module = spec.layers[index].build()
    return module


def _built(spec: TrainSpec, index: int, where: str, device: str | None) -> nn.Module:
    name = spec.layers[index].name
    try:
        module = seeded_build(spec, 0, index, device)
    except Exception as exc:  # noqa: BLE001 — a user's factory: report which layer, whatever it raised
        raise SpecError(f"{where}: layer {name!r}: its factory raised {type(exc).__name__}: {exc}; fix the "
                        "factory") from None  # fmt: skip
    if not isinstance(module, nn.Module):
        raise SpecError(f"{where}: layer {name!r}: its factory returned a {type(module).__name__}, not an "
                        "nn.Module; return the module")  # fmt: skip
    return module


def fingerprint(spec: TrainSpec) -> str:
    """sha256 over the layers' names and their parameters' and buffers' names, shapes and dtypes, built on the
    `meta` device (no memory, no init cost): a worker or a checkpoint of another spec has another fingerprint."""
    h = hashlib.sha256()
    for i, layer in enumerate(spec.layers):
        module = seeded_build(spec, 0, i, "meta")
        h.update(f"layer:{layer.name}".encode())
        for pname, t in [*module.named_parameters(), *module.named_buffers()]:
            h.update(f"{pname}:{tuple(t.shape)}:{t.dtype}".encode())
    return h.hexdigest()


def check_spec(spec: TrainSpec, where: str, stages: int = 1, global_batch: int | None = None) -> SpecSummary:
    """Everything that can be checked before a process starts, each failure one `SpecError` naming the layer and
    the fix: at least `stages` layers; factories that build a fresh module each call; no parameter shared between
    layers; batches whose row count is the same at steps 0 and 1 for inputs and targets (and `global_batch`, when
    given); every layer's output feeding the next on a sample of the batch; a scalar loss."""
    _check_fields(spec, where)
    n = len(spec.layers)
    if n < stages:
        raise SpecError(f"{where}: {n} layers cannot be cut into P={stages} stages; give at least {stages} layers "
                        f"or use fewer stages")  # fmt: skip
    # Built on `meta` (no memory, no init cost) to see parameter identity: a module made outside the factory, or a
    # tensor two factories share, stays where it was made and is the same object at each call.
    owner: dict[int, str] = {}
    built = [_built(spec, i, where, "meta") for i in range(n)]  # all alive while ids are compared (ids are reused)
    for layer, module in zip(spec.layers, built, strict=True):
        if any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters()):
            raise SpecError(f"{where}: layer {layer.name!r} has lazy parameters, whose shapes come from its first "
                            "input (nn.LazyLinear, nn.LazyConv2d, ...); give their sizes (nn.Linear(in, out)): any "
                            "stage builds a layer and receives its state before it has seen an input")  # fmt: skip
        for p in module.parameters():
            if id(p) in owner and owner[id(p)] != layer.name:
                raise SpecError(f"{where}: layers {owner[id(p)]!r} and {layer.name!r} share a parameter (tied "
                                "weights); untie them: give each layer its own parameter, and if they must stay "
                                "equal, copy the values in the factory instead of sharing the tensor")  # fmt: skip
            owner[id(p)] = layer.name
    for i, (layer, module) in enumerate(zip(spec.layers, built, strict=True)):
        again = _built(spec, i, where, "meta")
        if any(p is q for p in module.parameters() for q in again.parameters()):
            raise SpecError(f"{where}: layer {layer.name!r}: its factory returns the same module each call; build "
                            "a new one inside the factory (lambda: nn.Linear(8, 8), not one made outside)")  # fmt: skip
    if spec.exact:
        for layer, module in zip(spec.layers, built, strict=True):
            _check_exact(module, layer.name, where)
    B = _check_batches(spec, where, global_batch)
    try:
        out, sample = _check_flow(spec, where, "meta")
    except SpecError:
        # an op without a meta kernel fails there but may work: the CPU run (two rows) says which it is
        out, sample = _check_flow(spec, where, None)
    _check_sum(spec, where, out, sample)
    if spec.validation is not None:
        _check_validation(spec, spec.validation, where)
    return SpecSummary(global_batch=B, names=tuple(spec.names))


def _check_exact(module: nn.Module, name: str, where: str) -> None:
    """No training-time randomness: dropout modules and attention dropout with p > 0."""
    for sub_name, sub in module.named_modules():
        p = sub.p if isinstance(sub, nn.modules.dropout._DropoutNd) else getattr(sub, "dropout", 0.0)
        if isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0:
            at = f"{type(sub).__name__} {sub_name!r}" if sub_name else type(sub).__name__
            raise SpecError(f"{where}: layer {name!r} has dropout p={p} ({at}): its masks would make the run depend "
                            "on D x P; set it to 0, or give TrainSpec(exact=False) to accept runs that differ "
                            "between strategies")  # fmt: skip


def _batch(spec: TrainSpec, step: int, where: str, fn: str = "batch") -> tuple[Tree, Tree]:
    """`fn(step)` of the spec: its training batch ("batch") or a validation batch ("validation.batch")."""
    function = spec.batch if fn == "batch" else cast(Validation, spec.validation).batch
    try:
        out = function(step)
    except Exception as exc:  # noqa: BLE001 — a user's function: name it, whatever it raised
        raise SpecError(f"{where}: {fn}({step}) raised {type(exc).__name__}: {exc}; fix the {fn} function") from None
    if not (isinstance(out, tuple) and len(out) == 2 and is_tree(out[0]) and is_tree(out[1])):
        raise SpecError(f"{where}: {fn}({step}) must return (inputs, targets), each a tensor or a tuple of tensors; "
                        f"it returned a {type(out).__name__}")  # fmt: skip
    return out


def _check_validation(spec: TrainSpec, validation: Validation, where: str) -> None:
    """Its first and last batches: (inputs, targets) with the same rows, the first through every layer (on `meta`,
    else two rows on the CPU) and the loss."""
    for i in sorted({0, validation.batches - 1}):
        x, y = _batch(spec, i, where, "validation.batch")
        try:
            n = {rows(x), rows(y)}
        except ValueError as exc:
            raise SpecError(f"{where}: validation.batch({i}): {exc}; give every tensor the batch's rows as its first "
                            "dimension") from None  # fmt: skip
        if len(n) != 1:
            raise SpecError(f"{where}: validation.batch({i}) has {rows(x)} rows of inputs and {rows(y)} of targets; "
                            "give both the same rows")  # fmt: skip
        if n == {0}:
            raise SpecError(f"{where}: validation.batch({i}) has no rows; give every validation batch at least one")
    try:
        out, sample = _check_flow(spec, where, "meta", "validation.batch")
    except SpecError:
        out, sample = _check_flow(spec, where, None, "validation.batch")
    if validation.metrics:
        _check_metrics(validation, where, out, sample)


def _check_metrics(validation: Validation, where: str, out: Any, y: Any) -> None:
    """Each metric, on made-up outputs of the last layer's shapes (seeded, on the host) and validation.batch(0)'s
    targets, returns one number, a SUM over the rows (as the loss: parcae adds it over micro-batches and replicas).
    Not where those outputs would take more than the loss's check makes up (`SUM_CHECK_MAX_BYTES`): said in the
    log."""
    size = sum(t.numel() * t.element_size() for t in leaves(out))
    if size > SUM_CHECK_MAX_BYTES:
        if validation.metrics:
            log.warning("%s: the check of the validation metrics is skipped: the last layer's output on "
                        "validation.batch(0) takes %.0f MiB (the check makes up at most %.0f MiB)", where,
                        size / 2**20, SUM_CHECK_MAX_BYTES / 2**20)  # fmt: skip
        return
    made = _made_up(out)
    parts = [slice(0, rows(made)), *((slice(0, 1), slice(1, 2)) if rows(made) == 2 else ())]
    for name, fn in validation.metrics.items():
        try:
            with torch.no_grad():
                values = [fn(rebuild(made, [t[p] for t in leaves(made)]), rebuild(y, [t[p] for t in leaves(y)]))
                          for p in parts]  # fmt: skip
        except Exception as exc:  # noqa: BLE001 — a user's metric: name it
            raise SpecError(f"{where}: validation metric {name!r} raised {type(exc).__name__}: {exc} on the outputs "
                            "of validation.batch(0)'s rows; make it a function of (outputs, targets) returning their "
                            "sum over the rows") from None  # fmt: skip
        try:
            both, *rest = [metric_sum(v, name) for v in values]
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        finite = all(map(math.isfinite, (both, *rest)))
        if rest and finite and not math.isclose(both, sum(rest), rel_tol=0.05, abs_tol=1e-9):
            raise SpecError(f"{where}: validation metric {name!r} must be a SUM over the rows (parcae adds it over "
                            f"micro-batches and divides by the rows itself): on two rows it is {both:.6g}, on each "
                            f"alone {rest[0]:.6g} and {rest[1]:.6g}; return .sum(), not .mean()")  # fmt: skip


def _check_batches(spec: TrainSpec, where: str, global_batch: int | None) -> int:
    counts = []
    for step in (0, 1):
        x, y = _batch(spec, step, where)
        for side, tree in (("inputs", x), ("targets", y)):
            try:
                counts.append((step, side, rows(tree)))
            except ValueError as exc:
                raise SpecError(f"{where}: batch({step}) {side}: {exc}; give every tensor the batch's rows as its "
                                "first dimension") from None  # fmt: skip
    distinct = {c for _, _, c in counts}
    if len(distinct) != 1:
        shown = ", ".join(f"batch({s}) {side}: {c} rows" for s, side, c in counts)
        raise SpecError(f"{where}: the global batch must have the same rows for inputs and targets at every step "
                        f"({shown}); return the same number of rows every step")  # fmt: skip
    B = distinct.pop()
    _need_rows(B, global_batch, where)
    return B


def _need_rows(B: int, global_batch: int | None, where: str) -> None:
    if global_batch is not None and global_batch != B:
        raise SpecError(f"{where}: batch() returns {B} rows but train.global_batch is {global_batch}; set "
                        f"--global-batch {B} (or leave it out), or change the spec's batch size")  # fmt: skip


def _check_flow(spec: TrainSpec, where: str, device: str | None, fn: str = "batch") -> tuple[Any, Any]:
    """Run a two-row sample of `fn(0)` (`_batch`) through every layer (built on `device`) and the loss: each output
    must feed the next. Returns the last layer's output (on `device`) and the sample's targets (on the host)."""
    x, y = _batch(spec, 0, where, fn)
    k = min(2, rows(x))
    out: Any = rebuild(x, [t[:k] for t in leaves(x)])
    sample: Any = rebuild(y, [t[:k] for t in leaves(y)])
    targets = to_device(sample, "meta") if device == "meta" else sample
    if device == "meta":
        out = to_device(out, "meta")
    prev = "the batch's inputs" if fn == "batch" else f"{fn}(0)'s inputs"
    with torch.no_grad():
        for i, layer in enumerate(spec.layers):
            module = _built(spec, i, where, device)
            try:
                out = run_layer(module, out)
            except Exception as exc:  # noqa: BLE001 — a user's layer: say which one and from what
                raise SpecError(f"{where}: layer {layer.name!r} cannot take the output of {prev} "
                                f"({_shapes(out)}): {type(exc).__name__}: {exc}; make each layer accept what the "
                                "previous one returns") from None  # fmt: skip
            if not is_tree(out):
                raise SpecError(f"{where}: layer {layer.name!r} returned a {type(out).__name__}; return a tensor or "
                                "a tuple of tensors")  # fmt: skip
            if rows(out) != k:
                raise SpecError(f"{where}: layer {layer.name!r} turned {k} rows into {rows(out)}; keep the rows as "
                                "the first dimension")  # fmt: skip
            prev = f"layer {layer.name!r}"
        try:
            value = spec.loss(out, targets)
        except Exception as exc:  # noqa: BLE001 — a user's loss
            raise SpecError(f"{where}: loss(outputs of {prev}, targets) raised {type(exc).__name__}: {exc}; fix the "
                            "loss") from None  # fmt: skip
    if spec.normalizer == "count":
        if not (isinstance(value, tuple) and len(value) == 2):
            raise SpecError(f"{where}: with normalizer='count' the loss returns (sum, count), got a "
                            f"{type(value).__name__}; return e.g. (losses.sum(), mask.sum())")  # fmt: skip
        value = value[0]
    if not (torch.is_tensor(value) and value.dim() == 0 and value.is_floating_point()):
        shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
        raise SpecError(f"{where}: loss must return a floating-point scalar (the SUM over the rows), got {shape}; "
                        "use reduction='sum'")  # fmt: skip
    return out, sample


#: The most memory the sum-over-rows check of the loss makes up outputs in (two rows of the last layer's output: a
#: language model's logits are rows x sequence x vocabulary; GPT-2's, 2 x 1024 x 50257 float32, are 393 MiB).
SUM_CHECK_MAX_BYTES: Final = 512 * 2**20


def _check_sum(spec: TrainSpec, where: str, out: Any, y: Any) -> None:
    """The loss must be a SUM over the rows it is given: parcae calls it on each micro-batch and adds the results,
    so a mean (or a term counted once per call) would make the loss and the gradients depend on the split — on
    D x P — silently. Checked on two rows of batch(0)'s targets and made-up outputs of the last layer's shapes
    (seeded uniform values): loss(both rows) = loss(first) + loss(second), within 5% (a mean is off by half). `out`:
    the last layer's output on the sample (`_check_flow`), `y`: the sample's targets."""
    if rows(out) < 2 or rows(y) < 2:
        return
    size = sum(t.numel() * t.element_size() for t in leaves(out))
    if size > SUM_CHECK_MAX_BYTES:
        log.warning("%s: the check that the loss is a sum over rows is skipped: two rows of the last layer's output "
                    "take %.0f MiB (the check makes up at most %.0f MiB)", where, size / 2**20,
                    SUM_CHECK_MAX_BYTES / 2**20)  # fmt: skip
        return
    made = _made_up(out)

    def loss(rows: slice) -> list[float]:
        v = spec.loss(rebuild(made, [t[rows] for t in leaves(made)]), rebuild(y, [t[rows] for t in leaves(y)]))
        return [float(x) for x in (v if spec.normalizer == "count" else (v,))]

    with torch.no_grad():
        try:
            both, first, second = loss(slice(0, 2)), loss(slice(0, 1)), loss(slice(1, 2))
        except Exception:  # noqa: BLE001 — the loss of one row is not what this checks (the job's may have more)
            return
    for what, b, f, s in zip(("loss", "count"), both, first, second, strict=False):
        if all(math.isfinite(v) for v in (b, f, s)) and not math.isclose(b, f + s, rel_tol=0.05, abs_tol=1e-9):
            raise SpecError(f"{where}: the {what} must be a SUM over the rows it is given (parcae adds it over "
                            f"micro-batches): on two rows it is {b:.6g}, on each alone {f:.6g} and {s:.6g}; use "
                            "reduction='sum' (parcae divides by the global batch itself)")  # fmt: skip


def _made_up(out: Any) -> Any:
    """Outputs of `out`'s shapes and dtypes on the host, made up (seeded uniform values; integers zero): what the
    checks of the loss and of the metrics call them on (`out` may live on the meta device)."""
    g = torch.Generator().manual_seed(0)
    return rebuild(out, [torch.rand(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point()
                         else torch.zeros(t.shape, dtype=t.dtype) for t in leaves(out)])  # fmt: skip


def _shapes(tree: Any) -> str:
    if is_tree(tree):
        return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in leaves(tree))
    return type(tree).__name__


@dataclass(frozen=True)
class ShapeProfile:
    """What the cost model needs of a spec's shapes: the elements per row of the largest activation between two
    layers (what a pipeline stage sends per row) and the bytes of one parameter element."""

    activation_per_row: int
    param_bytes: int


def shape_profile(spec: TrainSpec, seed: int = 0) -> ShapeProfile:
    """Measured on `meta` tensors: one row of batch(0) through every layer, and the layers' parameter dtypes."""
    x, _ = spec.batch(0)
    out: Any = to_device(rebuild(x, [t[:1] for t in leaves(x)]), "meta")
    most, size = 0, 4
    with torch.no_grad():
        for i in range(len(spec.layers)):
            module = seeded_build(spec, seed, i, "meta")
            size = next((p.element_size() for p in module.parameters()), size)
            out = run_layer(module, out)
            if i < len(spec.layers) - 1:
                most = max(most, sum(t.numel() for t in leaves(out)))
    return ShapeProfile(activation_per_row=most, param_bytes=size)


def check_job(config: JobConfig, *, batch_given: bool = True) -> JobConfig:
    """The job's spec loaded and checked (`check_spec`) before anything starts; returns `config` with
    `train.global_batch` set to the spec's rows when the caller did not give one (`batch_given=False`), and raises
    `SpecError` when a given one disagrees with them."""
    model, train = config.model, config.train
    stages = config.availability.strategy[1] if config.availability.strategy else 1
    # checked once per process and spec: `parcae train` (or the flow's settings check) asks, then `train` itself
    summary = _checked(model, train if _function(model.name)[3] else None, stages)
    costs = len(train.stage_costs)
    if costs and costs != len(summary.names):
        raise SpecError(f"train.stage_costs: {costs} costs for model {model.name!r}, which has {len(summary.names)} "
                        "layers; give one per layer, or measure this model's profile (`parcae profile`)")  # fmt: skip
    if batch_given:
        _need_rows(summary.global_batch, train.global_batch, f"model {model.name!r}")
    elif summary.global_batch != train.global_batch:
        config = config.replace(train={"global_batch": summary.global_batch})
    return config


@functools.lru_cache(maxsize=16)
def _checked(model: ModelConfig, train: TrainConfig | None, stages: int) -> SpecSummary:
    return check_spec(load_spec(model, train), f"model {model.name!r}", stages=stages)
