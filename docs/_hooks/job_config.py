"""mkdocs hook: the `JobConfig` reference page, written at build time from the dataclasses themselves (never stale).

One section per field of `trainer.JobConfig` that is a section dataclass: its docstring, then a table of its fields
(type, default, the `parcae train` option that sets it where there is one). Nothing is committed: the page is a
generated file of the build, like the figures (`figures.py`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "reference/job-config.md"

INTRO = """# The job's settings: `JobConfig`

One `trainer.JobConfig` carries every setting of a training job end to end: `parcae train` and the Prefect
`train` flow build it, it is validated once on construction (a bad field is one error naming `section.field` and
the fix), and the driver, the coordinator, the workers and the observers read it unchanged. The job writes it to
`<out_dir>/job.json` (`JobConfig.to_dict`) and records it in its MLflow run and in every checkpoint;
`JobConfig.from_dict` reads it back (unknown fields are errors).

This page is generated from the dataclasses when the site is built.

```python
from trainer import CheckpointConfig, JobConfig

config = JobConfig(out_dir="runs/a", checkpoint=CheckpointConfig(every=5, uri="s3://my-bucket/parcae/a"))
config = config.replace(fleet={"max_instances": 8})   # a copy with one section's fields changed
```
"""


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(see below)"
    shown = json.dumps(value) if isinstance(value, (dict, list, tuple, str, type(None), bool)) else repr(value)
    return f"`{shown}`"


def page() -> str:
    from parcae.cli.train import TRAIN_OPTIONS
    from trainer import JobConfig

    lines = [INTRO, "## Top level", "", "| field | type | default | `parcae train` option |", "|---|---|---|---|"]
    sections = []
    for f in dataclasses.fields(JobConfig):
        if isinstance(f.type, str) and f.type.endswith("Config"):
            sections.append(f)
            lines.append(f"| `{f.name}` | [`{f.type}`](#{f.name}) | (a section) | |")
        else:
            option = TRAIN_OPTIONS.get(f.name, "")
            lines.append(f"| `{f.name}` | `{f.type}` | {_default(f)} | {f'`{option}`' if option else ''} |")
    defaults = JobConfig()
    for f in sections:
        kind = type(getattr(defaults, f.name))
        doc = " ".join((kind.__doc__ or "").split())
        lines += ["", f"## `{f.name}`", "", f"`{kind.__name__}`: {doc}", "",
                  "| field | type | default | `parcae train` option |", "|---|---|---|---|"]  # fmt: skip
        for g in dataclasses.fields(kind):
            option = TRAIN_OPTIONS.get(f"{f.name}.{g.name}", "")
            lines.append(f"| `{g.name}` | `{g.type}` | {_default(g)} | {f'`{option}`' if option else ''} |")
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=page()))
    return files
