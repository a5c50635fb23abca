"""pytest plugin for running Django-Q's own suite on jobcap (loaded with -p djq_plugin).

Django-Q's tests mark themselves ``django_db``: each runs inside a transaction that is rolled
back at its end. jobcap's broker enqueues in the caller's transaction (as it must) but claims
on its own autocommit connection (claims refuse savepoints), which cannot see a task enqueued
by a transaction that has not committed. So the tests run as ``django_db(transaction=True)``:
the same tests, committing as a real application does, with the tables flushed afterwards.

Each test starts with an empty cache, as the suite's fresh Redis would give it: cluster
statistics left by an earlier test expire while listed, and Django-Q's get_stats, removing them
from the list it iterates, then skips the entry after each (test_broker would fail on that).

Two tests need a Redis server (they test Django-Q's Redis broker, which jobcap replaces) and
are skipped with that reason.
"""
import pytest

REDIS_ONLY = {
    "test_redis": "Redis specific: tests Django-Q's Redis broker against a Redis server",
    "test_custom": "Redis specific: broker_class set to Django-Q's Redis broker, needs a Redis "
                   "server",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name in REDIS_ONLY and item.fspath.basename == "test_brokers.py":
            item.add_marker(pytest.mark.skip(reason=REDIS_ONLY[item.name]))
        marker = item.get_closest_marker("django_db")
        if marker is not None and not marker.kwargs.get("transaction"):
            item.add_marker(pytest.mark.django_db(transaction=True), append=False)


@pytest.fixture(autouse=True)
def _empty_cache():
    from django.core.cache import cache
    cache.clear()
    yield
