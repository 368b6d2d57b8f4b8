"""Every query that runs on a clock (beat's tasks, a `/metrics` scrape) finds its rows
through an index, so that it costs the same with ten million payments as with ten.

Beat re-drives what was lost (pending payments, refunds, shipments, cancels at the
provider, provider events) every minute, and the rows it looks for are a handful
among all the payments, refunds and shipments ever made. A query that reads the
whole table to find them slows down as the business grows, every minute, for ever.

Each task runs once on empty tables with sequential scans switched off (the
planner then only takes them if nothing else can find the rows): a plan that still
reads a whole table, or walks a whole index filtering what it reads, has no index
to use.
`check_invariants` is left out: it audits every account and every posting by design.
"""

import importlib
import json

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import get_resolver

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
        reason="PostgreSQL's planner",
    ),
]

AUDITS = {"ledger.tasks.check_invariants"}  # reads everything on purpose

# What the planner adds to the cost of a path that is switched off.
DISABLED = 1e10


def _plan(cursor, sql: str, switched_off: list[str]) -> dict:
    for setting in switched_off:
        cursor.execute(f"SET LOCAL {setting} = off")
    cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
    (document,) = cursor.fetchone()
    for setting in switched_off:
        cursor.execute(f"RESET {setting}")
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def _whole_reads(plan: dict) -> list[str]:
    """Sequential scans, and walks of a whole index that filter what they read."""
    kind = plan["Node Type"]
    found = []
    if kind == "Seq Scan" or (
        kind in {"Index Scan", "Index Only Scan"}
        and "Index Cond" not in plan
        and "Filter" in plan
    ):
        found.append(f"{kind} on {plan['Relation Name']}")
    for child in plan.get("Plans", []):
        found += _whole_reads(child)
    return found


def _reads_a_whole_table(cursor, sql: str) -> list[str]:
    """Why `sql` cannot find its rows through an index; empty if it can.

    First with only bitmap scans allowed, which need a condition that an index
    serves (its columns, or a partial index's predicate), and joins by nested loop,
    whose inner scan takes its condition from the outer row: on empty tables the
    planner otherwise likes to walk the primary key to the LIMIT, or to hash a whole
    table, which says nothing of the plan a table of millions of rows gets. Then,
    for what needs an ordered walk (the last row by an index), with index scans
    allowed again, as long as they do not filter the whole index.
    """
    only_bitmaps = [
        "enable_seqscan",
        "enable_indexscan",
        "enable_indexonlyscan",
        "enable_hashjoin",
        "enable_mergejoin",
    ]
    if _plan(cursor, sql, only_bitmaps)["Total Cost"] < DISABLED:
        return []
    return _whole_reads(_plan(cursor, sql, ["enable_seqscan"]))


def _unindexed(queries: list[dict]) -> list[str]:
    problems = []
    with transaction.atomic(), connection.cursor() as cursor:
        # Statistics of this test's tables, not of what earlier tests left in them
        # (the planner weighs plans by them; flushed tables keep stale ones).
        cursor.execute("ANALYZE")
        for query in queries:
            sql = query["sql"]
            if sql.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
                problems += [
                    f"{read}: {sql[:300]}" for read in _reads_a_whole_table(cursor, sql)
                ]
    return problems


TASKS = sorted(
    {str(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()} - AUDITS
)


@pytest.mark.parametrize("task", TASKS)
def test_every_periodic_task_reads_through_an_index(task: str):
    assert get_resolver().url_patterns  # the views register what the completer resumes
    module, _, name = task.rpartition(".")
    with CaptureQueriesContext(connection) as captured:
        getattr(importlib.import_module(module), name).apply().get()
    assert captured.captured_queries, "the task sent no query: nothing was checked"
    assert _unindexed(captured.captured_queries) == []


def test_a_metrics_scrape_reads_through_indexes():
    with CaptureQueriesContext(connection) as captured:
        assert Client().get("/metrics").status_code == 200
    assert _unindexed(captured.captured_queries) == []
