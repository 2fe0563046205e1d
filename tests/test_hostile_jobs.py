"""Long jobs that are safe to leave running (issue: "Long jobs that are safe to leave running"): no hidden
deadline, seeds that seed, a diverged loss that stops the job without checkpointing it, outputs checked before
training, a Ctrl-C that stops the workers and says in one line how to continue. The control plane's cases are in
tests/test_control_plane.py, checkpoint integrity in tests/test_checkpoint_integrity.py and
tests/test_trainer_resume.py, the bounded inputs in tests/test_hostile_inputs.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from _jobs import run_job, train
from _trainer_fixtures import _no_orphans, _one_thread, warm_starts  # noqa: F401  (fixtures: _one_thread is autouse)
from typer.testing import CliRunner

from parcae.cli import app
from trainer.config import TrainConfig, model_config
from trainer.control import driver as driver_module
from trainer.control import run as run_module
from trainer.control.driver import JobError
from trainer.examples.gpt import global_batch
from trainer.runtime import checkpoint
from trainer.runtime.pipeline import StageLayout, build_context

CFG = model_config("tiny-gpt", dtype="float64")


def test_a_job_has_no_hidden_deadline(tmp_path, monkeypatch):
    """The driver's clock jumps a minute at every look: the job 'runs' for hours and still finishes (the CLI used
    to stop every job after 600 s: "timed out waiting for training to start step 5439")."""
    offset = [0.0]

    def monotonic() -> float:
        offset[0] += 60.0
        return time.monotonic() + offset[0]

    clock = types.SimpleNamespace(**{**vars(time), "monotonic": monotonic})
    monkeypatch.setattr(run_module, "time", clock)
    monkeypatch.setattr(driver_module, "time", clock)
    report = train(1, model=CFG, steps=4, out_dir=tmp_path / "job", checkpoint_every=0)  # fmt: skip
    assert len(report["loss"]) == 4 and offset[0] > 600
    # who wants a deadline still has one
    with pytest.raises(JobError, match="timed out waiting for"):
        train(1, model=CFG, steps=4, out_dir=tmp_path / "job2", checkpoint_every=0, timeout_s=100)  # fmt: skip


def test_the_seed_seeds_the_model_and_the_data_order(tmp_path, warm_starts):
    def initial(seed: int) -> torch.Tensor:
        states = build_context(model_config("tiny-gpt", seed=seed), TrainConfig(), StageLayout.even(1, 1, CFG))
        return torch.cat([t.flatten() for layer in states.layer_states().values() for t in layer.values()])

    assert not torch.equal(initial(1), initial(2)) and torch.equal(initial(1), initial(1))
    x1, _ = global_batch(0, TrainConfig(seed=1), 8)
    x2, _ = global_batch(0, TrainConfig(seed=2), 8)
    assert not torch.equal(x1, x2) and torch.equal(x1, global_batch(0, TrainConfig(seed=1), 8)[0])
    # end to end: `parcae train --seed` changes the run, and the same seed gives the same one
    sums = {}
    for name, seed in (("a", 1), ("c", 1), ("d", 2**70), ("e", -1)):
        res = CliRunner().invoke(app, ["train", "--workers", "1", "--steps", "2", "--seed", str(seed),
                                       "--out-dir", str(tmp_path / name)])  # fmt: skip
        assert res.exit_code == 0, res.output
        sums[name] = res.output.split("checksum ")[1].split()[0]
    assert sums["a"] == sums["c"] and len({sums["a"], sums["d"], sums["e"]}) == 3


def test_a_diverged_loss_stops_the_job_and_is_never_checkpointed(tmp_path):
    with pytest.raises(JobError, match=r"the loss of step 1 is nan: training diverged; no checkpoint of it"):
        run_job(model_config("tiny-gpt"), TrainConfig(lr=1e30), 1, (1, 1), 6, [], tmp_path / "job",
                checkpoint_every=1, timeout_s=60)  # fmt: skip
    # the checkpoint before the divergence (step 1: after the one finite step) is the newest there is
    assert checkpoint.checkpoint_steps(tmp_path / "job" / "checkpoints") == [1]


def test_a_silent_worker_is_declared_dead_only_on_evidence():
    """A worker whose heartbeat is past the bound is dead if its process ended, is stopped (hung) or cannot be
    seen; one the provider sees running (starved on a loaded machine) only three bounds past it."""
    coord = types.SimpleNamespace(hb_timeout_s=1.0, silent_for=lambda w: {1: 1.5, 2: 1.5, 3: 1.5, 4: 3.5}[w])
    provider = types.SimpleNamespace(running=lambda w: {1: True, 2: False, 3: None, 4: True}[w])
    driver = types.SimpleNamespace(coord=coord, provider=provider)
    assert driver_module.Driver._silent_and_dead(driver, {1, 2, 3, 4}) == {2, 3, 4}


def test_a_job_on_a_loaded_machine_keeps_all_its_workers(tmp_path):
    """CPU hogs beside the job (load well above the cores) at the old 1 s heartbeat bound: no living worker is
    declared dead (it once ended a job with "no instance survives")."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        result = run_job(CFG, TrainConfig(), 2, (2, 1), 12, [], tmp_path / "job",
                         hb_timeout_s=1.0, timeout_s=300)  # fmt: skip
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert [e for e in result["events"] if e["event"] == "dead"] == []
    assert result["exit_codes"] == {0: 0, 1: 0} and len(result["loss"]) == 12


def test_more_workers_than_the_machine_holds_are_refused_before_any_starts(tmp_path):
    most = run_module.local_capacity()
    events = [{"step": 2, "kind": "add", "workers": 100}]
    with pytest.raises(run_module.ScheduleError, match=rf"up to 101 worker processes .* holds at most {most}"):
        run_job(CFG, TrainConfig(), 1, (1, 1), 4, events, tmp_path / "job")
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").rglob("*.pt"))


def test_an_unwritable_report_is_refused_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = CliRunner().invoke(app, ["train", "--workers", "1", "--steps", "1", "--out-dir", str(tmp_path / "run"),
                                   "--json", str(blocker / "report.json")])  # fmt: skip
    assert res.exit_code == 2 and "cannot write --json report" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained
    res = CliRunner().invoke(app, ["train", "--workers", "1", "--steps", "1", "--out-dir", str(blocker)])
    assert res.exit_code == 2 and "--out-dir: " in res.output and "is a file, not a folder" in res.output


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_the_workers_and_prints_one_line_with_the_resume_command(tmp_path):
    out = tmp_path / "run"
    # Python's own Ctrl-C handler, as a command started in a terminal's foreground has it: started from this test
    # process, the command inherits its SIGINT disposition, which is "ignore" where pytest itself was started as a
    # background job of a shell without job control (`pytest &` in a script) — the job then trained on
    start = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from parcae.cli import app; app()"
    cmd = [sys.executable, "-c", start, "train", "--workers", "2", "--steps", "100000", "--checkpoint-every", "2",
           "--out-dir", str(out)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "300"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        end = time.monotonic() + 120
        while not checkpoint.checkpoint_steps(out / "checkpoints") and time.monotonic() < end:
            time.sleep(0.2)
        assert checkpoint.checkpoint_steps(out / "checkpoints"), "the job never checkpointed"
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = err.decode()
    assert p.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    (line,) = [x for x in text.splitlines() if x.startswith("interrupted:")]
    assert "the last complete checkpoint is step" in line and line.endswith("--resume")
    assert f"--out-dir {out}" in line
    end = time.monotonic() + 20  # (multiprocessing's resource tracker leaves when it sees its parent gone)
    while (left := _session(p.pid)) and time.monotonic() < end:
        time.sleep(0.2)
    assert left == [], left


def _session(sid: int) -> list[str]:
    """Command lines of the processes still in session `sid`."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and _is_worker_of(pid, sid):
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def _is_worker_of(pid: str, session: int) -> bool:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) == session
    except (OSError, ValueError, IndexError):
        return False
