"""The README opens with the two commands, CI runs the second one verbatim, and every
example, key, link and the screenshot in it are true of this tree."""

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


def test_the_three_launcher_examples_are_valid_configs() -> None:
    import yaml

    from trainer_runtime.schema import RunConfig

    text = (ROOT / "docs" / "clusters.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "cluster" in b]
    # One example per launcher, each starting at its comment.
    examples = [part for part in re.split(r"\n(?=# \w+:)", block.strip()) if "cluster" in part]
    launchers = []
    for example in examples:
        config = RunConfig.model_validate(yaml.safe_load(example))
        assert config.cluster is not None
        launchers.append(config.cluster.launcher)
    assert launchers == ["local", "ssh", "slurm"]


def test_the_readme_is_a_first_page() -> None:
    """At most about 120 lines: what it is, the commands, the screen, the ways in, the
    keys; the rest is in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120


def _links(path: Path) -> list[str]:
    text = path.read_text()
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
            if "://" not in t and not t.startswith("mailto:")]


def test_every_local_link_of_the_readme_and_docs_leads_somewhere() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages
              for target in _links(page) if not (page.parent / target).exists()]
    assert broken == []
    linked = {(ROOT / target).resolve() for target in _links(ROOT / "README.md")}
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked]
    assert unlinked == [], "every docs page is reachable from the README"


def _shell_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)[2:]  # after the two commands
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_ways_in_are_commands_gpuwatch_takes_on_configs_that_load() -> None:
    import shlex

    from gpuwatch.cli import parse_words
    from gpuwatch.cli.parser import build_parser
    from gpuwatch.config import load_config

    examples = _shell_examples()
    commands = []
    for line in examples:
        words = shlex.split(line)
        assert words[0] == "gpuwatch", line
        args = parse_words(build_parser(), words[1:])
        commands.append(args.command)
        if getattr(args, "config", None):
            load_config(ROOT / args.config, args.overrides)  # raises on a wrong key or value
    # train, run (a script, and a multi-worker one on its workers), scale
    assert commands == ["train", "run", "run", "scale"]


def test_the_key_table_is_the_apps_keys() -> None:
    from gpuwatch.app import keys

    text = (ROOT / "README.md").read_text()
    table = text.split("## Keys", 1)[1].split("\n## ", 1)[0]
    shown = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            shown.update(re.findall(r"`([^`]+)`", row.split("|")[1]))
    bound = {"?" if b.key == "question_mark" else b.key for b in keys.BINDINGS
             if hasattr(b, "key") and b.key != "ctrl+c"}
    assert shown == bound


def test_the_screenshot_is_the_recorded_demo_run_drawn_again(tmp_path) -> None:
    """docs/screenshot.svg is what demo/screenshot.py draws from the recorded run: the
    picture is real, and anyone can make it again."""
    import asyncio
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshot", ROOT / "demo" / "screenshot.py")
    assert spec is not None and spec.loader is not None
    screenshot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(screenshot)
    events = screenshot.events_until(screenshot.RECORD, screenshot.STEP)
    assert {"run", "hello", "step", "sample"} <= {event["type"] for event in events}
    drawn = asyncio.run(screenshot.draw(events))
    assert drawn == (ROOT / "docs" / "screenshot.svg").read_text(encoding="utf-8")
    assert "docs/screenshot.svg" in (ROOT / "README.md").read_text()
