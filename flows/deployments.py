"""Deploy: every deployment of ``prefect.yaml`` on the Prefect API of ``PREFECT_API_URL`` (`make serve`).

    python -m flows.deployments [prefect.yaml]

Runs ``prefect --no-prompt deploy --all`` (Prefect's own deploy, from the file's folder) and prints one line per
deployment instead of Prefect's panels, which repeat "start a worker" after each; on a failure, Prefect's whole
output. Then pauses each deployment whose flow cannot run on this machine (`parcae.settings.unrunnable_here`:
collect-traces without an AWS region or credentials), saying why, so that it does not fail on every schedule.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from parcae import settings

_CREATED = re.compile(r"Deployment '([^']+)' successfully (?:created|updated)")


def deploy_all(path: str | Path = "prefect.yaml") -> list[str]:
    """``prefect deploy --all`` of ``path``; the deployments' names. RuntimeError with Prefect's output if it
    fails."""
    file = Path(path).resolve()
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
                           "--prefect-file", str(file)], cwd=file.parent, capture_output=True, text=True)  # fmt: skip
    text = " ".join((done.stdout + done.stderr).split())  # Prefect's panels wrap a name across lines
    if done.returncode != 0:
        raise RuntimeError(f"prefect deploy --all failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return _CREATED.findall(text)


def pause_unrunnable(path: str | Path = "prefect.yaml") -> dict[str, str]:
    """Pause the deployments of ``path`` that cannot run on this machine; returns name -> why."""
    from prefect.client.orchestration import get_client

    why = settings.unrunnable_here(path)
    with get_client(sync_client=True) as client:
        for name in why:
            client.pause_deployment(client.read_deployment_by_name(name).id)
    return why


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = args[0] if args else "prefect.yaml"
    try:
        names = deploy_all(path)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    paused = pause_unrunnable(path)
    for name in names:
        state = f"paused: {paused[name]}" if name in paused else "ready"
        print(f"deployed {name} ({state})")
    if paused:
        print("a paused deployment runs on its schedule again once resumed: the toggle on its page in the Prefect UI")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
