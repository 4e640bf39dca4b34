"""The repaint schedule (pure): each part repaints when what it reads changed, at its rate."""

from __future__ import annotations

from gpuwatch.app.repaint import Painter, Rate, RepaintSchedule


def make(*painters: tuple[str, dict[str, Rate]]) -> tuple[RepaintSchedule, list[str]]:
    painted: list[str] = []
    schedule = RepaintSchedule(
        Painter(name, areas, lambda name=name: painted.append(name)) for name, areas in painters
    )
    return schedule, painted


def paint(schedule: RepaintSchedule, now_s: float, **kwargs: object) -> list[str]:
    due = schedule.take_due(now_s, **kwargs)  # type: ignore[arg-type]
    for painter in due:
        painter.paint()
    return [p.name for p in due]


def test_every_part_paints_first_then_only_on_changes_it_reads():
    schedule, _ = make(("metrics", {"metrics": Rate(0.4)}), ("devices", {"devices": Rate(0.4)}))
    assert paint(schedule, 0.0) == ["metrics", "devices"]  # added: painted once at the start
    assert paint(schedule, 5.0) == []  # nothing changed since
    schedule.note({"devices", "pending"})  # an area no part here reads is ignored
    assert paint(schedule, 6.0) == ["devices"]
    assert schedule.next_deadline_s() is None


def test_changes_within_the_interval_wait_and_are_painted_once():
    schedule, painted = make(("metrics", {"metrics": Rate(0.4)}))
    paint(schedule, 10.0)
    for now in (10.1, 10.2, 10.3):
        schedule.note({"metrics"})
        assert paint(schedule, now) == []
    assert schedule.next_deadline_s() == 10.4
    assert paint(schedule, 10.4) == ["metrics"]
    assert painted == ["metrics", "metrics"]  # the start, then three changes in one repaint


def test_a_slow_part_joins_a_repaint_of_others_once_due_and_forces_one_only_when_late():
    schedule, _ = make(
        ("metrics", {"metrics": Rate(0.4)}), ("history", {"history": Rate(2.0, late_s=0.5)})
    )
    paint(schedule, 0.0)
    schedule.note({"metrics", "history"})
    assert paint(schedule, 1.0) == ["metrics"]  # history is not due before 2.0
    schedule.note({"metrics", "history"})
    assert paint(schedule, 2.1) == ["metrics", "history"]  # due: it rides along
    schedule.note({"history"})
    # Nothing else repaints: history's own deadline is its rate plus the lateness.
    assert schedule.next_deadline_s() == 2.1 + 2.5
    assert paint(schedule, 4.0) == []
    assert paint(schedule, 4.1) == ["history"]


def test_a_change_read_at_two_rates_takes_the_faster():
    schedule, _ = make(("devices", {"devices": Rate(0.4), "metrics": Rate(2.0, late_s=0.5)}))
    paint(schedule, 0.0)
    schedule.note({"metrics"})
    assert schedule.next_deadline_s() == 2.5
    schedule.note({"devices"})  # a new sample: the fast rate now
    assert schedule.next_deadline_s() == 0.4
    assert paint(schedule, 0.4) == ["devices"]
    assert schedule.next_deadline_s() is None  # its slow change was painted with it


def test_slack_paints_a_nearly_due_part_now_and_everything_ignores_rates():
    schedule, _ = make(("a", {"x": Rate(1.0)}), ("b", {"y": Rate(1.0)}))
    paint(schedule, 0.0)
    schedule.note({"x"})
    assert paint(schedule, 0.96) == []
    assert paint(schedule, 0.96, slack_s=0.05) == ["a"]
    schedule.note({"x", "y"})
    assert paint(schedule, 1.0, everything=True) == ["a", "b"]  # an explicit repaint


def test_a_part_added_later_paints_at_the_next_pass():
    schedule, _ = make(("metrics", {"metrics": Rate(0.4)}))
    paint(schedule, 0.0)
    schedule.add(Painter("gpu history", {"devices": Rate(1.0)}, lambda: None))
    assert paint(schedule, 0.1) == ["gpu history"]
