"""Replay a recorded events.jsonl in the dashboard: ``python -m gpuwatch.app.demo_replay FILE``.

For trying the layout by hand (tmux at 80x24) without a supervisor. With
``--live`` the events after the first attempt's warm-up arrive at ``--rate``
events per second, as if the run were live.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.follow.link import ReplayLink


class PacedReplayLink(ReplayLink):
    """Replays the first ``head`` events at once, then the rest at ``rate`` per second."""

    def __init__(self, events: list[dict], head: int, rate: float) -> None:
        super().__init__(events[:head])
        self._rest = events[head:]
        self._rate = rate

    async def _feed(self) -> None:
        for event in self._rest:
            await asyncio.sleep(1.0 / self._rate)
            self.push([event])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("events", help="an events.jsonl file")
    parser.add_argument("--live", action="store_true", help="pace the events after the first 20")
    parser.add_argument("--rate", type=float, default=8.0, help="events per second with --live")
    args = parser.parse_args()
    with open(args.events, encoding="utf-8") as fh:
        events = [json.loads(line) for line in fh if line.strip()]
    last_t = max((e.get("t") or 0.0) for e in events)
    if args.live:
        link = PacedReplayLink(events, 20, args.rate)
        app = GpuwatchApp(link)

        async def start_feed() -> None:
            await link._feed()

        app.call_later(lambda: app.run_worker(start_feed(), group="demo-feed"))
    else:
        app = GpuwatchApp(ReplayLink(events), clock=lambda: last_t)
    print(app.run())


if __name__ == "__main__":
    main()
