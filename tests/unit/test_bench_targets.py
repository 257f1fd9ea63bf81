"""bench.common: the verdict `make bench` prints next to each target (target_met), the paired ratio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import common
from bench.common import paired_ratio, target_met


def entry(value: float, unit: str, target: str, ratio: float | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"name": "x", "value": value, "unit": unit, "target": target}
    if ratio is not None:
        e["ratio"] = ratio
    return e


@pytest.mark.parametrize(("e", "want"), [
    (entry(0, "bans", "0"), True),
    (entry(1, "bans", "0"), False),
    (entry(19.9, "ms", "< 20 ms"), True),
    (entry(20.0, "ms", "< 20 ms"), False),
    (entry(0.29, "s", "< 0.3 s"), True),
    (entry(0.31, "s", "< 0.3 s"), False),
    (entry(0.05, "s", "< 100 ms"), True),       # converted: 100 ms is 0.1 s
    (entry(150, "ms", "< 0.1 s"), False),
    (entry(1.5, "s", "<= 1.5 s for 1M"), True),  # trailing words are context
    (entry(120000, "elem/s", ">= 100000"), True),
    (entry(99999, "elem/s", ">= 100,000"), False),
    (entry(9, "s", "<= 2x", ratio=1.58), True),
    (entry(9, "s", "<= 1.5x", ratio=3.5), False),
    (entry(9, "s", "ratio <= 1.10", ratio=1.28), False),
    (entry(9, "s", "\u2264 1.0\u00d7", ratio=0.8), True),
])
def test_simple_bounds(e: dict[str, Any], want: bool) -> None:
    assert target_met(e) is want


@pytest.mark.parametrize("e", [
    entry(9, "s", "<= 2x"),                      # a ratio bound without a ratio
    entry(200, "bytes", "<= 200 MB"),            # units that do not convert
    entry(1, "s", "about a second"),
])
def test_no_verdict_when_the_bound_is_not_simple(e: dict[str, Any]) -> None:
    assert target_met(e) is None


def test_paired_ratio_is_the_median_of_the_pairs_ratios() -> None:
    # a machine that got slower between pairs: the two medians fall on different pairs (0.2 / 0.1 = 2.0),
    # each pair says 1.1
    ours = [0.11, 0.22, 0.33, 0.44, 0.55]
    ref = [0.10, 0.20, 0.30, 0.40, 0.50]
    assert paired_ratio(ours, ref) == pytest.approx(1.1)
    assert paired_ratio([3.0, 1.0, 2.0], [1.0, 1.0, 1.0]) == 2.0
    with pytest.raises(ValueError, match="pairs"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="pairs"):
        paired_ratio([], [])


def test_record_keeps_a_given_ratio_and_judges_the_target_by_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results.json")
    e = common.record("x", 0.040, "s", reference="floor", reference_value=0.032, target="ratio <= 1.1",
                      ratio=1.05)
    assert e["ratio"] == 1.05  # not 0.040 / 0.032 = 1.25
    assert target_met(e) is True
    plain = common.record("y", 0.040, "s", reference="floor", reference_value=0.032, target="ratio <= 1.1")
    assert plain["ratio"] == 1.25
    assert target_met(plain) is False
