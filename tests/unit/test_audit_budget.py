"""The audit log's per-address lines: a burst of bans is summarised, not logged line by line forever."""

from __future__ import annotations

from nftblockd.kernel.enforcer import AUDIT_LINES_PER_REQUEST, AuditBudget


def test_budget_allows_a_request_then_refills_over_time() -> None:
    now = [100.0]
    b = AuditBudget(burst=50, rate=10, clock=lambda: now[0])
    assert b.take(3) == 3  # the usual case: every ban is logged
    assert b.take(100) == 47  # a bulk request: the rest of the bucket, then a summary line
    assert b.take(5) == 0  # a flood of small requests right after: summarised too
    now[0] += 0.5
    assert b.take(10) == 5  # refilled at 10 a second
    now[0] += 3600
    assert b.take(1000) == 50  # never more than the burst, however long it was idle


def test_defaults_keep_the_per_request_cap() -> None:
    assert AuditBudget().take(10**6) == AUDIT_LINES_PER_REQUEST
