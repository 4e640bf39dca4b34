"""A person's own multi-worker script under `gpuwatch run`: real TensorFlow workers on
loopback, started by a real supervisor.

tests/data/scripts/mwms_worker.py is the multi-worker tutorial's per-worker script: it
reads os.environ['TF_CONFIG'] and trains with MultiWorkerMirroredStrategy.

- `gpuwatch run --workers 2`: the command starts on both workers, each with its
  TF_CONFIG, both train (each update's examples are the cluster's, as the runtime
  counts them), the dashboard's workers panel shows both, and the run finishes;
- a SIGKILL of worker 1: the run is crashed, naming worker 1, and nothing is left;
- the same script run by hand, twice, each with the person's own TF_CONFIG (two
  `gpuwatch run`s, one a worker): both finish (gpuwatch hands TF_CONFIG on intact);
- its workers over ssh (a real sshd on localhost): `--set cluster.launcher=ssh` with two
  hosts, each worker's agent started over ssh and the command by the agent there.
(Its workers under Slurm, and the script's own SlurmClusterResolver under srun:
tests/integration/test_slurm_drill.py.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.runs import folders
from gpuwatch.runs.folders import pid_alive
from tests.conftest import ROOT, gpuwatch, wait_for
from tests.support.run_record import events, last_step, of
from tests.support.sshd import SshServer, sshd  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

SCRIPT = str(ROOT / "tests" / "data" / "scripts" / "mwms_worker.py")
PER_WORKER_BATCH = 32


def the_runs(home: Path) -> list[folders.RunInfo]:
    return sorted(folders.list_runs(home), key=lambda info: info.run_id)


def test_workers_2_starts_the_script_on_both_each_with_its_tf_config(home: Path) -> None:
    proc = gpuwatch("run", "--headless", "--workers", "2", "--", sys.executable, SCRIPT,
                    "--steps", "20", timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (info,) = the_runs(home)
    run_dir = info.run_dir
    recorded = events(run_dir)
    hellos = {e["worker"]: e for e in recorded if e["type"] == "hello"}
    assert set(hellos) == {0, 1}
    for hello in hellos.values():
        # Two replicas in sync, one a worker; each update's examples are the cluster's.
        assert (hello["replicas"], hello["per_replica_batch"], hello["global_batch_size"]) \
            == (2, PER_WORKER_BATCH, 2 * PER_WORKER_BATCH), hello
    for worker in (0, 1):
        steps = of(run_dir, "step", worker=worker, attempt=1)
        assert [s["step"] for s in steps] == list(range(1, 21))
        assert all(s["examples"] == 2 * PER_WORKER_BATCH for s in steps)
    hooks = [e for e in recorded if e["type"] == "hook" and e["loop"]]
    assert {(h["worker"], h["strategy"]) for h in hooks} == {
        (0, "MultiWorkerMirroredStrategy"), (1, "MultiWorkerMirroredStrategy")}
    assert [e["status"] for e in of(run_dir, "status")][-1] == "finished"
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("summary: "))
    assert " workers=2 " in summary and " replicas=2 " in summary, summary
    # Each worker's output: its own TF_CONFIG's index, as the script printed it.
    logs = gpuwatch("logs", info.run_id, check=True).stdout
    assert "worker 0 trained" in logs
    worker_logs = "".join(path.read_text() for path in run_dir.rglob("trainer.log"))
    assert "worker 1 trained" in worker_logs
    the_dashboard_shows_both_workers(recorded)


def the_dashboard_shows_both_workers(recorded: list[dict[str, Any]]) -> None:
    """The run's record on the dashboard at 80x24: the workers panel lists both."""
    import asyncio

    from gpuwatch.app.app import GpuwatchApp
    from gpuwatch.app.widgets.workers import WorkersPanel
    from gpuwatch.follow.link import ReplayLink

    def rows(text: str) -> set[str]:
        return {words[0] for line in text.splitlines()
                if (words := line.split()) and words[0] in ("0", "1")}

    async def look() -> str:
        link = ReplayLink(recorded, batch_size=100)
        app = GpuwatchApp(link)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(100):  # until the record is folded in and painted
                await pilot.pause(0.05)
                if rows(app.query_one(WorkersPanel).plain) == {"0", "1"}:
                    break
            return str(app.query_one(WorkersPanel).plain)

    shown = asyncio.run(look())
    assert rows(shown) == {"0", "1"}, shown


def test_a_killed_worker_crashes_the_run_naming_it_and_nothing_is_left(home: Path) -> None:
    started = gpuwatch("run", "--detach", "--workers", "2", "--", sys.executable, SCRIPT,
                       "--steps", "100000")
    assert started.returncode == 0, started.stderr
    (info,) = the_runs(home)
    run_dir = info.run_dir
    wait_for(lambda: min(last_step(run_dir, w, 1) for w in (0, 1)) >= 10, 180,
             "10 steps on both workers")
    pids = {e["worker"]: e["pid"] for e in of(run_dir, "hello", attempt=1)}
    os.killpg(pids[1], signal.SIGKILL)
    wait_for(lambda: folders.read_run_info(run_dir).status == "crashed", 60,
             "the run to be crashed")
    (crash,) = of(run_dir, "status", status="crashed")
    assert crash["worker"] == 1 and crash["message"].startswith("worker 1 (localhost)"), crash
    assert "SIGKILL" in crash["message"], crash
    wait_for(lambda: not any(pid_alive(pid) for pid in pids.values()), 30, "no worker left")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def test_the_script_run_by_hand_twice_with_its_own_tf_config_finishes_on_both(
    home: Path,
) -> None:
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    for index in (0, 1):
        env = {**os.environ,
               "TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": "worker", "index": index}})}
        started = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "run", "--detach", "--", sys.executable,
             SCRIPT, "--steps", "10"],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
        assert started.returncode == 0, started.stderr
    wait_for(lambda: len(the_runs(home)) == 2 and all(
        info.status == "finished" for info in the_runs(home)), 240, "both runs to finish")
    for info in the_runs(home):
        logs = gpuwatch("logs", info.run_id, check=True).stdout
        assert "trained" in logs and "KeyError" not in logs, logs


def test_its_workers_over_ssh_each_start_the_script_with_its_tf_config_and_finish(
    home: Path, sshd: SshServer  # noqa: F811
) -> None:
    # As a person types it: two hosts (localhost twice here, over a real sshd), their ssh
    # options, and the Python there that runs gpuwatch's agent.
    proc = gpuwatch("run", "--headless", "--set", "cluster.launcher=ssh",
                    "--set", "cluster.workers=[localhost, localhost]",
                    "--set", f"cluster.python={sys.executable}",
                    "--set", f"cluster.ssh_options=['-F', '{sshd.client_config}']",
                    "--", sys.executable, SCRIPT, "--steps", "10", timeout_s=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (info,) = the_runs(home)
    run_dir = info.run_dir
    recorded = events(run_dir)
    hellos = {e["worker"]: e for e in recorded if e["type"] == "hello"}
    assert set(hellos) == {0, 1}
    assert all(h["replicas"] == 2 for h in hellos.values()), hellos
    for worker in (0, 1):
        steps = of(run_dir, "step", worker=worker, attempt=1)
        assert [s["step"] for s in steps] == list(range(1, 11))
        assert all(s["examples"] == 2 * PER_WORKER_BATCH for s in steps)
    assert [e["status"] for e in of(run_dir, "status")][-1] == "finished"
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("summary: "))
    assert " workers=2 " in summary, summary
    # Each worker's output, relayed by its agent: its own TF_CONFIG's index.
    worker_logs = "".join(path.read_text() for path in run_dir.rglob("trainer.log"))
    assert "worker 0 trained" in worker_logs and "worker 1 trained" in worker_logs
