"""The header at 80 columns: the status and the link's state always whole, whatever the
run's id and name; the less important parts give way first."""

from __future__ import annotations

from typing import Any

import pytest
from rich.cells import cell_len

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.header import HeaderBar, header_text
from gpuwatch.follow.link import ReplayLink, link_event
from gpuwatch.runstate import RunState

from .conftest import SIZE, frozen_clock_for, load_events, settle

LONG_ID = "0612-kq7m-sweep-lr-0.001-batch-1024"
LONG_NAME = "resnet50-imagenet-mixed-precision-gradient-accumulation-sweep"


def renamed(run_id: str, name: str) -> list[dict[str, Any]]:
    """The one-attempt recording (status running), as run `run_id` named `name`."""
    events = load_events("cpu_one_attempt.jsonl")
    for event in events:
        if event["type"] == "run":
            event["run_id"] = run_id
        if event["type"] in ("run", "attempt"):
            event["settings"] = {**event["settings"], "name": name}
    return events


def shown_line(app: GpuwatchApp) -> str:
    """The header's row as the terminal shows it (one row: what wraps is not seen)."""
    header = app.query_one(HeaderBar)
    assert header.region.height == 1
    return header.render_line(0).text


@pytest.mark.parametrize("link_state", ["lost", "reconnecting"])
async def test_at_80_columns_a_long_id_and_name_never_cut_the_status_or_the_link(link_state):
    events = renamed(LONG_ID, LONG_NAME)
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        link.push([link_event(link_state, "the supervisor closed the connection")])
        await settle(app, link, pilot)
        line = shown_line(app)
        plain = app.query_one(HeaderBar).plain
        assert "\n" not in plain and cell_len(plain) <= SIZE[0], plain
        assert plain == line.rstrip() or line.startswith(plain)
        assert " running " in line
        assert line.rstrip().endswith(f" link {link_state}")
        assert LONG_ID in line, "the run id fits once the name and the elapsed time gave way"
        # The name gave way first: cut short with an ellipsis, or gone.
        assert LONG_NAME not in line
        name_part = line.split(LONG_ID, 1)[1].split("  attempt")[0].strip()
        assert name_part == "" or (
            name_part.endswith("…") and LONG_NAME.startswith(name_part[:-1])
        ), name_part


def state_named(run_id: str, name: str, link_state: str | None = None) -> RunState:
    state = RunState()
    state.apply_many(renamed(run_id, name))
    if link_state:
        state.apply(link_event(link_state))
    return state


def recorded_now_and_elapsed() -> tuple[float, str]:
    """The frozen clock (the recording's last event) and the run's age then, as m:ss."""
    events = load_events("cpu_one_attempt.jsonl")
    now = frozen_clock_for(events)()
    (run,) = [e for e in events if e["type"] == "run"]
    age = int(now - run["created"])
    return now, f"{age // 60}:{age % 60:02d}"


def test_the_header_keeps_everything_when_it_fits():
    state = state_named("0612-kq7m", "mnist-mlp")
    now, elapsed = recorded_now_and_elapsed()
    text = header_text(state, now, 80).plain
    assert text == f" gpuwatch  0612-kq7m  mnist-mlp  attempt 1   running   elapsed {elapsed}"


def test_the_header_gives_way_in_order_as_it_narrows():
    state = state_named("0612-kq7m", "mnist-mlp-with-a-longer-name", "reconnecting")
    now, elapsed = recorded_now_and_elapsed()
    full = header_text(state, now, 0).plain
    assert full == (
        " gpuwatch  0612-kq7m  mnist-mlp-with-a-longer-name  attempt 1   running "
        f"  elapsed {elapsed}   link reconnecting "
    )
    forms: list[tuple[bool, str, bool, bool, str]] = []
    whole = len(" running ") + len("  ") + len(" link reconnecting ")
    for width in range(len(full), whole - 1, -1):
        text = header_text(state, now, width).plain
        assert cell_len(text) <= width, (width, text)
        assert " running " in text and text.endswith(" link reconnecting "), (width, text)
        assert "…" not in text.split("running")[1], "the status and the link are never cut"
        name = "whole" if "-longer-name " in text else "cut" if "mnist-" in text else ""
        run_id = "whole" if "0612-kq7m " in text else "cut" if " 0" in text else ""
        form = (text.startswith(" gpuwatch "), name, "elapsed" in text, "attempt 1" in text,
                run_id)
        if not forms or forms[-1] != form:
            forms.append(form)
    # The mark, then the name (cut, then gone), the elapsed time, "attempt", the run id.
    assert forms == [
        (True, "whole", True, True, "whole"),
        (False, "whole", True, True, "whole"),
        (False, "cut", True, True, "whole"),
        (False, "", True, True, "whole"),
        (False, "", False, True, "whole"),
        (False, "", False, False, "whole"),
        (False, "", False, False, "cut"),
        (False, "", False, False, ""),  # only the status and the link
    ]


async def test_an_ended_runs_header_fits_again_when_the_terminal_narrows():
    # An ended run's clock no longer ticks: the header refits on its own resize.
    events = renamed(LONG_ID, LONG_NAME)
    crashed = next(e for e in load_events("cpu_crashed.jsonl") if e.get("status") == "crashed")
    events.append({**crashed, "seq": events[-1]["seq"] + 1, "t": events[-1]["t"] + 1})
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=(200, 24)) as pilot:
        await settle(app, link, pilot)
        assert LONG_NAME in shown_line(app)
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        line = shown_line(app)
        assert " crashed " in line and LONG_NAME not in line
        assert cell_len(app.query_one(HeaderBar).plain) <= SIZE[0]
