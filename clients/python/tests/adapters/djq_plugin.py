"""pytest plugin for running Django-Q's own suite (loaded with -p djq_plugin), on the jobcap
broker or, for comparison, on Django-Q's Redis broker (JOBCAP_TEST_BROKER=redis): the same
marks on both.

Django-Q's tests mark themselves ``django_db``: each runs inside a transaction that is rolled
back at its end. jobcap's broker enqueues in the caller's transaction (as it must) but claims
on its own autocommit connection (claims refuse savepoints), which cannot see a task enqueued
by a transaction that has not committed. So the tests run as ``django_db(transaction=True)``,
on both brokers: the same tests, committing as a real application does, with the tables
flushed afterwards.

test_recycle is expected to fail on both brokers, on PostgreSQL (3 == 1): it counts on the
three results its Sentinel's processes save being lost. The suite's own settings use SQLite,
whose in-memory test database each forked process of the Sentinel has a private copy of (Django
never closes an in-memory SQLite connection): there they are saved where the test never looks,
and its last assertion (one Success row after SAVE_LIMIT is set to 1) holds. On PostgreSQL they
are committed and counted, and Django-Q's pruning (one row per saved success) leaves 3. Run
non-transactionally on PostgreSQL it fails on both as well ("connection already closed": the
Sentinel closes the test's connection). Marked xfail (strict) with that reason, on both;
djq_recycle_probe.py shows it (0 rows after the Sentinel on SQLite, 3 on PostgreSQL).

Four tests test another of Django-Q's brokers, whichever broker the run is for: test_redis and
test_custom (test_brokers.py) Django-Q's Redis broker (a Redis server at the suite's address,
broker_class set to Django-Q's Redis class), and two of test_scheduler.py Django-Q's ORM broker
(their fixture sets Conf.ORM, and they assert on the ORM broker's connection, a queryset). On
the jobcap run, broker_class comes first in Django-Q's get_broker, so they would test jobcap's
broker for what only those brokers have: they are skipped, recorded as "other broker".

The test process's own broker connections are closed before pytest-django drops the test
database (jobcap.contrib.django_q.close_connections), as a connection to it would stop the drop.

Each test's outcome is written to $JOBCAP_DJQ_OUTCOMES (JSON) for run_django_q_suite.py.
"""
import json
import os

import pytest

OTHER_BROKER = {
    ("test_brokers.py", "test_redis"):
        "tests Django-Q's Redis broker against a Redis server",
    ("test_brokers.py", "test_custom"):
        "broker_class set to Django-Q's Redis broker, needs a Redis server",
    ("test_scheduler.py",
     "test_scheduler_atomic_transaction_must_specify_a_database_when_no_replicas_are_used"):
        "tests Django-Q's ORM broker (Conf.ORM; asserts on its connection, a queryset)",
    ("test_scheduler.py",
     "test_scheduler_atomic_transaction_must_specify_the_database_based_on_router_redirection"):
        "tests Django-Q's ORM broker (Conf.ORM; asserts on its connection, a queryset)",
}

RECYCLE = ("on PostgreSQL the 3 results saved by the Sentinel's processes are committed and "
           "counted by the final Success.objects.count() == SAVE_LIMIT (3 == 1), on either "
           "broker; it passes on the suite's SQLite, where they go to each forked process's "
           "private copy of the in-memory test database")

BROKER = os.environ.get("JOBCAP_TEST_BROKER", "jobcap")
OUTCOMES = {}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_recycle" and item.fspath.basename == "test_cluster.py":
            item.add_marker(pytest.mark.xfail(reason=RECYCLE, strict=True))
        other = OTHER_BROKER.get((item.fspath.basename, item.name))
        if BROKER == "jobcap" and other:
            item.add_marker(pytest.mark.skip(reason="another broker's test: " + other))
        marker = item.get_closest_marker("django_db")
        if marker is not None and not marker.kwargs.get("transaction"):
            item.add_marker(pytest.mark.django_db(transaction=True), append=False)


@pytest.fixture(autouse=True)
def _recycle_probe(request, monkeypatch):
    """For djq_recycle_probe.py: how many Success rows the test's database holds right after
    test_recycle's Sentinel ran (written to $JOBCAP_DJQ_RECYCLE_PROBE)."""
    path = os.environ.get("JOBCAP_DJQ_RECYCLE_PROBE")
    if path and request.node.name == "test_recycle":
        from django_q.models import Success
        sentinel = request.module.Sentinel

        class Probed(sentinel):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                with open(path, "w") as f:
                    f.write(str(Success.objects.count()))
        monkeypatch.setattr(request.module, "Sentinel", Probed)
    yield


@pytest.fixture(scope="session", autouse=True)
def _close_broker_connections(django_db_setup):
    yield
    if BROKER == "jobcap":
        from jobcap.contrib.django_q import close_connections
        close_connections()


def pytest_runtest_logreport(report):
    """Records each test's outcome for run_django_q_suite.py's comparison of the brokers."""
    name = report.nodeid.split("/")[-1]
    if report.when == "call" or report.outcome != "passed":
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.skipped and BROKER == "jobcap" and tuple(name.split("::")) in OTHER_BROKER:
            outcome = "other broker"
        else:
            outcome = report.outcome if report.when == "call" or report.skipped else "error"
        if OUTCOMES.get(name, "passed") == "passed":   # a teardown's error counts too
            OUTCOMES[name] = outcome


def pytest_sessionfinish(session):
    path = os.environ.get("JOBCAP_DJQ_OUTCOMES")
    if path:
        with open(path, "w") as f:
            json.dump(OUTCOMES, f, indent=1)
