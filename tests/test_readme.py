"""The README opens with the two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, flags=re.S)
    return [block.strip() for block in blocks[:2]]


def test_readme_opens_with_demo_then_tests() -> None:
    demo, tests = _readme_commands()
    assert "gpuwatch train demo/demo.yaml" in demo
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    marked = re.search(r"# README test command >>>\n(.*?)\n# <<< README test command", ci, re.S)
    assert marked is not None, ".ci/run lost its README markers"
    assert marked.group(1).strip() == _readme_commands()[1]


def test_the_readmes_three_launcher_examples_are_valid_configs() -> None:
    import yaml

    from trainer_runtime.schema import RunConfig

    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "cluster" in b]
    # One example per launcher, each starting at its comment.
    examples = [part for part in re.split(r"\n(?=# \w+:)", block.strip()) if "cluster" in part]
    launchers = []
    for example in examples:
        config = RunConfig.model_validate(yaml.safe_load(example))
        assert config.cluster is not None
        launchers.append(config.cluster.launcher)
    assert launchers == ["local", "ssh", "slurm"]
