"""strategy.replicas: how many devices a run trains on, checked before anything starts.

null: every visible GPU, or strategy.cpu_replicas logical CPU replicas with no GPU (as
before the setting existed); N: the first N GPUs, or N logical CPU replicas. More GPUs
than are visible is one line naming the key, from `gpuwatch train` (and the trainer, in
tests/integration/trainer/test_replicas_devices.py). It is a relaunch setting: never live.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch import cli
from gpuwatch.config import (
    ConfigError,
    apply_overrides,
    check_devices,
    expected_replicas,
    load_config,
)
from gpuwatch.runstate import pending_applies_live
from tests.config.test_config import fake_nvml
from tests.conftest import TINY
from trainer_runtime.changes import LIVE_KEYS
from trainer_runtime.schema import RunConfig, StrategyConfig, gpu_shortage, replica_count


@pytest.mark.parametrize(
    ("replicas", "cpu_replicas", "gpus", "expected"),
    [
        (None, 2, 0, 2),  # no GPU: the CPU replicas, as every config before the setting
        (None, 3, 4, 4),  # every GPU
        (2, 3, 4, 2),  # the first two GPUs
        (5, 2, 0, 5),  # five logical CPU replicas
        (1, 2, 0, 1),
    ],
)
def test_replica_count_rule(replicas: int | None, cpu_replicas: int, gpus: int,
                            expected: int) -> None:
    strategy = StrategyConfig(replicas=replicas, cpu_replicas=cpu_replicas)
    assert replica_count(strategy, gpus) == expected


def test_more_gpus_than_visible_is_a_shortage_naming_the_key() -> None:
    assert gpu_shortage(StrategyConfig(replicas=4), 4) is None
    assert gpu_shortage(StrategyConfig(replicas=64), 0) is None  # logical CPU replicas
    assert gpu_shortage(StrategyConfig(), 2) is None
    problem = gpu_shortage(StrategyConfig(replicas=4), 2)
    assert problem is not None and problem.startswith("strategy.replicas: 4 GPUs asked for")
    assert "2 are visible" in problem and "\n" not in problem


def test_expected_replicas_reads_strategy_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml(monkeypatch, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert expected_replicas(apply_overrides(RunConfig(), {"strategy.replicas": 2})) == 2
    assert expected_replicas(RunConfig()) == 4
    fake_nvml(monkeypatch, 0)
    assert expected_replicas(apply_overrides(RunConfig(), {"strategy.replicas": 3})) == 3


def test_check_devices_names_the_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: x\nstrategy:\n  replicas: 4\n")
    loaded = load_config(path)
    with pytest.raises(ConfigError) as refused:
        check_devices(loaded.config, loaded.where("strategy.replicas"), gpus=2)
    assert str(refused.value).startswith(f"{path}:3: strategy.replicas: 4 GPUs asked for")
    assert refused.value.key == "strategy.replicas"
    check_devices(loaded.config, "x", gpus=4)
    check_devices(loaded.config, "x", gpus=0)


def test_gpuwatch_train_refuses_more_gpus_than_visible_in_one_line(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_nvml(monkeypatch, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code = cli.main(["train", str(TINY), "--set", "strategy.replicas=4", "--headless"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (
        "gpuwatch: --set strategy.replicas=4: strategy.replicas: 4 GPUs asked for, but 2 are "
        "visible here (CUDA_VISIBLE_DEVICES narrows them); set strategy.replicas to at most 2, "
        "or leave it out to use every GPU"
    )
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_cluster_takes_workers_not_strategy_replicas(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: x\nstrategy:\n  replicas: 2\ncluster:\n  workers: 2\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path}:3: strategy.replicas: ")
    assert "cluster.workers" in str(refused.value)


def test_replicas_is_a_relaunch_setting_not_a_live_one() -> None:
    assert "strategy.replicas" not in LIVE_KEYS
    settings = RunConfig().model_dump(mode="json")
    assert not pending_applies_live(settings, {"strategy.replicas": 1}, running=True)
    assert pending_applies_live(settings, {"data.prefetch": True}, running=True)


def test_a_batch_that_does_not_split_over_the_replicas_asked_for_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tiny.yaml: global batch 64; 3 replicas cannot split it.
    code = cli.main(["train", str(TINY), "--set", "strategy.replicas=3", "--headless"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("gpuwatch: --set strategy.replicas=3: ")
    assert "not divisible by replicas x accumulation_steps = 3 x 1 = 3" in err
