"""The commands the documentation shows are ones that work: every `parcae ...` line in a shell block of docs/ or the
README names a real command and only options it has (so a renamed option cannot leave the docs stale), and the
blocks marked `<!-- runnable -->` (the line before the fence; invisible on the site) are run, line by line, in a
scratch directory, and must succeed. Mark only quick blocks: each command gets RUN_TIMEOUT_S."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^```(bash|sh|shell|console)\s*$")
RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the fence, 1-based
    commands: tuple[str, ...]  # logical lines: continuations joined, comments and blank lines dropped
    runnable: bool

    def where(self, i: int) -> str:
        return f"{self.page}:{self.line} (command {i + 1})"


def _balanced(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # a quote still open: the command goes on on the next line
        return False
    return True


def _commands(lines: list[str]) -> tuple[str, ...]:
    out, pending = [], ""
    for raw in lines:
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        text = (pending + raw).strip()
        if not _balanced(text):
            pending = text + "\n"
            continue
        pending = ""
        if text and not text.startswith("#"):
            out.append(text)
    assert not pending.strip(), f"a shell block ends inside a command: {pending!r}"
    return tuple(out)


def doc_blocks() -> list[Block]:
    """Every shell block of docs/**/*.md and README.md, in order."""
    blocks = []
    for path in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if FENCE.match(lines[i]):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
                blocks.append(Block(str(path.relative_to(ROOT)), i + 1, _commands(lines[i + 1 : end]), before == MARK))
                i = end
            i += 1
    return blocks


BLOCKS = doc_blocks()


def _pipeline(command: str) -> list[list[str]]:
    """The simple commands of a command line (split at `&&`, `||`, `;`, `|`; quotes respected)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            out.append([])
        else:
            out[-1].append(token)
    return [words for words in out if words]


def _options(cmd: Any) -> set[str]:
    """The long options of a (Typer's own click) command."""
    names = {"--help"}
    for p in cmd.params:
        if p.param_type_name == "option":
            names |= {n for n in (*p.opts, *p.secondary_opts) if n.startswith("--")}
    return names


def _check_parcae(words: list[str]) -> str | None:
    """Why `parcae <words>` is not a command line the app accepts (None if it is): an unknown command or an option
    the command does not have. Values and placeholders (`...`) are not checked."""
    from parcae.cli import app

    cmd: Any = typer.main.get_command(app)
    known = _options(cmd)
    for w in words:
        if w.startswith("--"):
            option = w.split("=", 1)[0]
            if option not in known:
                return f"{cmd.name} has no option {option}"
        elif not w.startswith("-") and hasattr(cmd, "commands"):  # a group: the next word names its command
            sub = cmd.commands.get(w)
            if sub is None:
                return f"no command {w!r} (there are: {', '.join(sorted(cmd.commands))})"
            cmd, known = sub, _options(sub)  # (a group's own options go before its command's name)
    return None


def parcae_lines() -> list[tuple[str, list[str]]]:
    out = []
    for b in BLOCKS:
        for i, c in enumerate(b.commands):
            for words in _pipeline(c):
                if words and words[0] in ("parcae", ".venv/bin/parcae"):
                    out.append((b.where(i), words[1:]))
    return out


def test_the_docs_show_commands_and_mark_some_runnable() -> None:
    """(This test's own ground: it finds the blocks, and a marked one exists to run.)"""
    assert len(parcae_lines()) >= 20
    assert sum(b.runnable for b in BLOCKS) >= 2


@pytest.mark.parametrize(("where", "words"), parcae_lines(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_parcae_command_in_the_docs_is_a_real_one(where: str, words: list[str]) -> None:
    why = _check_parcae(words)
    assert why is None, f"{where}: parcae {' '.join(words)}: {why}"


def test_a_stale_option_in_the_docs_would_be_found() -> None:
    assert _check_parcae(["simulate", "--trace", "p3", "--policy", "parcae"]) is None
    assert _check_parcae(["--quiet", "forecast", "predict", "--trace", "p3", "--at", "4"]) is None
    assert "predict has no option --quiet" in (_check_parcae(["forecast", "predict", "--quiet"]) or "")
    assert "has no option --polcy" in (_check_parcae(["simulate", "--polcy", "parcae"]) or "")
    assert "no command 'simulatee'" in (_check_parcae(["simulatee"]) or "")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runnable], ids=lambda b: f"{b.page}:{b.line}")
def test_the_runnable_blocks_run(block: Block, tmp_path: Path) -> None:
    """Each command of the block, in order, by bash in a scratch directory that has the repository's examples/:
    `parcae` is this interpreter's (the venv's); what the commands write (out/, runs/, mlruns/) stays there."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "NO_COLOR": "1"}
    for i, command in enumerate(block.commands):
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)  # fmt: skip
        assert done.returncode == 0, f"{block.where(i)}: {command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_the_aws_tutorial_s_provider_options_are_a_valid_spot_config() -> None:
    """The tutorial's `aws.json` is what `--provider aws` accepts (every field checked, unknown ones refused)."""
    import json

    from trainer.providers.aws_config import AwsSpotConfig

    text = (ROOT / "docs" / "aws-spot.md").read_text()
    (block,) = re.findall(r"```json\n(.*?)```", text, re.S)
    config = AwsSpotConfig.from_mapping(json.loads(block))
    assert (config.job, config.coordinator_port, len(config.subnet_ids)) == ("spot-1", 29500, 1)


def test_the_readme_s_figure_is_what_its_command_draws() -> None:
    """The README's timeline is text (Mermaid) that the project's own command wrote: a change to the simulator, the
    policies or the trace that moves it fails here, and `python docs/_hooks/readme_figure.py` redraws it."""
    spec = importlib.util.spec_from_file_location("readme_figure", ROOT / "docs" / "_hooks" / "readme_figure.py")
    assert spec is not None and spec.loader is not None
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    held = figure.in_readme()
    assert held.count("```mermaid") == 2, "the README's figure lost its charts"
    assert held == figure.drawn(), "the README's figure is stale: run `python docs/_hooks/readme_figure.py`"
