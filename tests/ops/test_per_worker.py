"""`make test`'s two pytest-xdist workers each take Redis databases of their own
(`ledger.settings.test.per_worker`), or the run stops before a test shares one."""

import pytest

from ledger.settings.test import per_worker, workers_apart


@pytest.mark.parametrize(
    ("worker", "url", "mine"),
    [
        ("", "redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/15"),
        ("gw0", "redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/15"),
        ("gw1", "redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/14"),
        ("gw1", "redis://:pw@h:6379/11", "redis://:pw@h:6379/10"),
        ("gw1", "rediss://h:6380/3", "rediss://h:6380/2"),
        (
            "gw1",
            "redis://h:6379/15?socket_timeout=5",
            "redis://h:6379/14?socket_timeout=5",
        ),
        ("gw1", "", ""),  # a run without Redis (`REDIS_URL=`)
        # A plain run takes any URL as it is (a cluster's, a socket's).
        ("", "redis://h:6379", "redis://h:6379"),
        ("", "unix:///run/redis.sock?db=3", "unix:///run/redis.sock?db=3"),
    ],
)
def test_each_worker_takes_the_database_its_number_below(
    monkeypatch, worker, url, mine
):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert per_worker(url) == mine


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",  # none below it
        # No database named (0, for redis-py): taken as it is, both workers shared
        # it, and one emptying it emptied the other's.
        "redis://127.0.0.1:6379",
        "redis://127.0.0.1:6379/",
        "unix:///run/redis.sock?db=3",
    ],
)
def test_a_url_a_second_worker_cannot_take_its_own_of_stops_the_run(monkeypatch, url):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    with pytest.raises(ValueError, match="worker gw1"):
        per_worker(url)


@pytest.mark.parametrize(
    ("count", "cache", "broker"),
    [
        ("1", "redis://h/1", "redis://h/1"),
        # REDIS_URL=.../2, TEST_BROKER_URL=.../3: the second worker's broker
        # (2) was the first worker's cache, which its tests empty.
        ("2", "redis://h/2", "redis://h/3"),
        ("2", "redis://h/3", "redis://h/2"),
    ],
)
def test_databases_the_workers_would_share_stop_the_run(
    monkeypatch, count, cache, broker
):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    with pytest.raises(ValueError, match="share"):
        workers_apart(cache, broker)


@pytest.mark.parametrize(
    ("count", "cache", "broker"),
    [
        ("", "redis://h/15", "redis://h/11"),  # a plain run
        ("2", "redis://h/15", "redis://h/11"),  # make test's: 15, 14 and 11, 10
        ("2", "redis://h/2", "redis://h/4"),
        ("2", "redis://a/2", "redis://b/3"),  # two servers
        ("2", "", "redis://h/11"),  # a run without Redis for the app
    ],
)
def test_databases_apart_are_taken(monkeypatch, count, cache, broker):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    workers_apart(cache, broker)
