"""mkdocs hook: the figures the pages show, drawn at build time by the project's own commands (none is committed).

Each figure is the output of one command a reader can run; the page that shows it prints that command next to it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

#: The site path of each figure -> the command (its arguments after `parcae`) that draws it at OUT (TMP: a fresh
#: scratch folder).
FIGURES: dict[str, list[str]] = {
    "img/p3-timeline.png": [
        "simulate",
        "--trace",
        "p3",
        "--start-hour",
        "1.5",
        "--end-hour",
        "2.5",
        "--policy",
        "parcae",
        "--policy",
        "reactive",
        "--plot",
        "OUT",
    ],  # fmt: skip
    "img/migration-kinds.png": [
        "-q",
        "train",
        "--workers",
        "4",
        "--events",
        "examples/events.json",
        "--steps",
        "60",
        "--out-dir",
        "TMP",
        "--plot",
        "OUT",
    ],  # fmt: skip
    "img/liveput-plan.png": ["plan", "examples/plan.json", "--plot", "OUT"],
    "img/p3-forecast-fan.png": [
        "forecast",
        "predict",
        "--trace",
        "p3",
        "--at",
        "283",
        "--model",
        "lightgbm",
        "--plot",
        "OUT",
    ],  # fmt: skip
}


def on_files(files: Files, config: Any) -> Files:
    out = Path(tempfile.mkdtemp(prefix="parcae-docs-"))
    for name, args in FIGURES.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = {"OUT": str(path), "TMP": tempfile.mkdtemp(prefix="parcae-docs-job-")}
        argv = [sys.executable, "-m", "parcae.cli", *(scratch.get(a, a) for a in args)]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not path.is_file():
            raise RuntimeError(f"docs figure {name}: `parcae {' '.join(args)}` failed:\n{done.stderr[-2000:]}")
        files.append(File.generated(config, name, abs_src_path=str(path)))
    return files
