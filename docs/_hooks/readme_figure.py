"""The README's figure: a timeline of a simulated run under the p3 trace, as Mermaid charts (GitHub draws them; a
PNG would be a committed binary that drifts). The text between the markers is the output of COMMAND; the suite
checks that it still is (tests/test_doc_commands.py), and `python docs/_hooks/readme_figure.py` rewrites it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The command (its arguments after `parcae`) that draws the figure at OUT.
COMMAND = ["simulate", "--trace", "p3", "--start-hour", "1.5", "--end-hour", "2.5", "-p", "parcae", "-p", "reactive",
           "--mermaid", "OUT"]  # fmt: skip
BEGIN = "<!-- figure: `parcae {}` -->".format(" ".join("OUT.md" if a == "OUT" else a for a in COMMAND))
END = "<!-- end of figure -->"


def drawn() -> str:
    """The figure as the command draws it now."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figure.md"
        argv = [sys.executable, "-m", "parcae.cli", *(str(out) if a == "OUT" else a for a in COMMAND)]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"`parcae {' '.join(COMMAND)}` failed:\n{done.stderr[-2000:]}")
        return out.read_text()


def in_readme(text: str | None = None) -> str:
    """The figure as the README holds it (between BEGIN and END)."""
    text = README.read_text() if text is None else text
    if BEGIN not in text or END not in text:
        raise ValueError(f"{README.name} has no figure markers: the line {BEGIN!r}, then {END!r}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main() -> None:
    text = README.read_text()
    old, new = in_readme(text), drawn()
    head, rest = text.split(BEGIN, 1)
    README.write_text(f"{head}{BEGIN}\n{new}{END}{rest.split(END, 1)[1]}")
    print(f"{README.name}: figure {'unchanged' if old == new else 'redrawn'}")


if __name__ == "__main__":
    main()
