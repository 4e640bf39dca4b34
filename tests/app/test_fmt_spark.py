"""fmt.spark_rows: the history panel's sparklines, scaled to the data's range."""

from __future__ import annotations

from gpuwatch.app import fmt


def test_one_row_spans_the_eight_bars_from_the_least_to_the_greatest():
    # 0..7 over a range of 7: level k is bar k (▁ for the least, █ for the greatest).
    assert fmt.spark_rows([float(v) for v in range(8)], 8) == ["▁▂▃▄▅▆▇█"]
    # An offset and a scale change nothing: the range is the data's, not 0 to the top.
    assert fmt.spark_rows([1000.0 + 10 * v for v in range(8)], 8) == ["▁▂▃▄▅▆▇█"]


def test_fewer_values_than_columns_are_right_aligned_newest_last():
    assert fmt.spark_rows([1.0, 2.0], 5) == ["   ▁█"]
    assert fmt.spark_rows([], 4) == ["    "]
    assert fmt.spark_rows([], 4, rows=2) == ["    ", "    "]


def test_a_flat_series_is_a_row_of_the_lowest_bar():
    assert fmt.spark_rows([5.0] * 6, 6) == ["▁▁▁▁▁▁"]


def test_more_values_than_columns_show_the_greatest_of_each_even_share():
    # 12 values in 4 columns: 3 a column; the greatest of each is 3, 0, 9, 6.
    values = [1.0, 3.0, 2.0, 0.0, 0.0, 0.0, 9.0, 4.0, 5.0, 6.0, 6.0, 1.0]
    # Levels over 0..9 in 8 steps: int(v / 9 * 7): 3 -> 2, 0 -> 0, 9 -> 7, 6 -> 4.
    assert fmt.spark_rows(values, 4) == ["▃▁█▅"]


def test_taller_sparklines_stack_full_blocks_under_the_partial_one():
    # Two rows: 16 levels. 0 -> level 0 (bottom ▁), 15 -> level 15 (full, full),
    # 7.5 -> level int(0.5 * 15) = 7: bottom row bar 7 (█), top row empty.
    rows = fmt.spark_rows([0.0, 7.5, 15.0], 3, rows=2)
    assert rows == [
        "  █",
        "▁██",
    ]
    # 10 of 15 -> level int(10 / 15 * 15) = 10: bottom full, top bar 10 - 8 = 2 (▃).
    assert fmt.spark_rows([0.0, 10.0, 15.0], 3, rows=2)[0] == " ▃█"


def test_no_room_is_empty_lines():
    assert fmt.spark_rows([1.0, 2.0], 0, rows=3) == ["", "", ""]


def test_values_that_are_not_finite_get_no_bar():
    # An infinite rate (a step of 1e-310 ms) or NaN: left out, the rest scaled as before.
    assert fmt.spark_rows([0.0, float("inf"), 7.0, float("nan")], 4) == ["  ▁█"]
