"""Draw the README's screenshot: the real dashboard at 80x24, from a recorded demo run.

demo/recorded/demo-run.jsonl.gz is the events.jsonl of a real run of the demo
(`gpuwatch train demo/demo.yaml --headless --max-steps 900` on a 2-core box with no GPU,
prefetch off, as the demo starts). This replays it into the dashboard up to a step of the
run (its events after that step are left out, so the screen is of the run live, mid-way),
with the clock stopped at that step's time, and saves what Textual draws as an SVG:

    .venv/bin/python demo/screenshot.py [--step 600] [-o docs/screenshot.svg]

The same record always draws the same picture (tests/test_readme.py checks it).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "demo" / "recorded" / "demo-run.jsonl.gz"
SCREENSHOT = ROOT / "docs" / "screenshot.svg"
SIZE = (80, 24)
STEP = 600
TITLE = "gpuwatch train demo/demo.yaml"


def events_until(record: Path, step: int) -> list[dict[str, Any]]:
    """The record's events up to and including the chief's first step >= `step`."""
    with gzip.open(record, "rt", encoding="utf-8") as fh:
        events = [json.loads(line) for line in fh if line.strip()]
    for index, event in enumerate(events):
        if event.get("type") == "step" and event.get("step", 0) >= step:
            return events[: index + 1]
    raise SystemExit(f"{record}: no step {step} in the record")


async def draw(events: list[dict[str, Any]], size: tuple[int, int] = SIZE) -> str:
    """The dashboard's screen after folding `events`, as SVG."""
    from gpuwatch.app.app import GpuwatchApp
    from gpuwatch.follow.link import ReplayLink

    now = max(float(event.get("t") or 0.0) for event in events)
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=lambda: now)
    async with app.run_test(size=size) as pilot:
        await link.wait_idle()
        await pilot.pause()
        app.refresh_view(flush=True)
        await pilot.pause()
        return app.export_screenshot(title=TITLE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, default=RECORD)
    parser.add_argument("--step", type=int, default=STEP, help="the step the screen shows")
    parser.add_argument("-o", "--output", type=Path, default=SCREENSHOT)
    args = parser.parse_args()
    svg = asyncio.run(draw(events_until(args.record, args.step)))
    args.output.write_text(svg, encoding="utf-8")
    print(f"{args.output}: {len(svg):,} bytes, step {args.step} of {args.record.name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
