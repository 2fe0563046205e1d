"""A job's settings from one file: what `parcae train --config` and the train flow's ``config_file`` read.

Owns: `load_job` (JSON, as `JobConfig.to_dict` writes it in each job's ``job.json`` and its MLflow run; or TOML
with the same sections), with the run's own out_dir and resume, checked as the job will run (its provider too).
Must not touch: which options may go beside a file (the command line's and the flow's own rules), what a field
means (`trainer.config`).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from forecasting import jsonio
from liveput import shown
from trainer.config import ConfigError, JobConfig
from trainer.jsonfile import load_json
from trainer.providers import provider_of, with_notice_grace

#: What a job file should hold, said where it does not.
EXPECTED = "give a JobConfig, an object of its sections (model, train, ...), as the job.json of a job"


def load_job(
    path: str | os.PathLike[str], *, out_dir: str | os.PathLike[str] | None = None, resume: bool | None = None
) -> tuple[JobConfig, bool]:
    """The `JobConfig` that the file at `path` holds (``.toml``: TOML, else JSON), with `out_dir` where given
    (None: the file's, else the default) and `resume` where given, and whether the file gives the global batch
    (else the spec's rows set it). A file that does not give the notice grace gets its provider's (AWS: two
    minutes), as a job built from options does. Raises `ConfigError` starting with the file's name: it cannot be
    read, is not JSON or TOML, or is not a job that checks (an unknown field, a bad value, a provider's option)."""
    p = Path(path)
    if p.suffix.lower() == ".toml":
        try:
            doc: Any = tomllib.loads(jsonio.read(p))
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read a job file ({exc.strerror or exc})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not TOML ({exc})") from None
        except jsonio.JsonInputError as exc:  # too large, or not UTF-8 text
            raise ConfigError(f"{p}: not TOML ({exc.at('')})") from None
    else:
        doc = load_json(p, ConfigError, "a job file", f"{EXPECTED}; a .toml file is read as TOML")
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: expected an object, got {shown(doc)}; {EXPECTED}")
    try:
        config = JobConfig.from_dict(doc)
        if out_dir is not None:
            config = config.replace(out_dir=str(out_dir))
        if resume is not None:
            config = config.replace(checkpoint={"resume": resume})
        if "notice_grace_s" in (doc.get("control") or {}):
            provider_of(config)  # its name, its options and what it runs
        else:
            config = with_notice_grace(config)  # (and checked against it)
    except (TypeError, ValueError) as exc:  # ConfigError: "section.field: problem; fix"
        raise ConfigError(f"{p}: {exc}") from None
    return config, "global_batch" in (doc.get("train") or {})
