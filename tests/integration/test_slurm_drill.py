"""The slurm launcher against a real Slurm cluster: two emulated nodes on this host
(tests/support/slurm.py), real TensorFlow workers, a real supervisor through `gpuwatch`.

The allocation is what a person gets from ``salloc -N 2``: a process under salloc
(here one that holds the allocation until its stdin closes, and says its environment)
whose SLURM_* variables `gpuwatch train` is run with, as it would be typed in
salloc's shell. Every worker's agent is an ``srun`` step on its node.

- two workers train, each on its own node, both shown with their node's name;
- the kill drill: SIGKILL worker 1's trainer, the run is `crashed` naming it, no
  trainer, agent or srun is left, and a resume in the same allocation goes on from
  the chief's checkpoint on both; a stop then ends every step (`squeue -s` lists
  none, no process is left);
- `scancel` of the allocation stops both trainers after the same step, checkpointed,
  and leaves no process and no job;
- a person's own multi-worker script (tests/data/scripts/mwms_worker.py): `gpuwatch run
  --workers 2 --set cluster.launcher=slurm` starts it on both nodes, each with its
  TF_CONFIG, and both finish; and the same script building its cluster from Slurm's step
  itself (SlurmClusterResolver), each task of `srun --ntasks=2` a `gpuwatch run` of it:
  Slurm's variables reach it intact, and both tasks train as one cluster and finish.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.runs import folders
from tests.conftest import gpuwatch, wait_for
from tests.support.run_record import events, last_step, of  # noqa: F401
from tests.support.slurm import (  # noqa: F401 - the fixture
    SlurmCluster,
    _free_ports,
    alive,
    processes_with,
    slurm_cluster,
)
from trainer_runtime.protocol import TERMINAL_STATUSES

pytestmark = pytest.mark.slow

TIMEOUT_S = 10
SCRIPT = str(Path(__file__).parent.parent / "data" / "scripts" / "mwms_worker.py")

CONFIG = """\
name: slurm-drill
model: {{name: mlp, hidden_units: [64]}}
data: {{examples: 4096, input_shape: [32], classes: 4, read_latency_ms: 1, prefetch: false}}
train: {{global_batch_size: 64, max_steps: {max_steps}}}
checkpoint: {{every_steps: 20, keep: 3}}
cluster:
  launcher: slurm
  workers: 2
  timeout_s: {timeout_s}
  python: {python}
"""

# Holds the allocation until its stdin closes; its first line is its environment.
HOLDER = (
    "import json, os, sys; print(json.dumps(dict(os.environ)), flush=True); sys.stdin.read()"
)


class Allocation:
    """`salloc -N NODES` running a holder: the allocation lives while the holder does."""

    def __init__(self, cluster: SlurmCluster, nodes: int) -> None:
        self.cluster = cluster
        self.stderr = ""
        self.proc = subprocess.Popen(
            ["salloc", f"--nodes={nodes}", "--immediate=60", "--", sys.executable, "-c", HOLDER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=cluster.env, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.release()
            pytest.fail(f"salloc gave no allocation: {self.stderr}")
        self.env: dict[str, str] = json.loads(line)
        self.job_id = self.env["SLURM_JOB_ID"]

    def release(self) -> int:
        """Close the holder's stdin: it exits, salloc gives the allocation back."""
        if self.proc.poll() is None:
            try:
                _, self.stderr = self.proc.communicate(input="", timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, self.stderr = self.proc.communicate()
        return self.proc.returncode


@pytest.fixture
def allocation(
    slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> Iterator[Allocation]:
    """Two nodes; gpuwatch commands in this test run with the allocation's environment."""
    held = Allocation(slurm_cluster, 2)
    try:
        for key, value in held.env.items():
            if key.startswith("SLURM_"):
                monkeypatch.setenv(key, value)
        yield held
    finally:
        held.release()


def drill_config(tmp_path: Path, max_steps: int) -> Path:
    config = tmp_path / "slurm.yaml"
    config.write_text(CONFIG.format(max_steps=max_steps, timeout_s=TIMEOUT_S,
                                    python=sys.executable))
    return config


def ours(home: Path) -> list[tuple[int, str]]:
    """Our processes: the supervisor and the trainers name the run's directory, under this
    test's GPUWATCH_HOME; srun and the agents its id (an agent finds its directory on its
    own node: --run-id)."""
    found = dict(processes_with(str(home), environ=False))
    for info in folders.list_runs(home):
        found.update(processes_with(info.run_id, environ=False))
    return sorted(found.items())


def trainer_pids(run_dir: Path, attempt: int) -> dict[int, int]:
    return {e["worker"]: e["pid"] for e in of(run_dir, "hello", attempt=attempt)}


def supervisor_gone(run_dir: Path) -> bool:
    pid = folders.read_supervisor_info(run_dir).get("pid")
    return not (isinstance(pid, int) and alive(pid))


def contiguous(run_dir: Path, worker: int, attempt: int) -> list[int]:
    return [e["step"] for e in of(run_dir, "step", worker=worker, attempt=attempt)]


def started_run(home: Path, tmp_path: Path, steps: int) -> folders.RunInfo:
    """`gpuwatch train` of the drill's config, detached, once both workers ran `steps`."""
    started = gpuwatch("train", str(drill_config(tmp_path, 100000)), "--detach")
    assert started.returncode == 0, started.stderr
    (info,) = folders.list_runs(home)
    wait_for(lambda: min(last_step(info.run_dir, w, 1) for w in (0, 1)) >= steps, 180,
             f"{steps} steps on both workers")
    return info


def test_two_workers_train_on_two_slurm_nodes_and_finish(
    home: Path, tmp_path: Path, allocation: Allocation
) -> None:
    done = gpuwatch("train", str(drill_config(tmp_path, 30)), "--headless", timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = re.search(r"^summary: .*$", done.stdout, re.M)
    assert summary and "replicas=2" in summary.group(0) and "workers=2" in summary.group(0)
    # Both workers named by their nodes, in the headless end as in the record.
    assert "worker 0 (node1)" in done.stdout and "worker 1 (node2)" in done.stdout, done.stdout
    (info,) = folders.list_runs(home)
    assert {e["worker"]: e["host"] for e in of(info.run_dir, "hello")} == {0: "node1", 1: "node2"}
    for worker in (0, 1):
        assert contiguous(info.run_dir, worker, 1) == list(range(1, 31))
    # Each worker's log is here (the nodes share this filesystem).
    assert "attempt 1 starting" in (info.run_dir / "workers" / "1" / "trainer.log").read_text()
    wait_for(lambda: supervisor_gone(info.run_dir) and not ours(home), 30,
             lambda: f"no process of the run left: {ours(home)}")


def test_killing_a_slurm_worker_crashes_the_run_naming_it_and_a_resume_goes_on(
    home: Path, tmp_path: Path, allocation: Allocation,
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    info = started_run(home, tmp_path, steps=45)
    run_dir = info.run_dir
    # Each worker's agent is a step of our allocation, on its own node.
    steps = slurm_cluster.steps()
    assert sorted(line.split()[1] for line in steps) == ["node1", "node2"], steps
    assert all(line.startswith(f"{allocation.job_id}.") for line in steps), steps
    pids = trainer_pids(run_dir, 1)
    assert set(pids) == {0, 1}
    # ours() sees them: an srun for each node (srun forks a helper of itself too).
    sruns = [argv for _, argv in ours(home) if argv.startswith("srun ")]
    assert {i for i in (0, 1) for argv in sruns if f"--relative={i}" in argv} == {0, 1}, sruns

    killed_at = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    wait_for(lambda: folders.read_run_info(run_dir).status == "crashed", TIMEOUT_S + 10,
             "the run to be crashed")
    assert time.monotonic() - killed_at <= TIMEOUT_S + 10
    (crash,) = of(run_dir, "status", status="crashed")
    assert crash["worker"] == 1 and crash["message"].startswith("worker 1 (node2)"), crash
    assert "SIGKILL" in crash["message"]
    # Nobody follows the run: its supervisor ends its links, so no trainer, agent or srun
    # is left, and no step of ours runs.
    wait_for(lambda: supervisor_gone(run_dir) and not ours(home), 30,
             lambda: f"no process of the run left: {ours(home)}")
    assert not any(alive(pid) for pid in pids.values())
    wait_for(lambda: not slurm_cluster.steps(), 15,
             lambda: f"no step left: {slurm_cluster.steps()}")
    lost_at = last_step(run_dir, 0, 1)
    checkpoints = [e["step"] for e in of(run_dir, "checkpoint", worker=0, attempt=1)]
    assert checkpoints, "the chief checkpointed before the kill"

    # Resumed in the same allocation: both workers go on from the chief's checkpoint.
    resumed = gpuwatch("resume", info.run_id, "--detach")
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: min(last_step(run_dir, w, 2) for w in (0, 1)) >= checkpoints[-2:][0] + 5,
             180, "attempt 2 to train on both workers")
    resumes = {e["worker"]: e for e in of(run_dir, "resume", attempt=2)}
    assert set(resumes) == {0, 1}
    # The chief's latest, or the one before it: worker 1 (a remote worker, it reads only
    # its own scratch copies) SIGKILLed while the chief saved lacks the latest, and the
    # newest step both have is taken (trainer_runtime/loop.py, _restore_agreed).
    (resumed,) = {e["from_step"] for e in resumes.values()}
    assert resumed in checkpoints[-2:], (resumed, checkpoints)
    scratch = Path(resumes[1]["checkpoint"]).parent
    assert scratch != Path(resumes[0]["checkpoint"]).parent  # its own copy, not the chief's
    # Each restored that step from its own copy. Whether worker 1's scratch held the
    # latest is not read from its files afterwards: a SIGKILL can land between a
    # checkpoint's files and the state file that names it (x10 at ab9f19a: ckpt-60.index
    # on disk, the agreed step the one before), and attempt 2 saves into the same folder.
    assert {Path(e["checkpoint"]).name for e in resumes.values()} == {f"ckpt-{resumed}"}
    assert resumes[0]["lost_steps"] == lost_at - resumed
    hellos = of(run_dir, "hello", attempt=2)
    assert {(e["worker"], e["host"], e["start_step"]) for e in hellos} == {
        (0, "node1", resumed), (1, "node2", resumed)
    }
    for worker in (0, 1):
        steps_2 = contiguous(run_dir, worker, 2)
        assert steps_2[0] == resumed + 1
        assert steps_2 == list(range(steps_2[0], steps_2[0] + len(steps_2)))

    # A stop ends it all: no process of ours, no step in Slurm, then the allocation goes.
    assert gpuwatch("stop", info.run_id).returncode == 0
    wait_for(lambda: folders.read_run_info(run_dir).status == "stopped", 90,
             lambda: f"stopped (status {folders.read_run_info(run_dir).status})")
    assert last_step(run_dir, 0, 2) == last_step(run_dir, 1, 2)  # stopped together
    wait_for(lambda: supervisor_gone(run_dir) and not ours(home), 30,
             lambda: f"no process of the run left: {ours(home)}")
    wait_for(lambda: not slurm_cluster.steps(), 15,
             lambda: f"no step left: {slurm_cluster.steps()}")
    allocation.release()
    wait_for(lambda: not slurm_cluster.jobs(), 15,
             lambda: f"no job left: {slurm_cluster.jobs()}")


def test_scancel_of_the_allocation_ends_the_run_and_leaves_nothing(
    home: Path, tmp_path: Path, allocation: Allocation,
    slurm_cluster: SlurmCluster,  # noqa: F811
) -> None:
    info = started_run(home, tmp_path, steps=10)
    run_dir = info.run_dir
    pids = trainer_pids(run_dir, 1)
    cancelled = slurm_cluster.run("scancel", allocation.job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    # Slurm signals every step's processes (SIGTERM, then SIGKILL after KillWait): the
    # trainers stop together after the same step and checkpoint it, as on a stop.
    wait_for(lambda: folders.read_run_info(run_dir).status in TERMINAL_STATUSES, 60,
             lambda: f"the run to end (status {folders.read_run_info(run_dir).status})")
    ended = of(run_dir, "status")[-1]
    assert ended["status"] == "stopped" and "sigterm" in ended["message"], ended
    last = last_step(run_dir, 0, 1)
    assert last_step(run_dir, 1, 1) == last
    assert of(run_dir, "checkpoint", worker=0)[-1]["step"] == last
    wait_for(lambda: supervisor_gone(run_dir) and not ours(home), 30,
             lambda: f"no process of the run left: {ours(home)}")
    assert not any(alive(pid) for pid in pids.values())
    wait_for(lambda: not slurm_cluster.jobs(), 15,
             lambda: f"no job left: {slurm_cluster.jobs()}")
    allocation.release()


def test_a_persons_script_runs_on_both_nodes_under_salloc_and_finishes(
    home: Path, allocation: Allocation
) -> None:
    done = gpuwatch("run", "--headless", "--workers", "2", "--set", "cluster.launcher=slurm",
                    "--set", f"cluster.python={sys.executable}", "--set",
                    f"cluster.timeout_s={TIMEOUT_S}", "--", sys.executable, SCRIPT,
                    "--steps", "10", timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (info,) = folders.list_runs(home)
    assert {e["worker"]: e["host"] for e in of(info.run_dir, "hello")} == {0: "node1", 1: "node2"}
    for worker in (0, 1):
        assert contiguous(info.run_dir, worker, 1) == list(range(1, 11))
    logs = "".join(path.read_text() for path in info.run_dir.rglob("trainer.log"))
    assert "worker 0 trained" in logs and "worker 1 trained" in logs, logs[-2000:]
    wait_for(lambda: supervisor_gone(info.run_dir) and not ours(home), 30,
             lambda: f"no process of the run left: {ours(home)}")


def test_the_scripts_own_slurm_cluster_resolver_under_srun_trains_both_tasks(
    home: Path, allocation: Allocation
) -> None:
    # Two tasks on one node (the emulated nodes share this host: SlurmClusterResolver
    # gives a node's tasks port_base + their local index, so only one node's tasks can
    # bind here), each `gpuwatch run` of the script, with the environment srun gives it.
    port_base = _free_ports(2)[0]
    done = subprocess.run(
        # --overcommit: the emulated nodes have one CPU each (two tasks of one core here).
        ["srun", "--nodes=1", "--ntasks=2", "--overcommit", "--overlap", sys.executable, "-m",
         "gpuwatch", "run",
         "--headless", "--", sys.executable, SCRIPT, "--resolver", "slurm",
         "--port-base", str(port_base), "--steps", "10"],
        capture_output=True, text=True, timeout=300, cwd=Path(SCRIPT).parents[3],
        env=os.environ.copy(), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    finished = folders.list_runs(home)
    assert len(finished) == 2 and {info.status for info in finished} == {"finished"}, finished
    seen = set()
    for info in finished:
        log = (info.run_dir / "trainer.log").read_text()
        task = re.search(r"^worker (\d) of 2: ", log, re.M)
        assert task is not None, log[-2000:]
        seen.add(int(task.group(1)))
        assert f"worker {task.group(1)} trained" in log
        assert [e["step"] for e in of(info.run_dir, "step")] == list(range(1, 11))
        # One cluster of two: MultiWorkerMirroredStrategy's two replicas in sync.
        (hello,) = of(info.run_dir, "hello")
        assert hello["replicas"] == 2, hello
    assert seen == {0, 1}
    wait_for(lambda: not ours(home), 30, lambda: f"no process of the runs left: {ours(home)}")
