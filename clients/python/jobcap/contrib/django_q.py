"""A Django-Q broker whose queue is a jobcap queue.

    Q_CLUSTER = {
        "name": "app",
        "broker_class": "jobcap.contrib.django_q.Broker",
        "timeout": 600,          # Django-Q's guard kills a task running longer than this
        "retry": 900,            # the lease: must outlast timeout (Django-Q checks it too)
        "ack_failures": True,    # report failures at once (counted errors, with their text)
        "max_attempts": 0,       # the cap is jobcap's: the "jobcap" options below
        "jobcap": {"max_attempts": 10, "backoff_base": 30, "backoff_max": 3600},
    }

What each broker call does in jobcap:

* ``enqueue``: ``enqueue_job`` on Django's own database connection, so it joins the caller's
  transaction (``transaction.atomic``): the task exists if and only if the caller's writes
  commit. A task whose package has ``jobcap_concurrency_key`` (set by a receiver of Django-Q's
  ``pre_enqueue`` signal, which may edit the task before it is signed) gets that concurrency
  key (jobcap 0.3.0: the queue's max_running_per_key and fairness apply to it). Likewise
  ``jobcap_dedupe_key`` (instead of the task's id), ``jobcap_dedupe_window`` (seconds) and
  ``jobcap_dedupe`` (``"keep"`` or ``"replace"``) become enqueue_job's dedupe options. A task
  that dedupe returns an existing job for enqueues nothing (its own id never runs), and a task
  with its own dedupe key cannot be found again by "Resubmit", which then enqueues it anew.
* ``dequeue``: ``claim_job`` of up to ``bulk`` jobs on the broker's own autocommit connection
  (a claim must commit before work starts; it refuses to run inside a savepoint), with
  ``retry`` seconds as the lease. The ack id carries the job, its fence and when it was
  claimed.
* ``acknowledge``: Django-Q acknowledges successes, and failures too with ``ack_failures`` or
  once its own ``max_attempts`` is reached. The broker reads the task's result row
  (``django_q.models.Task``): a failure recorded by this attempt becomes ``fail_job`` with the
  result text (counted, retried after the queue's backoff, dead at the cap); anything else is
  ``complete_job``. A failure is never completed as a success, whatever ``ack_failures`` and
  ``max_attempts`` say, and a second acknowledgement of the same attempt finds a stale fence and
  changes nothing.
* a task Django-Q's guard kills on ``timeout`` (or whose worker dies) is never acknowledged:
  its lease lapses after ``retry`` seconds and the reaper counts the attempt (history:
  lease_expired), so a task that always times out dies at its cap.
* ``fail`` (a package whose signature does not verify) and ``delete``: ``give_up_job`` of a
  claimed job; a job id returned by ``enqueue`` (not claimed) is cancelled (``cancel_job``, an
  operator's function).
* ``queue_size``/``lock_size``: ``queue_depth``; ``purge_queue``/``delete_queue``:
  ``purge_pending`` (pending jobs only; the queue itself stays).
* ``set_stat``/``get_stat``/``get_stats`` (each cluster's status, which qinfo, qmonitor and
  ``Cluster.stat`` read): rows of the table ``jobcap_django_q_stat`` that the migration of
  ``jobcap.contrib.admin`` creates, with their expiry, so every process of every cluster sees
  them with nothing to configure (CACHES may stay Django's per-process default). Without that
  app installed, Django's cache keeps them, as for Django-Q's other brokers (a warning says so).

Each task's job has the Django-Q task's id as its dedupe key, so the job of a failed task can
be found again: Django-Q's "Resubmit" (the admin's action, see jobcap.contrib.admin) requeues
that job, with its history and counters, instead of enqueueing a new one with a fresh budget.

The broker's own connection is one per process and database; ``close_connections()`` closes
it (a test run calls it before its test database is dropped).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from typing import Dict, List, Optional, Tuple

import psycopg

from django.conf import settings
from django.db import connections
from django_q.brokers import Broker as BaseBroker
from django_q.conf import Conf

from .. import pooling
from ..sql import _named
from ..errors import STALE_FENCE
from . import message_options

log = logging.getLogger("jobcap.django_q")

# The broker's own autocommit connections of this process, per conninfo: Django-Q makes a
# broker for nearly every call (get_broker()), and they share one.
_OWN: Dict[str, psycopg.Connection] = {}
_OWN_PID = 0
# Connections a forked process inherited: never used there, and never finalized (closing one
# would end the parent's session on the shared socket).
_INHERITED: List[psycopg.Connection] = []
# (conninfo, queue) of the queues this process made sure of (Django-Q makes a broker per call).
_ENSURED = set()
# The conninfos whose pool mode this process checked (Broker._refuse_statement_pooling).
_PROBED = set()

QUEUE_OPTIONS = ("max_attempts", "backoff_base", "backoff_max")
# Whether the role may create queues (create_queue is an operator's function): asked first, so
# that a worker role's process does not leave a permission error in the server's log.
MAY_MANAGE_QUEUES = (
    "SELECT pg_catalog.pg_has_role('jobcap_operator', 'USAGE') OR r.rolsuper"
    "    OR pg_catalog.pg_has_role(c.relowner, 'USAGE')"
    "  FROM pg_catalog.pg_roles r, pg_catalog.pg_class c"
    " WHERE r.rolname = current_user AND c.oid = 'jobcap.queues'::pg_catalog.regclass")

STAT_TABLE = "jobcap_django_q_stat"
STAT_PRUNE_EVERY = 60.0     # seconds between two prunings of expired statistics, per process

CLAIM = ("SELECT job_id, fence, payload FROM jobcap.claim_job(%s, %s, %s, %s)")


def options() -> dict:
    return dict(getattr(settings, "Q_CLUSTER", {}).get("jobcap", {}))


def _interval(seconds) -> Optional[dt.timedelta]:
    return None if seconds is None else dt.timedelta(seconds=float(seconds))


def conninfo_of(alias: str) -> str:
    """A libpq conninfo for one of Django's database aliases."""
    explicit = options().get("conninfo")
    if explicit:
        return explicit
    s = connections.databases[alias]
    parts = {"dbname": s.get("NAME"), "user": s.get("USER"), "password": s.get("PASSWORD"),
             "host": s.get("HOST"), "port": str(s["PORT"]) if s.get("PORT") else None}
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in parts.items() if v})


def check_settings() -> None:
    """Refuses the Q_CLUSTER settings that would lose attempts (raises ImproperlyConfigured).

    Django-Q's ``sync`` (its mode for tests: a task runs in the caller, no broker involved) is
    not among them: it bypasses every broker alike."""
    from django.core.exceptions import ImproperlyConfigured
    if Conf.TIMEOUT and Conf.RETRY and Conf.TIMEOUT >= Conf.RETRY:
        raise ImproperlyConfigured(
            f"jobcap: Q_CLUSTER timeout ({Conf.TIMEOUT}s) must be shorter than retry "
            f"({Conf.RETRY}s), the lease: a task still running when its lease lapses would run "
            "twice")


def _own(conninfo: str) -> psycopg.Connection:
    """This process's autocommit connection to conninfo: claims and settles commit at once.

    Django-Q forks its sentinel, pusher, monitor and workers: a child must not use (or close)
    the parent's connections, so it opens its own and keeps the inherited ones referenced,
    unused, for as long as it lives.
    """
    global _OWN_PID
    if _OWN_PID != os.getpid():
        _INHERITED.extend(_OWN.values())
        _OWN.clear()
        _OWN_PID = os.getpid()
    conn = _OWN.get(conninfo)
    if conn is None or conn.closed:
        conn = _OWN[conninfo] = pooling.connect(conninfo, autocommit=True,
                                                application_name="jobcap django-q")
    return conn


def close_connections() -> None:
    """Closes this process's broker connections (they are opened again when needed)."""
    if _OWN_PID == os.getpid():
        for conn in _OWN.values():
            conn.close()
    _OWN.clear()


def _stats_in_database() -> bool:
    from django.apps import apps
    return apps.is_installed("jobcap.contrib.admin")


class Broker(BaseBroker):
    """Django-Q's broker_class on jobcap (see the module's documentation)."""

    _stats_warned = False
    _stats_pruned = 0.0

    def __init__(self, list_key: str = Conf.PREFIX):
        check_settings()
        self.alias = options().get("database", "default")
        super().__init__(list_key=list_key)
        self._refuse_statement_pooling()

    def _refuse_statement_pooling(self) -> None:
        """Raises PoolModeError when Django's database goes through a pooler that refuses
        transactions (PgBouncer's statement pooling): Django-Q's cluster saves each task's
        result in one (update_or_create), which the pooler answers by closing the connection.
        Here, in the cluster's first process, the refusal stops ``qcluster`` at start; a
        process's first Broker connects (and probes) once. Other connection errors are left to
        the broker's first statement, as before."""
        conninfo = conninfo_of(self.alias)
        if conninfo in _PROBED and _OWN_PID == os.getpid():
            return
        try:
            conn = _own(conninfo)
            if conn.pooled:
                with conn.transaction():
                    conn.execute("SELECT 1")
        except psycopg.OperationalError as error:
            stale = _OWN.pop(conninfo, None)
            if stale is not None:
                stale.close()
            pooling.refuse_statement_pooling(
                error, "Django-Q's cluster (it saves each task's result in a transaction)")
            return
        _PROBED.add(conninfo)

    def __getstate__(self):
        return self.list_key, self._info, self.alias

    def __setstate__(self, state):
        self.list_key, self._info, self.alias = state
        self.connection = self.get_connection(self.list_key)
        self.cache = self.get_cache()

    # --- connections ----------------------------------------------------------------------------

    @staticmethod
    def get_connection(list_key: str = Conf.PREFIX):
        return None   # connections are opened when used (the broker is pickled between processes)

    def _run(self, query: str, params: tuple = ()):
        conninfo = conninfo_of(self.alias)
        try:
            return _own(conninfo).execute(query, params)
        except psycopg.OperationalError:
            conn = _OWN.pop(conninfo, None)
            if conn is not None:
                conn.close()
            raise

    def _ensure_queue(self) -> None:
        """Creates the queue with the Q_CLUSTER "jobcap" options when the role may (an
        operator, the owner or a superuser) and it is missing; says once when options given
        there differ from an existing queue's, which are the ones that apply."""
        key = (conninfo_of(self.alias), self.list_key)
        if key in _ENSURED or options().get("create_queues") is False:
            return
        _ENSURED.add(key)
        o = options()
        try:
            may_manage = self._run(MAY_MANAGE_QUEUES).fetchone()[0]
        except psycopg.errors.InsufficientPrivilege:
            may_manage = False      # not even jobcap_worker: enqueue_job says what is missing
        if not may_manage:
            if any(k in o for k in QUEUE_OPTIONS):
                log.info("jobcap: queue %r is made and set by the DBA (this role may not "
                         "create or alter queues): Q_CLUSTER['jobcap'] %s do not apply",
                         self.list_key, ", ".join(k for k in QUEUE_OPTIONS if k in o))
            return
        wanted = (o.get("max_attempts"), _interval(o.get("backoff_base", 10)),
                  _interval(o.get("backoff_max", 3600)))
        try:
            self._run("SELECT jobcap.create_queue(%s, %s, %s, %s, %s)",
                      (self.list_key, wanted[0], _interval(Conf.RETRY), *wanted[1:]))
            return
        except psycopg.errors.InsufficientPrivilege:
            return
        except psycopg.errors.DuplicateObject:
            pass
        row = self._run("SELECT max_attempts, backoff_base, backoff_max FROM jobcap.queues"
                        " WHERE queue = %s", (self.list_key,)).fetchone()
        differ = [f"{k} {w} (the queue's: {h})"
                  for k, w, h in zip(QUEUE_OPTIONS, wanted, row or ()) if k in o and w != h]
        if differ:
            log.warning("jobcap: queue %r exists, and its settings apply, not Q_CLUSTER['jobcap']"
                        "'s %s: jobcap.alter_queue changes the queue's", self.list_key,
                        ", ".join(differ))

    # --- the broker -----------------------------------------------------------------------------

    def info(self) -> str:
        if not self._info:
            self._info = f"jobcap {self.alias}"
        return self._info

    def ping(self) -> bool:
        self._run("SELECT 1")
        return True

    def enqueue(self, task: str):
        self._ensure_queue()
        fields = _task_fields(task)
        named = message_options(fields, "task's")
        # The task's id is its job's dedupe key unless the task names one of its own.
        named.setdefault("dedupe_key", dedupe_key_of(str(fields.get("id", ""))))
        extra, values = _named(named)
        with connections[self.alias].cursor() as cursor:   # the caller's transaction
            cursor.execute(f"SELECT jobcap.enqueue_job(%s, %s::jsonb{extra})",
                           (self.list_key, json.dumps({"package": task})) + values)
            return cursor.fetchone()[0]

    def dequeue(self) -> Optional[List[Tuple[str, str]]]:
        self._ensure_queue()
        worker = f"django-q {Conf.PREFIX}:{os.getpid()}"
        claimed_at = time.time()
        rows = self._run(CLAIM, (self.list_key, worker, max(int(Conf.BULK or 1), 1),
                                 _interval(Conf.RETRY))).fetchall()
        if rows:
            return [(f"{job_id}:{fence}:{claimed_at:.6f}:{_task_id_of(payload['package'])}",
                      payload["package"]) for job_id, fence, payload in rows]
        time.sleep(Conf.POLL)
        return None

    def acknowledge(self, task_id):
        job_id, fence, claimed_at, q_task_id = _parse(task_id)
        failure = self._failure_of(q_task_id, claimed_at)
        try:
            if failure is None:
                self._run("SELECT jobcap.complete_job(%s, %s)", (job_id, fence))
            else:
                self._run("SELECT jobcap.fail_job(%s, %s, %s)", (job_id, fence, failure))
        except psycopg.Error as error:
            if getattr(error, "sqlstate", None) != STALE_FENCE:
                raise
            log.info("job %s: fence %s no longer current (acknowledged twice, or its lease "
                     "lapsed): nothing changed", job_id, fence)

    def _failure_of(self, task_id: str, claimed_at: float) -> Optional[str]:
        """The error text when Django-Q recorded this attempt as failed, else None.

        Django-Q saves a failure's result row (``Task``) before it acknowledges; a success may
        go unsaved (``save=False``), so a failed row counts only when this attempt wrote it.
        """
        from django_q.models import Task
        if not task_id:
            return None
        task = Task.objects.using(self.alias).filter(id=task_id).only(
            "success", "stopped", "result").first()
        if task is None or task.success:
            return None
        if task.stopped is None or task.stopped.timestamp() < claimed_at:
            return None     # a failure of an earlier attempt; this one succeeded unsaved
        return str(task.result)[:2000]

    def fail(self, task_id):
        self._end(task_id, "django-q could not unpack the task (bad signature)")

    def delete(self, task_id):
        self._end(task_id, "deleted by django-q")

    def _end(self, task_id, reason):
        """An ack id (a claimed job) is given up; a bare job id (what enqueue returned, a job
        not claimed) is cancelled, which needs an operator's role."""
        if ":" in str(task_id):
            job_id, fence, _, _ = _parse(task_id)
            self._give_up(job_id, fence, reason)
        else:
            self._run("SELECT jobcap.cancel_job(%s)", (int(task_id),))

    def _give_up(self, job_id, fence, reason):
        try:
            self._run("SELECT jobcap.give_up_job(%s, %s, %s)", (job_id, fence, reason))
        except psycopg.Error as error:
            if getattr(error, "sqlstate", None) != STALE_FENCE:
                raise

    def queue_size(self) -> int:
        self._ensure_queue()
        return self._run("SELECT ready FROM jobcap.queue_depth(%s)",
                         (self.list_key,)).fetchone()[0]

    def lock_size(self) -> int:
        self._ensure_queue()
        return self._run("SELECT running FROM jobcap.queue_depth(%s)",
                         (self.list_key,)).fetchone()[0]

    def purge_queue(self):
        self._ensure_queue()
        total = 0
        while True:
            n = self._run("SELECT jobcap.purge_pending(%s, 1000)",
                          (self.list_key,)).fetchone()[0]
            total += n
            if n < 1000:
                return total

    def delete_queue(self):
        return self.purge_queue()

    # --- cluster statistics ---------------------------------------------------------------------

    def _stat_table(self) -> Optional[str]:
        """The statistics table, or None (Django's cache keeps them) without the app."""
        if _stats_in_database():
            return STAT_TABLE
        if not Broker._stats_warned:
            Broker._stats_warned = True
            log.warning("jobcap: Django-Q's cluster statistics are kept in Django's cache, "
                        "because jobcap.contrib.admin is not in INSTALLED_APPS: qinfo and "
                        "qmonitor see a cluster only if that cache is shared by its processes")
        return None

    def set_stat(self, key: str, value: str, timeout: int):
        table = self._stat_table()
        if table is None:
            return super().set_stat(key, value, timeout)
        self._run(f"INSERT INTO {table} AS s (key, value, expires_at)"
                  " VALUES (%s, %s, now() + make_interval(secs => %s))"
                  " ON CONFLICT (key) DO UPDATE"
                  " SET value = excluded.value, expires_at = excluded.expires_at",
                  (key, value, float(timeout if timeout is not None else 1e9)))
        now = time.monotonic()
        if now - Broker._stats_pruned > STAT_PRUNE_EVERY:
            Broker._stats_pruned = now
            # Skipping what another process is pruning (or writing) cannot deadlock.
            self._run(f"DELETE FROM {table} WHERE key IN (SELECT key FROM {table}"
                      "  WHERE expires_at < now() FOR UPDATE SKIP LOCKED)")

    def get_stat(self, key: str):
        table = self._stat_table()
        if table is None:
            return super().get_stat(key)
        row = self._run(f"SELECT value FROM {table} WHERE key = %s AND expires_at > now()",
                        (key,)).fetchone()
        return row[0] if row else None

    def get_stats(self, pattern: str) -> Optional[list]:
        table = self._stat_table()
        if table is None:
            return super().get_stats(pattern)
        return [value for value, in self._run(
            f"SELECT value FROM {table} WHERE key LIKE %s AND expires_at > now() ORDER BY key",
            (_like(pattern),))]


def dedupe_key_of(task_id: str) -> Optional[str]:
    """The dedupe key of a Django-Q task's job: the task's id (a fresh UUID per task)."""
    return f"django-q:{task_id}" if task_id else None


def _like(pattern: str) -> str:
    """A Redis key pattern (Django-Q uses prefix:*) as a LIKE pattern: * and ? are wild."""
    out = []
    for ch in pattern:
        out.append("%" if ch == "*" else "_" if ch == "?" else
                   "\\" + ch if ch in "%_\\" else ch)
    return "".join(out)


def _task_fields(package: str) -> dict:
    from django_q.signing import BadSignature, SignedPackage
    try:
        task = SignedPackage.loads(package)
    except (BadSignature, TypeError, ValueError):
        return {}   # the pusher finds it out too, and calls fail()
    return task if isinstance(task, dict) else {}


def _task_id_of(package: str) -> str:
    return str(_task_fields(package).get("id", ""))


def _parse(ack_id) -> Tuple[int, int, float, str]:
    job_id, fence, claimed_at, task_id = str(ack_id).split(":", 3)
    return int(job_id), int(fence), float(claimed_at), task_id
