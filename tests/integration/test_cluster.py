"""Cluster runs: the worker plan (pure), and a supervisor with 2-3 local workers of the
stand-in trainer (tests/data/fake_trainer.py; no TensorFlow): every worker launched with
its TF_CONFIG, frames tagged with their worker, one failure ends the attempt on all."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import CommandError, RunClient
from gpuwatch.runs.folders import pid_alive
from gpuwatch.supervisor import Supervisor
from gpuwatch.supervisor.cluster import (
    ClusterError,
    WorkerPlan,
    check_allocation,
    plan_workers,
    remote_argv,
    srun_prefix,
    ssh_prefix,
    tf_addresses,
    worker_launches,
)
from tests.conftest import ROOT, TINY, gpuwatch
from tests.supervisor.test_supervisor_parts import until
from trainer_runtime.schema import RunConfig

ALLOCATION = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[01-03]", "SLURM_JOB_NUM_NODES": "3"}


def cluster_config(cluster: dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate({"cluster": cluster})


# -- the plan ----------------------------------------------------------------------------


def test_no_cluster_is_one_local_worker_in_the_run_dir(tmp_path: Path) -> None:
    (plan,) = plan_workers(RunConfig(), tmp_path)
    assert plan == WorkerPlan(0, "localhost", tmp_path, "local", (), sample=True)
    assert worker_launches(RunConfig(), [plan], [("localhost", 1)]) == [None]


def test_local_workers_have_their_own_dirs_and_one_samples_the_host(tmp_path: Path) -> None:
    plans = plan_workers(cluster_config({"workers": 3}), tmp_path)
    assert [(p.index, p.kind, p.worker_dir, p.sample) for p in plans] == [
        (0, "local", tmp_path, True),
        (1, "local", tmp_path / "workers" / "1", False),
        (2, "local", tmp_path / "workers" / "2", False),
    ]


def test_ssh_workers_are_reached_with_the_host_after_end_of_options(tmp_path: Path) -> None:
    config = cluster_config({
        "launcher": "ssh",
        "workers": ["localhost", "alice@gpu-a", "gpu-b", "gpu-a"],
        "ssh_options": ["-F", "/tmp/ssh_config"],
    })
    plans = plan_workers(config, tmp_path)
    assert [(p.kind, p.host, p.sample) for p in plans] == [
        ("local", "localhost", True),
        ("remote", "alice@gpu-a", True),
        ("remote", "gpu-b", True),
        ("remote", "gpu-a", False),  # gpu-a is sampled by worker 1's agent already
    ]
    assert plans[1].argv_prefix == (
        "ssh", "-T", "-F", "/tmp/ssh_config", "-o", "BatchMode=yes", "--", "alice@gpu-a"
    )
    assert plans[0].argv_prefix == ()


def test_ssh_never_reads_a_host_as_an_option() -> None:
    # The schema refuses such a host; the argv would not read it as one either.
    with pytest.raises(ValueError):
        ssh_prefix("-oProxyCommand=evil")
    prefix = ssh_prefix("gpu-a", ["-p", "22"])
    assert prefix.index("--") == prefix.index("gpu-a") - 1


def test_remote_argv_quotes_the_command_for_the_remote_shell_but_not_for_srun() -> None:
    command = ["/opt/py 3/bin/python", "-m", "trainer_runtime", "--run-dir", "a b;rm -rf ~"]
    ssh = remote_argv(ssh_prefix("gpu-a"), command)
    assert ssh[:-1] == list(ssh_prefix("gpu-a"))
    assert shlex.split(ssh[-1]) == command
    assert remote_argv(srun_prefix(2), command) == [*srun_prefix(2), *command]


def test_srun_runs_one_task_on_each_workers_node() -> None:
    assert srun_prefix(2) == (
        "srun", "--nodes=1", "--ntasks=1", "--relative=2", "--overlap",
        "--kill-on-bad-exit=1", "--quiet", "--",
    )


def test_slurm_workers_dial_each_node_by_name_at_the_port_its_agent_found(
    tmp_path: Path,
) -> None:
    config = cluster_config({"launcher": "slurm", "workers": 3})
    plans = plan_workers(config, tmp_path, env=ALLOCATION)
    assert [(p.kind, p.argv_prefix, p.sample) for p in plans] == [
        ("remote", srun_prefix(i), True) for i in range(3)
    ]
    # Two emulated nodes on one host (a real slurmd's MULTIPLE_SLURMD) share its ports: a
    # fixed port for all (TensorFlow's resolver: 8888) could not start the second worker.
    prepared = [("node01", 4001), ("node02", 4002), ("node03", 4001)]
    launches = worker_launches(config, plans, prepared, this_host="head")
    assert [launch and (launch.index, launch.workers) for launch in launches] == [
        (0, 3), (1, 3), (2, 3)
    ]
    assert launches[1] is not None and json.loads(launches[1].env["TF_CONFIG"]) == {
        "cluster": {"worker": ["node01:4001", "node02:4002", "node03:4001"]},
        "task": {"type": "worker", "index": 1},
    }
    # The bundled runtime's workers get TF_CONFIG alone; a person's command also gets
    # Slurm's step variables of the whole cluster (its agent's step is one task).
    assert set(launches[1].env) == {"TF_CONFIG"}
    command = RunConfig.model_validate({**config.model_dump(),
                                        "command": {"argv": ["python", "t.py"], "cwd": "/w"}})
    launch = worker_launches(command, plans, prepared, this_host="head")[1]
    assert launch is not None and {k: v for k, v in launch.env.items() if k != "TF_CONFIG"} == {
        "SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0", "SLURM_GTIDS": "1",
        "SLURM_NTASKS": "3", "SLURM_NPROCS": "3", "SLURM_NNODES": "3",
        "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NUM_NODES": "3",
        "SLURM_NODELIST": "node01,node02,node03", "SLURM_STEP_NODELIST": "node01,node02,node03",
        "SLURM_TASKS_PER_NODE": "1(x3)", "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
    }
    # cluster.ports under slurm: its first port on every node.
    fixed = cluster_config({"launcher": "slurm", "workers": 3, "ports": [8888]})
    launch = worker_launches(fixed, plans, prepared)[2]
    assert launch is not None and json.loads(launch.env["TF_CONFIG"])["cluster"]["worker"] == [
        "node01:8888", "node02:8888", "node03:8888"
    ]


def test_slurm_outside_an_allocation_is_a_clear_error(tmp_path: Path) -> None:
    config = cluster_config({"launcher": "slurm", "workers": 2})
    with pytest.raises(ClusterError, match="not inside a Slurm allocation"):
        plan_workers(config, tmp_path, env={})


def test_slurm_allocation_with_too_few_nodes_is_a_clear_error() -> None:
    with pytest.raises(ClusterError, match=r"4 workers need 4 nodes.*has 3.*--nodes=4"):
        check_allocation(4, ALLOCATION)
    with pytest.raises(ClusterError, match="SLURM_JOB_NUM_NODES"):
        check_allocation(2, {**ALLOCATION, "SLURM_JOB_NUM_NODES": ""})
    check_allocation(3, ALLOCATION)


def test_tf_config_lists_every_worker_chief_first(tmp_path: Path) -> None:
    config = cluster_config({"workers": 2})
    plans = plan_workers(config, tmp_path)
    launches = worker_launches(config, plans, [("localhost", 4001), ("localhost", 4002)])
    for index, launch in enumerate(launches):
        assert launch is not None and launch.index == index and launch.workers == 2
        assert json.loads(launch.env["TF_CONFIG"]) == {
            "cluster": {"worker": ["localhost:4001", "localhost:4002"]},
            "task": {"type": "worker", "index": index},
        }


def test_configured_ports_win_and_a_mixed_cluster_dials_this_host_by_name(
    tmp_path: Path,
) -> None:
    config = cluster_config(
        {"launcher": "ssh", "workers": ["localhost", "gpu-b"], "ports": [5000, 5001]}
    )
    plans = plan_workers(config, tmp_path)
    prepared = [("localhost", 4001), ("gpu-b", 4002)]
    assert tf_addresses(plans, prepared, ports=[5000, 5001], this_host="head.example") == [
        "head.example:5000", "gpu-b:5001"
    ]
    assert tf_addresses(plans, prepared, this_host="head") == ["head:4001", "gpu-b:4002"]


# -- a supervisor with local workers ----------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gw-cluster-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_supervisor(short_dir: Path, workers: int, extra: str = "") -> Supervisor:
    run_dir = short_dir / "runs" / f"r{workers}"
    run_dir.mkdir(parents=True)
    text = TINY.read_text() + f"cluster:\n  workers: {workers}\n  timeout_s: 2\n{extra}"
    (run_dir / "config.yaml").write_text(text)
    return Supervisor(
        run_dir,
        short_dir / "sock" / f"r{workers}.sock",
        fresh=True,
    )


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_USER_CWD", str(ROOT))
    monkeypatch.setenv("GPUWATCH_STOP_GRACE_S", "10")
    return monkeypatch


def launch_of(sup: Supervisor, index: int, attempt: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (sup.plans[index].worker_dir / f"launch-{attempt}.json").read_text()
    )
    return data


def recorded(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def statuses(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in recorded(run_dir) if e["type"] == "status"]


async def gone(pids: list[int]) -> None:
    await until(lambda: not any(pid_alive(pid) for pid in pids), f"pids {pids} to be gone")


def trainers_of(run_dir: Path) -> list[int]:
    """Live processes started with this run's directory in their arguments (its trainers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if os.fsencode(run_dir) in cmdline and pid_alive(int(proc.name)):
                found.append(int(proc.name))
    return found


async def no_trainer_left(run_dir: Path) -> None:
    await until(lambda: not trainers_of(run_dir), "every trainer of the run to be gone")


@pytest.mark.parametrize("workers", [2, 3])
async def test_every_worker_starts_with_its_tf_config_and_reports_as_itself(
    short_dir: Path, fake_env: pytest.MonkeyPatch, workers: int
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    sup = make_supervisor(short_dir, workers)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "running", "every worker to say hello")
    pids = [agent.pid for agent in sup.agents]
    assert all(pids) and len(set(pids)) == workers
    launches = [launch_of(sup, i, 1) for i in range(workers)]
    clusters = [json.loads(launch["tf_config"]) for launch in launches]
    addresses = clusters[0]["cluster"]["worker"]
    assert len(addresses) == workers and len(set(addresses)) == workers, "distinct ports"
    assert all(address.startswith("localhost:") for address in addresses)
    for index, (launch, tf) in enumerate(zip(launches, clusters, strict=True)):
        assert tf == {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        argv = launch["argv"]
        assert argv[argv.index("--worker") + 1] == str(index)
        assert argv[argv.index("--chief-dir") + 1] == str(sup.run_dir)
        assert argv[argv.index("--run-dir") + 1] == str(sup.plans[index].worker_dir)
        assert launch["pid"] == pids[index]
    events = recorded(sup.run_dir)
    hellos = [e for e in events if e["type"] == "hello"]
    assert sorted(e["worker"] for e in hellos) == list(range(workers))
    # "running" comes once, after the last hello.
    kinds = [e["type"] if e["type"] != "status" else e["status"] for e in events]
    assert kinds.count("running") == 1
    assert kinds.index("running") > max(i for i, k in enumerate(kinds) if k == "hello")
    await until(
        lambda: {e["worker"] for e in recorded(sup.run_dir) if e["type"] == "step"}
        == set(range(workers)),
        "a step from every worker",
    )
    async with RunClient(sup.socket_path) as client:
        status = await client.command("status")
        assert status["workers"] == workers and status["worker_pids"] == pids
        assert status["trainer_pid"] == pids[0]
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    final = statuses(sup.run_dir)
    assert [s["status"] for s in final][-2:] == ["stopping", "stopped"]
    await gone(pids)
    await no_trainer_left(sup.run_dir)
    samples = [e for e in recorded(sup.run_dir) if e["type"] == "sample"]
    assert all(s["worker"] == 0 for s in samples), "one sampler: the host's first worker"


async def test_a_killed_worker_ends_the_attempt_on_all_and_a_relaunch_starts_all_again(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    sup = make_supervisor(short_dir, 3)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "running", "every worker to say hello")
    # A dashboard follows the run: it keeps the crashed run's supervisor up for `r`.
    watcher = RunClient(sup.socket_path)
    await watcher.connect()
    await watcher.subscribe(0, dashboard=True)
    pids = [agent.pid for agent in sup.agents]
    assert all(pids)
    os.kill(pids[1], signal.SIGKILL)
    await until(lambda: sup.status == "crashed", "the attempt to crash", timeout_s=5)
    await until(lambda: not sup.trainer_running, "the other workers to be stopped", 15)
    await gone([pid for pid in pids if pid])
    await no_trainer_left(sup.run_dir)
    crashed = [s for s in statuses(sup.run_dir) if s["status"] == "crashed"]
    assert len(crashed) == 1, "one status: the others' exits do not overwrite it"
    assert crashed[0]["worker"] == 1 and crashed[0]["signal"] == "SIGKILL"
    assert crashed[0]["message"].startswith("worker 1 (localhost): killed by SIGKILL")
    assert statuses(sup.run_dir)[-1]["status"] == "crashed"
    async with RunClient(sup.socket_path) as client:
        reply = await client.command("relaunch")
        assert reply["attempt"] == 2
        await until(lambda: sup.status == "running", "attempt 2 to run on every worker")
        new_pids = [agent.pid for agent in sup.agents]
        assert all(new_pids) and not set(new_pids) & set(pids)
        assert all(launch_of(sup, i, 2)["tf_config"] for i in range(3))
        await client.command("stop")
    await watcher.close()
    assert await asyncio.wait_for(running, 20) == 0
    await gone([pid for pid in new_pids if pid])
    assert statuses(sup.run_dir)[-1]["status"] == "stopped"


async def test_a_crashed_worker_names_itself_and_the_stubborn_ones_are_killed(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    # Worker 1 crashes at once; worker 0 ignores SIGTERM (blocked in a collective): SIGKILL.
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "stubborn,1=crash")
    fake_env.setattr("gpuwatch.supervisor.exit_policy.WORKER_KILL_GRACE_S", 0.5)
    sup = make_supervisor(short_dir, 2)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "crashed", "the attempt to crash")
    await until(lambda: not sup.trainer_running, "worker 0 to be killed", 10)
    (crashed,) = [s for s in statuses(sup.run_dir) if s["status"] == "crashed"]
    assert crashed["worker"] == 1 and crashed["exit_code"] == 1
    assert crashed["message"] == (
        "worker 1 (localhost): exited with code 1: ValueError: deliberate failure"
    )
    await no_trainer_left(sup.run_dir)
    await sup.stop_run()
    assert await asyncio.wait_for(running, 20) == 0


async def test_workers_that_all_finish_are_one_finished_status(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "finish")
    sup = make_supervisor(short_dir, 2)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "finished", "the run to finish")
    assert [s["status"] for s in statuses(sup.run_dir)][-1] == "finished"
    assert [s["status"] for s in statuses(sup.run_dir)].count("finished") == 1
    await sup.stop_run()
    assert await asyncio.wait_for(running, 20) == 0


async def test_a_worker_that_finishes_while_another_hangs_past_the_timeout_fails_the_attempt(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "finish,1=stubborn")
    fake_env.setattr("gpuwatch.supervisor.exit_policy.WORKER_KILL_GRACE_S", 0.5)
    sup = make_supervisor(short_dir, 2)  # cluster.timeout_s: 2
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "crashed", "the straggler to be given up on")
    await until(lambda: not sup.trainer_running, "worker 1 to be killed", 10)
    await no_trainer_left(sup.run_dir)
    (crashed,) = [s for s in statuses(sup.run_dir) if s["status"] == "crashed"]
    # The stuck worker is the one to blame, not the one that ended at the right step.
    assert crashed["worker"] == 1
    assert crashed["message"] == (
        "worker 1 (localhost): still running 2 s after worker 0 (localhost) ended "
        "(max_steps): stuck without it; stopped"
    )
    await sup.stop_run()
    assert await asyncio.wait_for(running, 20) == 0


async def test_a_relaunch_cannot_change_the_cluster(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    sup = make_supervisor(short_dir, 2)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "running", "every worker to say hello")
    async with RunClient(sup.socket_path) as client:
        with pytest.raises(CommandError, match=r"cluster workers, hosts.*cannot change"):
            await client.command("relaunch", overrides={"cluster.workers": 3})
        assert sup.attempt == 1
        # The collective's timeout reaches the trainers through the attempt's config.
        reply = await client.command("relaunch", overrides={"cluster.timeout_s": 5})
        assert reply["attempt"] == 2
        await until(lambda: sup.status == "running", "attempt 2 to run")
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0


# -- ls, logs, headless, replicas --------------------------------------------------------


def write_cluster_run(home: Path, run_id: str, workers: int) -> Path:
    """A finished cluster run's directory as the supervisor leaves it."""
    run_dir = home / "runs" / run_id
    settings = cluster_config({"workers": workers}).model_dump(mode="json")
    events = [
        {"type": "run", "t": 1.0, "run_id": run_id, "name": "mw", "config_path": "c",
         "supervisor_pid": 1, "host": "h", "settings": settings},
        {"type": "attempt", "t": 2.0, "attempt": 1, "settings": settings, "fresh": True,
         "reason": "start", "config_path": "c"},
        {"type": "step", "t": 3.0, "attempt": 1, "worker": 1, "step": 7, "micro_step": 7,
         "epoch": 0, "loss": 0.5, "lr": 0.1, "examples": 64, "position": 1, "step_time_ms": 1.0,
         "input_wait_ms": 0.0, "grad_sync_bytes": 0},
        {"type": "status", "t": 4.0, "attempt": 1, "status": "finished", "exit_code": 0},
    ]
    for index in range(workers):
        directory = run_dir / "workers" / str(index) if index else run_dir
        directory.mkdir(parents=True)
        (directory / "trainer.log").write_text(f"log of worker {index}\n")
    with open(run_dir / "events.jsonl", "w") as fh:
        for seq, event in enumerate(events):
            fh.write(json.dumps({"v": 1, "seq": seq, **event}) + "\n")
    return run_dir


def test_ls_shows_a_cluster_runs_workers(home: Path) -> None:
    write_cluster_run(home, "1121-mwms", 2)
    listed = gpuwatch("ls", check=True).stdout
    (row,) = [line for line in listed.splitlines() if line.startswith("1121-mwms")]
    assert row.split()[2] == "finished" and row.endswith("workers=2")
    (line,) = gpuwatch("ls", "--json", check=True).stdout.splitlines()
    info = json.loads(line)
    assert info["workers"] == 2
    assert info["step"] == 0, "the run's step is the chief's: worker 1's step is not it"


def test_logs_prints_one_workers_log_and_refuses_a_worker_that_does_not_exist(
    home: Path,
) -> None:
    write_cluster_run(home, "1121-mwms", 2)
    assert gpuwatch("logs", "1121-mwms", check=True).stdout == "log of worker 0\n"
    assert gpuwatch("logs", "1121-mwms", "--worker", "1", check=True).stdout == (
        "log of worker 1\n"
    )
    missing = gpuwatch("logs", "1121-mwms", "--worker", "2")
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "gpuwatch: run 1121-mwms has no worker 2: it has workers 0 to 1"
    )


def test_headless_summary_says_how_many_workers() -> None:
    from gpuwatch.cli.headless import summary_line, workers_of
    from gpuwatch.runstate import RunState

    settings = cluster_config({"workers": 3}).model_dump(mode="json")
    assert workers_of([{"type": "attempt", "settings": settings}]) == 3
    assert workers_of([{"type": "step"}], 3) == 3
    assert workers_of([{"type": "run", "settings": RunConfig().model_dump(mode="json")}], 3) == 1
    assert " attempt=0 workers=3 " in summary_line(RunState(), 3)  # the FLOPs keys follow
    assert " workers=1 " in summary_line(RunState())


def test_a_cpu_cluster_runs_one_replica_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from gpuwatch.config import expected_replicas

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: no GPU
    assert expected_replicas(cluster_config({"workers": 3})) == 3
    assert expected_replicas(RunConfig()) == 2


def test_train_with_slurm_outside_an_allocation_says_so_and_starts_nothing(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "slurm.yaml"
    config.write_text(TINY.read_text() + "cluster:\n  launcher: slurm\n  workers: 2\n")
    proc = gpuwatch("train", str(config), "--detach")
    assert proc.returncode == 2
    assert "not inside a Slurm allocation" in proc.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


# -- commands and signals while the workers are being prepared --------------------------


def slow_prepare(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every agent's prepare takes `seconds` (an ssh login can take that long)."""
    from gpuwatch.supervisor.agent import LocalAgent

    real = LocalAgent.prepare

    async def prepare(self: LocalAgent) -> tuple[str, int]:
        await asyncio.sleep(seconds)
        return await real(self)

    monkeypatch.setattr(LocalAgent, "prepare", prepare)


async def test_a_relaunch_during_the_first_start_waits_and_leaves_one_attempts_trainers(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    slow_prepare(fake_env, 1.0)
    sup = make_supervisor(short_dir, 2)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.attempt == 1, "the first attempt to begin")
    async with RunClient(sup.socket_path) as client:
        reply = await client.command("relaunch")  # while attempt 1 is still preparing
        assert reply["attempt"] == 2
    await until(lambda: sup.status == "running", "attempt 2 to run")
    alive = trainers_of(sup.run_dir)
    assert len(alive) == 2, alive  # attempt 1's were stopped, not left beside attempt 2's
    assert {launch_of(sup, i, 2)["pid"] for i in (0, 1)} == set(alive)
    await sup.stop_run()
    assert await asyncio.wait_for(running, 30) == 0
    await no_trainer_left(sup.run_dir)


async def test_a_stop_during_prepare_starts_no_trainer_and_is_one_status(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    slow_prepare(fake_env, 1.5)
    sup = make_supervisor(short_dir, 2)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "starting", "the workers to be prepared")
    await sup.stop_run()  # as SIGTERM does
    assert await asyncio.wait_for(running, 30) == 0
    assert not trainers_of(sup.run_dir)
    assert not any((plan.worker_dir / "launch-1.json").exists() for plan in sup.plans)
    assert [s["status"] for s in statuses(sup.run_dir)] == ["starting", "stopped"]


async def test_two_local_workers_apply_a_live_change_together_in_the_same_processes(
    short_dir: Path, fake_env: pytest.MonkeyPatch
) -> None:
    fake_env.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    sup = make_supervisor(short_dir, 2)
    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "running", "every worker to say hello")
    await until(lambda: len(sup.live.worker_steps) == 2, "a step from each worker")
    pids = [agent.pid for agent in sup.agents]
    async with RunClient(sup.socket_path) as client:
        reply = await client.command("relaunch", overrides={"data.prefetch": 2})
        assert reply["attempt"] == 2 and reply["live"] is True
        assert [agent.pid for agent in sup.agents] == pids
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    events = recorded(sup.run_dir)
    answers = [e for e in events if e["type"] == "reconfigured"]
    assert sorted(e["worker"] for e in answers) == [0, 1] and all(e["ok"] for e in answers)
    assert [e["reason"] for e in events if e["type"] == "attempt"] == ["start", "live"]
    # Every worker's next step is the new attempt's, recorded after the attempt event.
    live_at = next(i for i, e in enumerate(events) if e.get("reason") == "live")
    later = [e for e in events[live_at:] if e["type"] == "step"]
    assert sorted(e["worker"] for e in later) == [0, 1] and {e["attempt"] for e in later} == {2}


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
