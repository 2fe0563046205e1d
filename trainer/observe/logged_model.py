"""A job's trained model as an MLflow logged model (MLflow 3's `LoggedModel`), linked to its training run.

Owns: `log_trained_model` — a checkpoint loaded into the spec's own layers (`trainer.runtime.export.trained_model`),
saved with MLflow's PyTorch flavour, logged in the run's experiment with the run as its source, its step and
held-out scores as its params. `mlflow.pytorch.load_model("models:/<model_id>")` gives the module back, and the
model can be registered from the UI like any other. Must not touch: the run's own metrics and artifacts (`tracking`).

Why pickled and not torch.export's "pt2" (MLflow's default): pt2 needs an input example and a model that
torch.export can trace, and a spec's layers may branch on their data. The layer classes of a spec given as a file
(``path/train.py:spec``, imported under a name no other process has) and `SpecModel` itself are pickled by value
(cloudpickle), so the model loads where neither that file nor parcae is; a spec from an installed package, and
parcae's built-in GPTs, are pickled by reference: load them where that package is installed.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import tracking  # noqa: F401  (first: it switches MLflow's telemetry off before MLflow is imported)

import cloudpickle  # noqa: E402
import mlflow.pytorch  # noqa: E402
import torch  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.runtime import spec_model  # noqa: E402
from trainer.runtime.export import Exported, trained_model  # noqa: E402

#: The prefix of the module a spec file is imported as (`trainer.runtime.trainspec._import_file`).
SPEC_FILE_MODULE = "parcae_spec_"


def log_trained_model(
    client: MlflowClient, experiment_id: str, run_id: str, name: str, exported: Exported,
    train: TrainConfig | None = None, scores: Mapping[str, float] | None = None,
) -> str:  # fmt: skip
    """Log `exported` (a checkpoint of the job of run `run_id`) as the logged model `name` ("model": the final layers;
    "best": the best-scored checkpoint), with its step, spec, job and held-out `scores` at that step ("loss", each
    metric: `val_<name>`) as params (as metrics linked to the model, they would be a second point of the run's own
    val_loss at that step); returns its model id. A model whose upload fails is marked FAILED, and the error
    raised."""
    module = trained_model(exported, train)
    params = {"step": str(exported.step), "model": exported.config.name, "job": exported.job,
              **{f"val_{k}": f"{float(v):.6g}" for k, v in (scores or {}).items()}}  # fmt: skip
    model = client.create_logged_model(experiment_id, name=name, source_run_id=run_id, params=params,
                                       tags={"parcae.job": exported.job})  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="parcae-model-") as tmp, _by_value(module):
            path = Path(tmp) / name
            version = torch.__version__.split("+")[0]  # (a local build tag, such as +cpu, would pin that build)
            mlflow.pytorch.save_model(module, str(path), serialization_format="pickle",
                                      pip_requirements=[f"torch=={version}"])  # fmt: skip
            client.log_model_artifacts(model.model_id, str(path))
        client.finalize_logged_model(model.model_id, "READY")
    except BaseException:
        with contextlib.suppress(Exception):
            client.finalize_logged_model(model.model_id, "FAILED")
        raise
    return model.model_id


@contextlib.contextmanager
def _by_value(module: torch.nn.Module) -> Iterator[None]:
    """Pickle `SpecModel` and the classes a spec file defined by value while the model is saved."""
    names = {type(m).__module__ for m in module.modules()}
    modules: list[ModuleType] = [spec_model]
    modules += [sys.modules[n] for n in sorted(names) if n.startswith(SPEC_FILE_MODULE) and n in sys.modules]
    for m in modules:
        cloudpickle.register_pickle_by_value(m)
    try:
        yield
    finally:
        for m in modules:
            cloudpickle.unregister_pickle_by_value(m)
