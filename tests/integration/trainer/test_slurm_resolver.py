"""TF_CONFIG from a Slurm step's environment (TensorFlow's SlurmClusterResolver), and its checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_runtime.cluster import (
    ClusterError,
    check_tf_config,
    resolve_tf_config,
    tf_config_from_slurm,
)
from trainer_runtime.schema import ClusterConfig

ROOT = Path(__file__).resolve().parents[3]


def _slurm_env(monkeypatch: pytest.MonkeyPatch, procid: int, nodes: str = "gpu[07-08]",
               tasks: int = 2, per_node: str = "1(x2)") -> dict[str, str]:
    env = {"SLURM_PROCID": str(procid), "SLURM_STEP_NODELIST": nodes,
           "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_STEP_NUM_TASKS": str(tasks)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.mark.parametrize("procid", [0, 1])
def test_slurm_step_gives_one_worker_per_node_on_the_port_base(
        monkeypatch: pytest.MonkeyPatch, procid: int) -> None:
    env = _slurm_env(monkeypatch, procid)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    tf_config = tf_config_from_slurm(env, port_base=9123, gpus=0)
    assert tf_config == {"cluster": {"worker": ["gpu07:9123", "gpu08:9123"]},
                         "task": {"type": "worker", "index": procid}}
    # auto_set_gpu off: TensorFlow has seen the GPUs by now, setting it would mislead.
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_slurm_step_read_from_os_environ_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    # The trainer hands over os.environ (a real srun step found it read back empty).
    _slurm_env(monkeypatch, 1)
    tf_config = tf_config_from_slurm(os.environ, port_base=9123, gpus=0)
    assert tf_config["task"] == {"type": "worker", "index": 1}
    assert os.environ["SLURM_STEP_NODELIST"] == "gpu[07-08]"


def test_slurm_with_gpus_and_two_tasks_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _slurm_env(monkeypatch, 3, nodes="n[1-2]", tasks=4, per_node="2(x2)")
    tf_config = tf_config_from_slurm(env, port_base=8888, gpus=4)
    assert tf_config["cluster"]["worker"] == ["n1:8888", "n1:8889", "n2:8888", "n2:8889"]
    assert tf_config["task"] == {"type": "worker", "index": 3}


def test_resolve_under_launcher_slurm_uses_the_first_port_and_checks_the_index(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = _slurm_env(monkeypatch, 1)
    cluster = ClusterConfig.model_validate({"launcher": "slurm", "workers": 2,
                                            "ports": [7000]})
    tf_config = resolve_tf_config(cluster, 1, env, gpus=0)
    assert tf_config["cluster"]["worker"] == ["gpu07:7000", "gpu08:7000"]
    with pytest.raises(ClusterError, match="task index 1 but this is --worker 0"):
        resolve_tf_config(cluster, 0, env, gpus=0)


def test_missing_slurm_variable_is_a_cluster_error(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _slurm_env(monkeypatch, 0)
    del env["SLURM_STEP_NODELIST"]
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    with pytest.raises(ClusterError, match="launcher slurm"):
        tf_config_from_slurm(env)


@pytest.mark.parametrize(("text", "match"), [
    (None, "TF_CONFIG is not set"),
    ("{", "not JSON"),
    ('{"cluster": {}}', '"worker"'),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "ps", "index": 0}}', '"task"'),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}',
     "task index 1 but this is --worker 0"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}',
     "lists 1 workers but cluster.workers has 2"),
])
def test_bad_tf_config_is_one_line_reason(text: str | None, match: str) -> None:
    cluster = ClusterConfig.model_validate({"workers": 2})
    with pytest.raises(ClusterError, match=match):
        check_tf_config(text, cluster, 0)


@pytest.mark.slow
def test_trainer_with_bad_tf_config_exits_2_with_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"train": {"global_batch_size": 64},
                                  "cluster": {"workers": 2, "timeout_s": 5}}))
    tf_config = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
                 "task": {"type": "worker", "index": 0}}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_runtime", "--run-dir", str(tmp_path), "--config",
         str(config), "--worker", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CONFIG": json.dumps(tf_config)},
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: TF_CONFIG says task index 0 but this is --worker 1"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_commands_worker_under_launcher_slurm_is_resolved_as_srun_across_the_nodes(
        monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    # gpuwatch run --set cluster.launcher=slurm: each worker's agent is a one-task step of
    # its own; the command gets the step variables of the whole cluster
    # (gpuwatch/supervisor/cluster.py: slurm_step_env), so a script's own
    # SlurmClusterResolver sees every worker, in gpuwatch's order, itself at its index.
    from gpuwatch.supervisor.cluster import slurm_step_env

    env = slurm_step_env(["node01", "node02", "node03"], index)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    tf_config = tf_config_from_slurm(env, port_base=9123, gpus=0)
    assert tf_config == {"cluster": {"worker": ["node01:9123", "node02:9123", "node03:9123"]},
                         "task": {"type": "worker", "index": index}}
