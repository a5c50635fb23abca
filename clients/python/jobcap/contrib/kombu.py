"""A kombu virtual transport whose messages are jobcap jobs: Celery on jobcap.

    app = Celery("media", broker_url="jobcap://postgres@/app",
                 broker_transport="jobcap.contrib.kombu:Transport",
                 broker_transport_options={"visibility_timeout": 300, "max_attempts": 5},
                 task_acks_late=True, task_reject_on_worker_lost=True,
                 task_acks_on_failure_or_timeout=False,
                 worker_enable_remote_control=False)

A kombu queue is a jobcap queue (created on declaration when the role may, with the transport
options' max_attempts, visibility_timeout as its lease and backoff; options for a queue that
exists already do not change it, and the transport says so once). What each kombu operation
does in jobcap:

* publish (``_put``): ``enqueue_job``. kombu's priority (higher is more important) becomes
  jobcap's (lower is claimed first) negated; Celery's ``eta``/``countdown`` become ``run_at``,
  so a delayed task is not held unacked by a worker until its time. A
  ``jobcap_concurrency_key`` header (``apply_async(..., headers={"jobcap_concurrency_key":
  "tenant-42"})``) is the job's concurrency key; ``jobcap_dedupe_key``, ``jobcap_dedupe_window``
  (seconds) and ``jobcap_dedupe`` (``"keep"`` or ``"replace"``) are enqueue_job's dedupe_key,
  dedupe_window and dedupe. A publish that dedupe returns an existing job for enqueues nothing:
  its task id gets no result (the existing job's task runs, or ran, under its own id).
* get (``_get``): ``claim_job``, committed before the message is handed over, with the
  visibility timeout as the lease. The claim counts the attempt (a SIGKILL cannot lose it) and
  refuses a job at its cap. A payload that is not a kombu message (for a Celery worker: not a
  task message it accepts) is given up with the reason instead of delivered. The message's
  headers gain ``jobcap_job_id``, ``jobcap_fence``, ``jobcap_attempt`` and
  ``jobcap_max_attempts`` (a Celery task reads them as ``self.request.jobcap_fence``, see
  :func:`fence_of`), and Celery's ``retries`` header is set to the attempts already counted.
* ack: ``complete_job`` with the fence. A stale fence (the lease lapsed and another worker has
  the job, the task retried, or it was revoked) is logged and dropped, never turned into a
  success.
* reject(requeue=False): ``give_up_job`` -- dead at once, the reason kept in its history.
* reject(requeue=True), ``message.requeue()``, ``recover`` and ``restore_unacked`` (a lost
  connection): nothing is re-published. The transport stops extending the lease and lets it
  lapse; the claim has counted the attempt already, and the reaper returns the job to pending
  (history: lease_expired) or, at its cap, makes it dead. A copy with a fresh budget is never
  created. At a Celery worker's shutdown, prefetched messages whose task never started are
  given back with ``release_job`` instead (pending at once, not counted).
* unacked messages of a live process have their leases extended by a heartbeat thread every
  third of the visibility timeout.

In a Celery worker the transport runs in Celery's event loop: acks are the loop's callbacks,
so a warm shutdown completes the tasks that finished while it waited for them. And:

* ``self.retry()``: inside a task holding a jobcap job, the retry message is not published. It
  becomes ``fail_job`` on the job being run, with the countdown/eta as ``retry_in``: a counted
  failure, so retries end at the queue's cap (the job goes dead) whatever ``max_retries``
  says, and Celery sees the counted attempts as ``request.retries``. A retry that changes the
  task's arguments is refused (the job's payload is the message). Celery's own tasks
  (``celery.chord_unlock`` waiting for a chord) retry as new messages, never counted.
* a task that raises: ``give_up_job`` with the exception's text (a failure is final in Celery).
* a time limit is a counted attempt, retried until the cap, as a SIGKILL is: both with
  ``time_out_job`` (history ``timed_out``, "time limit: hard time limit (N s) exceeded" or
  "... soft ..."); on a database still at jobcap 0.2.0 the hard one with ``crash_job``
  (``crashed``), the soft one with ``fail_job``.
* ``revoke()`` cancels the task's job (``cancel_job``: a role with jobcap_operator). The server
  then notifies the worker holding a running one (channel ``jobcap_cancel``, as for an attempt
  ended by ``max_run_time``): the transport, LISTENing in the Celery worker's main process,
  marks the task revoked and terminates it as Celery's ``revoke(terminate=True)`` does (SIGTERM
  to the pool process running it; the result is REVOKED), with or without ``terminate``, since
  the job is over either way. Its completion and its fenced calls are refused in any case.
  Through a pooler (no LISTEN) the held jobs' states are polled instead (``cancel_poll``,
  seconds, default 1).
* settings that cannot work refuse the worker at start, naming each: task_acks_late=True,
  task_reject_on_worker_lost=True, task_acks_on_failure_or_timeout=False,
  worker_enable_remote_control=False and no task events (-E, worker_send_task_events): there
  is no broadcast exchange, so ``celery inspect``/``control`` and ``celery events`` are refused
  with the reason, and a worker's heartbeat events are dropped (no queue is made for them).
* a role without its grants is refused at start with the grant to run (AccessDenied).
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import logging
import os
import threading
import time
import weakref
from queue import Empty
from typing import Any, Dict, Optional, Tuple

import psycopg
from psycopg.types.json import Jsonb
from kombu import serialization as kombu_serialization
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.json import dumps as kombu_dumps, loads as kombu_loads

from .. import pooling
from ..sql import _named
from . import message_options
from ..errors import STALE_FENCE

log = logging.getLogger("jobcap.kombu")

#: Headers the transport adds to each delivered message. (The headers a published message can
#: carry to enqueue_job are contrib.MESSAGE_OPTIONS.)
JOB_HEADERS = ("jobcap_job_id", "jobcap_fence", "jobcap_attempt", "jobcap_max_attempts")

#: The channel on which the server tells the worker holding a job that its attempt ended while
#: it ran (cancel_job, max_run_time); payload {"job_id": n, "fence": f, "reason": r}.
CANCEL_CHANNEL = "jobcap_cancel"
POLL_CANCELLED = ("SELECT j.job_id FROM pg_catalog.unnest(%s::bigint[]) AS j(job_id)"
                  " CROSS JOIN LATERAL jobcap.job_result(j.job_id) AS r"
                  " WHERE r.state = 'cancelled'")

CLAIM = ("SELECT job_id, fence, attempt, max_attempts, payload"
         " FROM jobcap.claim_job(%s, %s, %s, %s)")
COMPLETE_AND_CLAIM = ("SELECT job_id, fence, attempt, max_attempts, payload"
                      " FROM jobcap.complete_and_claim(%s, %s, %s, %s, %s, %s)")


def fence_of(request: Any) -> Tuple[int, int]:
    """(job_id, fence) of the jobcap job behind a Celery task's request (``self.request``).

    Use them with :func:`jobcap.assert_fence` in the transaction that writes the task's
    effects: the writes then commit only while the task's lease is current.
    """
    job_id = getattr(request, "jobcap_job_id", None)
    fence = getattr(request, "jobcap_fence", None)
    if job_id is None or fence is None:
        raise LookupError("this task was not delivered by the jobcap transport")
    return int(job_id), int(fence)


def _interval(seconds: Optional[float]) -> Optional[dt.timedelta]:
    return None if seconds is None else dt.timedelta(seconds=float(seconds))


def _is_stale(error: BaseException) -> bool:
    return getattr(error, "sqlstate", None) == STALE_FENCE


class _Held:
    """A delivered, unsettled message: its job, fence and where to reach the database."""

    __slots__ = ("job_id", "fence", "queue", "conninfo", "lease", "task_id")

    def __init__(self, job_id: int, fence: int, queue: str, conninfo: str, lease: float,
                 task_id: Optional[str] = None):
        self.job_id, self.fence, self.queue = job_id, fence, queue
        self.conninfo, self.lease, self.task_id = conninfo, lease, task_id


class _Heartbeats:
    """One thread per process extending the leases of every held message of that process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: Dict[str, _Held] = {}
        self.pid = os.getpid()
        self.thread: Optional[threading.Thread] = None
        self.conns: Dict[str, psycopg.Connection] = {}
        self.wake = threading.Event()

    def add(self, tag: str, held: _Held) -> None:
        with self.lock:
            if self.pid != os.getpid():   # forked: the parent's messages are not ours
                self.held.clear()
                _INHERITED.extend(self.conns.values())
                self.conns = {}
                self.pid = os.getpid()
                self.thread = None
            self.held[tag] = held
            if len(self.held) == 1:   # the thread may be waiting idle: start the clock now
                self.wake.set()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="jobcap-heartbeat",
                                               daemon=True)
                self.thread.start()

    def pop(self, tag: str) -> Optional[_Held]:
        with self.lock:
            return self.held.pop(tag, None)

    def pop_task(self, task_id: str) -> Optional[_Held]:
        """The held message of a Celery task, by its id (the parent process has no request)."""
        with self.lock:
            for tag, held in self.held.items():
                if held.task_id == task_id:
                    return self.held.pop(tag)
        return None

    def _conn(self, conninfo: str) -> psycopg.Connection:
        conn = self.conns.get(conninfo)
        if conn is None or conn.closed:
            conn = pooling.connect(conninfo, autocommit=True,
                                   application_name="jobcap kombu heartbeat")
            self.conns[conninfo] = conn
        return conn

    def _run(self) -> None:
        while True:
            with self.lock:
                items = list(self.held.items())
            if not items:
                self.wake.wait(5.0)
                self.wake.clear()
                continue
            period = min(h.lease for _, h in items) / 3
            for tag, h in items:
                try:
                    self._conn(h.conninfo).execute("SELECT jobcap.heartbeat(%s, %s)",
                                                   (h.job_id, h.fence))
                except psycopg.Error as error:
                    if _is_stale(error):
                        log.warning("job %s: lease lost (fence %s no longer current)",
                                    h.job_id, h.fence)
                        self.pop(tag)
                    else:
                        log.warning("heartbeat of job %s failed: %s", h.job_id, error)
                        conn = self.conns.pop(h.conninfo, None)
                        if conn is not None:
                            conn.close()
            self.wake.wait(max(period, 0.05))
            self.wake.clear()


_heartbeats = _Heartbeats()


class _Lapsed:
    """Messages whose leases this process let lapse, by delivery tag, the newest kept."""

    limit = 10000

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: Dict[str, _Held] = {}

    def put(self, tag: str, held: _Held) -> None:
        with self.lock:
            self.held[tag] = held
            while len(self.held) > self.limit:
                del self.held[next(iter(self.held))]

    def pop(self, tag: str) -> Optional[_Held]:
        with self.lock:
            return self.held.pop(tag, None)


_lapsed = _Lapsed()

# Connections a forked process inherited (Celery's prefork pool): never used there, and never
# finalized, since closing one would end the parent's session on the shared socket.
_INHERITED: list = []

# Connections of this process by conninfo, for settling from any channel (also a closed one:
# Celery acks a task that finished after its channel was replaced).
_settle_lock = threading.Lock()
_settle_conns: Dict[Tuple[int, str], psycopg.Connection] = {}


def _settle(conninfo: str, query: str, params: tuple, rows: bool = False):
    """Runs one settling statement, reconnecting once if the connection broke; returns its first
    row, or with rows all of them."""
    key = (os.getpid(), conninfo)
    for attempt in (1, 2):
        with _settle_lock:
            conn = _settle_conns.get(key)
            if conn is None or conn.closed:
                conn = pooling.connect(conninfo, autocommit=True,
                                       application_name="jobcap kombu settle")
                _settle_conns[key] = conn
            try:
                cur = conn.execute(query, params)
                return cur.fetchall() if rows else cur.fetchone()
            except psycopg.OperationalError:
                _settle_conns.pop(key, None)
                conn.close()
                if attempt == 2:
                    raise


# The databases that refused complete_jobs (0A000: a Citus cluster routes only a call that names
# one job's shard): their acks are completed one by one, with no refused try per batch first.
_no_batch: set = set()


def _complete(acks: list) -> None:
    """complete_job for each acked message, in one complete_jobs when there are several. That
    one is all or nothing: when a fence in it is stale, each job is completed on its own."""
    by_db: Dict[str, list] = {}
    for held in acks:
        by_db.setdefault(held.conninfo, []).append(held)
    for conninfo, helds in by_db.items():
        if len(helds) > 1 and conninfo not in _no_batch:
            try:
                _settle(conninfo, "SELECT jobcap.complete_jobs(%s, %s)",
                        ([h.job_id for h in helds], [h.fence for h in helds]))
                continue
            except psycopg.errors.FeatureNotSupported as error:
                _no_batch.add(conninfo)
                log.info("jobcap: complete_jobs is refused here (%s); completing each job on "
                         "its own from now on", str(error).splitlines()[0])
            except psycopg.Error as error:
                if not _is_stale(error):
                    raise
        for held in helds:
            try:
                _settle(conninfo, "SELECT jobcap.complete_job(%s, %s)",
                        (held.job_id, held.fence))
            except psycopg.Error as error:
                if not _is_stale(error):
                    raise
                log.warning("job %s: not completed, fence %s is no longer current (the task "
                            "retried, gave up, was revoked, or its lease lapsed and it "
                            "belongs to another worker)", held.job_id, held.fence)


class QoS(virtual.QoS):
    """Unacked messages are never re-published: their leases lapse and the reaper counts them."""

    def reject(self, delivery_tag, requeue=False):
        if requeue:
            self.channel._lapse(delivery_tag, "rejected with requeue")
        else:
            self.channel._give_up(delivery_tag)
        self._quick_ack(delivery_tag)
        self.channel.connection.wake()

    def restore_unacked(self):
        self._flush()
        unstarted = _never_started(list(self._delivered))
        while self._delivered:
            tag, _ = self._delivered.popitem()
            if tag in unstarted:
                self.channel._release(tag)
            else:
                self.channel._lapse(tag, "restored (not acked)")
        self._delivered.clear()
        return []


class Channel(virtual.Channel):
    QoS = QoS
    do_restore = True
    from_transport_options = virtual.Channel.from_transport_options + (
        "visibility_timeout", "max_attempts", "backoff_base", "backoff_max", "conninfo",
        "worker_name", "create_queues", "notify", "cancel_poll")
    visibility_timeout = 300.0
    max_attempts = None
    backoff_base = 10.0
    backoff_max = 3600.0
    conninfo = None
    worker_name = None
    cancel_poll = 1.0
    create_queues = True
    notify = False

    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self._conninfo = self.conninfo or self.connection.conninfo
        self._conn: Optional[psycopg.Connection] = None
        self._conn_pid = 0
        self._known_queues = set()
        self._checked_queues = set()
        self._worker = self.worker_name or f"{os.uname().nodename}:{os.getpid()}"
        _check_number("visibility_timeout", self.visibility_timeout, positive=True)
        _check_number("backoff_base", self.backoff_base)
        _check_number("backoff_max", self.backoff_max)
        if self.max_attempts is not None and (
                isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int)
                or self.max_attempts < 1):
            raise InvalidOption(f"jobcap: transport option max_attempts must be a whole number "
                                f"of at least 1 (or left out), not {self.max_attempts!r}")

    # --- the connection -----------------------------------------------------------------------

    def _db(self) -> psycopg.Connection:
        if self._conn is not None and self._conn_pid != os.getpid():
            _INHERITED.append(self._conn)    # the parent's: never used nor closed here
            self._conn = None
        if self._conn is None or self._conn.closed:
            self._conn = pooling.connect(self._conninfo, autocommit=True,
                                         application_name=f"jobcap kombu {self._worker}"[:63])
            self._conn_pid = os.getpid()
        return self._conn

    def _execute(self, query: str, params: tuple = ()):
        try:
            return self._db().execute(query, params)
        except psycopg.OperationalError:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
            raise

    def close(self):
        self.connection._flush_acks()   # acks of a warm shutdown's last turn of the loop
        super().close()
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._conn_pid == os.getpid():
                conn.close()
            else:
                _INHERITED.append(conn)

    # --- queues ---------------------------------------------------------------------------------

    def _new_queue(self, queue, **kwargs):
        if queue in self._known_queues:
            return
        refused = _unsupported_queue(queue)
        if refused:
            raise Unsupported(refused)
        if not self.create_queues:
            self._known_queues.add(queue)
            return
        try:
            self._execute("SELECT jobcap.create_queue(%s, %s, %s, %s, %s, %s)",
                          (queue, self.max_attempts, _interval(self.visibility_timeout),
                           _interval(self.backoff_base), _interval(self.backoff_max),
                           bool(self.notify)))
        except psycopg.errors.DuplicateObject:
            self._queue_options_unapplied(queue, "it exists")
        except psycopg.errors.InsufficientPrivilege:
            # an operator creates queues; using one says what is missing (_check_access)
            self._queue_options_unapplied(queue, "this role may not create queues")
        self._known_queues.add(queue)

    #: Transport options that are a queue's settings, given to create_queue only.
    QUEUE_OPTIONS = ("max_attempts", "backoff_base", "backoff_max", "notify")

    def _queue_options_unapplied(self, queue: str, why: str) -> None:
        """Says once per queue when transport options given for its settings do not apply:
        create_queue sets them, and the queue was not created here. Quiet when the queue's
        settings are those options anyway, or when none was given."""
        given = {k: v for k, v in self.connection.client.transport_options.items()
                 if k in self.QUEUE_OPTIONS}
        key = (self._conninfo, queue)
        if not given or key in _options_told:
            return
        _options_told.add(key)
        try:
            row = self._execute("SELECT max_attempts, extract(epoch FROM backoff_base)::float8,"
                                " extract(epoch FROM backoff_max)::float8, notify"
                                " FROM jobcap.queues WHERE queue = %s", (queue,)).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            row = None   # a worker role may not read jobcap.queues
        if row is not None:
            have = dict(zip(self.QUEUE_OPTIONS, row))
            differ = {k: v for k, v in given.items()
                      if v is not None and (float(v) if k != "notify" else bool(v)) !=
                      (float(have[k]) if k != "notify" else bool(have[k]))}
            if not differ:
                return
            log.warning(
                "jobcap: queue %r has %s; the transport options %s do not apply (%s, and "
                "create_queue alone takes them). Its owner changes them: SELECT "
                "jobcap.alter_queue(%r, %s)", queue,
                ", ".join(f"{k}={have[k]}" for k in differ),
                ", ".join(f"{k}={v}" for k, v in differ.items()), why, queue,
                ", ".join(f"{k} => {_sql_literal(k, v)}" for k, v in differ.items()))
        else:
            log.warning(
                "jobcap: the transport options %s may not apply to queue %r (%s, and "
                "create_queue alone takes them; this role may not read its settings). Its "
                "owner checks them in jobcap.queues and changes them with jobcap.alter_queue.",
                ", ".join(f"{k}={v}" for k, v in given.items()), queue, why)

    def _check_access(self, queue: str) -> None:
        """Raises AccessDenied, saying what to grant, unless this role may work the queue."""
        if queue in self._checked_queues:
            return
        try:
            self._execute("SELECT ready FROM jobcap.queue_depth(%s)", (queue,))
        except psycopg.errors.InsufficientPrivilege as error:
            role = self._execute("SELECT current_user").fetchone()[0]
            raise AccessDenied(_access_advice(queue, role, error)) from error
        except psycopg.errors.UndefinedObject as error:
            role = self._execute("SELECT current_user").fetchone()[0]
            raise AccessDenied(
                f"jobcap: queue {queue!r} does not exist ({error.diag.message_primary}), and "
                f"role {role!r} did not create it. Its owner runs SELECT jobcap.grant_queue("
                f"{queue!r}, {role!r}, create_missing => true).") from error
        self._checked_queues.add(queue)

    def _has_queue(self, queue, **kwargs):
        try:
            self._execute("SELECT jobcap.queue_depth(%s)", (queue,))
            return True
        except psycopg.errors.UndefinedObject:
            return False

    def _size(self, queue):
        try:
            return self._execute("SELECT ready FROM jobcap.queue_depth(%s)",
                                 (queue,)).fetchone()[0]
        except psycopg.errors.InsufficientPrivilege as error:
            role = self._execute("SELECT current_user").fetchone()[0]
            raise AccessDenied(_access_advice(queue, role, error)) from error

    def _purge(self, queue):
        total = 0
        while True:
            try:
                n = self._execute("SELECT jobcap.purge_pending(%s, 1000)",
                                  (queue,)).fetchone()[0]
            except psycopg.errors.InsufficientPrivilege as error:
                raise PermissionError(
                    f"jobcap: purging queue {queue!r} deletes its pending jobs with "
                    "jobcap.purge_pending, which needs a role with jobcap_operator (this "
                    f"role may not: {error.diag.message_primary})") from error
            total += n
            if n < 1000:
                return total

    def _delete(self, queue, *args, **kwargs):
        # Dropping a jobcap queue loses its history: that is an operator's decision, not a side
        # effect of a consumer's queue_delete.
        pass

    def basic_publish(self, message, exchange, routing_key, **kwargs):
        if exchange and self.typeof(exchange).type != "direct":
            return self._broadcast(message, exchange)
        return super().basic_publish(message, exchange, routing_key, **kwargs)

    def _broadcast(self, message, exchange):
        """A message to a fanout or topic exchange: no queue of another process can be bound
        to one here, so only Celery's revoke has a meaning (cancel the job); other remote
        control commands are refused, and events, which only monitors bind to, are dropped,
        as a broker drops a message that no queue is bound for."""
        if not exchange.endswith(".pidbox"):
            return None
        try:
            command = kombu_serialization.loads(message.get("body"), message.get("content-type"),
                                                message.get("content-encoding"))
        except Exception:   # not Celery's: refused below all the same
            command = {}
        method = command.get("method") if isinstance(command, dict) else None
        if method == "revoke":
            return self._revoke((command.get("arguments") or {}).get("task_id"))
        raise Unsupported(
            f"jobcap: Celery remote control ({method or 'a broadcast'}: celery inspect, "
            "celery control, app.control) needs a broadcast exchange, which the jobcap transport "
            "does not have. revoke() works: it cancels the task's job (jobcap.cancel_job). "
            "Watch queues with the views jobcap.queue_stats and jobcap.dead_jobs.")

    def _revoke(self, task_ids) -> int:
        """Celery's revoke: cancel the jobs of these task ids (pending ones never run; a
        running one is refused at its next fenced call, its completion included)."""
        if isinstance(task_ids, str):
            task_ids = [task_ids]
        task_ids = [t for t in task_ids or () if isinstance(t, str)]
        if not task_ids:
            return 0
        try:
            rows = self._execute(
                "SELECT j.job_id, jobcap.cancel_job(j.job_id) FROM jobcap.jobs j"
                " WHERE j.state IN ('pending', 'running')"
                "   AND j.payload->'headers'->>'id' = ANY(%s)", (task_ids,)).fetchall()
        except psycopg.errors.InsufficientPrivilege as error:
            raise PermissionError(
                "jobcap: revoke() cancels the task's job with jobcap.cancel_job, which needs a "
                "role with jobcap_operator (this role may not: "
                f"{error.diag.message_primary})") from error
        cancelled = [job_id for job_id, done in rows if done]
        log.info("revoke %s: cancelled job(s) %s", ", ".join(task_ids), cancelled or "none")
        return len(cancelled)

    def _lookup(self, exchange, routing_key, default=None):
        # Direct routing needs no binding table shared between processes: an undeclared binding
        # routes to the queue named by the routing key.
        try:
            found = self.typeof(exchange).lookup(self.get_table(exchange), exchange,
                                                 routing_key, None) if exchange else []
        except KeyError:
            found = []
        return found or [routing_key or default or self.deadletter_queue]

    # --- publish ----------------------------------------------------------------------------------

    def _put(self, queue, message, **kwargs):
        headers = message.get("headers") or {}
        current = _current_task_request()
        if current is not None and headers.get("id") and headers.get("id") == getattr(
                current, "id", None) and getattr(current, "jobcap_job_id", None) is not None \
                and not _internal_task(headers.get("task")):
            return self._retry_current(current, message, headers)
        props = message.get("properties") or {}
        priority = -int(props.get("priority") or 0)
        run_at = _eta(headers)
        payload = kombu_loads(kombu_dumps(message))
        for key in JOB_HEADERS:
            (payload.get("headers") or {}).pop(key, None)
        extra, values = _named(message_options(headers, "header"))
        self._new_queue(queue)
        try:
            self._execute(f"SELECT jobcap.enqueue_job(%s, %s, coalesce(%s, now()), %s{extra})",
                          (queue, Jsonb(payload), run_at, priority) + values)
        except psycopg.errors.InsufficientPrivilege as error:
            role = self._execute("SELECT current_user").fetchone()[0]
            raise AccessDenied(_access_advice(queue, role, error)) from error

    def _retry_current(self, request, message, headers):
        """self.retry() of the task this process runs: a counted failure of the same job."""
        job_id, fence = fence_of(request)
        props = message.get("properties") or {}
        try:
            args, kwargs = kombu_loads(self.decode_body(message.get("body"),
                                                        props.get("body_encoding")))[:2]
        except (TypeError, ValueError, KeyError):
            args, kwargs = None, None
        if args is not None and (list(args) != list(request.args or ())
                                 or dict(kwargs) != dict(request.kwargs or {})):
            raise ValueError("a task on jobcap cannot retry with other arguments: the job's "
                             "payload is the message (enqueue a new task instead)")
        run_at = _eta(headers)
        retry_in = 0.0
        if run_at is not None:
            retry_in = max((run_at - dt.datetime.now(dt.timezone.utc)).total_seconds(), 0.0)
        reason = f"retry requested by the task (celery retries={headers.get('retries')})"
        state = _settle(self._conninfo, "SELECT jobcap.fail_job(%s, %s, %s, %s)",
                        (job_id, fence, reason, dt.timedelta(seconds=retry_in)))[0]
        log.info("job %s: retry counted as a failure, now %s", job_id, state)

    # --- get --------------------------------------------------------------------------------------

    def basic_consume(self, queue, no_ack, callback, consumer_tag, **kwargs):
        if no_ack:
            refused = _unsupported_queue(queue)
            raise Unsupported(refused or (
                f"jobcap: a consumer of queue {queue!r} with no_ack=True (automatic "
                "acknowledgement) would complete each job as it is delivered, before its work "
                "ran: consume with no_ack=False and ack each message after its work"))
        app = _celery_worker_app()
        if app is not None:
            wrong = _wrong_settings(app.conf)
            if wrong:
                raise Unsupported(_refusal(wrong))
        self._check_access(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def _get(self, queue, timeout=None):
        while True:
            row = self._execute(CLAIM, (queue, self._worker, 1,
                                        _interval(self.visibility_timeout))).fetchone()
            if row is None:
                raise Empty()
            if self._deliverable(row):
                return self._deliver_row(queue, row)

    def _get_batch(self, queue, n: int, acked: Optional[_Held] = None):
        """Up to n messages of queue, claimed in one statement (the event loop's poll), and
        the number of jobs claimed. With acked, that message's job is completed in the same
        statement (complete_and_claim): one round trip where a task ends and the next starts."""
        lease = _interval(self.visibility_timeout)
        rows = None
        if acked is not None:
            try:
                rows = self._execute(COMPLETE_AND_CLAIM, (acked.job_id, acked.fence, queue,
                                                          self._worker, n, lease)).fetchall()
            except psycopg.Error as error:
                if not _is_stale(error):
                    raise
                _complete([acked])   # says which fence was stale; the claim follows alone
        if rows is None:
            rows = self._execute(CLAIM, (queue, self._worker, n, lease)).fetchall()
        return [self._deliver_row(queue, row) for row in rows if self._deliverable(row)], len(rows)

    def _room(self) -> int:
        """How many more messages this channel's consumers take now (kombu's prefetch)."""
        if not self._consumers:
            return 0
        qos = self.qos
        if not qos.prefetch_count:
            return self.connection.deliveries_per_poll
        return max(qos.prefetch_count - (len(qos._delivered) - len(qos._dirty)), 0)

    def _deliverable(self, row) -> bool:
        """False, with the job given up and the reason kept, for a payload that must not be
        delivered (not a kombu message, or a task whose settings cannot work)."""
        wrong = _not_a_message(row[4])
        if wrong is None:
            wrong = "; ".join(_wrong_task_settings(row[4])) or None
        if wrong is None:
            return True
        reason = "refused by the jobcap transport: " + wrong
        log.error("job %s: %s", row[0], reason)
        _settle(self._conninfo, "SELECT jobcap.give_up_job(%s, %s, %s)",
                (row[0], row[1], reason))
        return False

    def _deliver_row(self, queue, row):
        job_id, fence, attempt, max_attempts, payload = row
        message = payload
        headers = message.setdefault("headers", {}) or {}
        message["headers"] = headers
        props = message.setdefault("properties", {})
        tag = f"{job_id}.{fence}"
        props["delivery_tag"] = tag
        props.setdefault("delivery_info", {})
        headers.update(jobcap_job_id=job_id, jobcap_fence=fence, jobcap_attempt=attempt,
                       jobcap_max_attempts=max_attempts)
        if "retries" in headers:      # Celery's count of earlier attempts: jobcap's counter
            headers["retries"] = attempt - 1
        message["redelivered"] = attempt > 1
        _heartbeats.add(tag, _Held(job_id, fence, queue, self._conninfo,
                                   float(self.visibility_timeout), headers.get("id")))
        return message

    # --- settle -----------------------------------------------------------------------------------

    def basic_ack(self, delivery_tag, multiple=False):
        held = _heartbeats.pop(delivery_tag) or _lapsed.pop(delivery_tag)
        super().basic_ack(delivery_tag, multiple)
        transport = self.connection
        if held is not None and transport._hub is not None and not self.closed:
            # In Celery's event loop: completed with the others acked in the same turn of the
            # loop, in one complete_jobs, before the next claim (each job under its fence).
            transport._acks.append(held)
        elif held is not None:
            _complete([held])
        transport.wake()

    def _give_up(self, delivery_tag, reason="rejected without requeue (Celery: the task failed "
                                             "or exceeded its hard time limit)"):
        held = _heartbeats.pop(delivery_tag) or _lapsed.pop(delivery_tag)
        if held is None:
            return
        try:
            _settle(held.conninfo, "SELECT jobcap.give_up_job(%s, %s, %s)",
                    (held.job_id, held.fence, reason))
        except psycopg.Error as error:
            if not _is_stale(error):
                raise
            log.info("job %s: not given up, fence %s is no longer current (the task's own "
                     "failure report ended it, or its lease lapsed)", held.job_id, held.fence)

    def _release(self, delivery_tag):
        """Gives back a message whose task never started: pending at once, not counted."""
        held = _heartbeats.pop(delivery_tag)
        if held is None:
            return
        try:
            _settle(held.conninfo, "SELECT jobcap.release_job(%s, %s)",
                    (held.job_id, held.fence))
            log.info("job %s: never started here, given back (not counted)", held.job_id)
        except psycopg.Error as error:
            if not _is_stale(error):
                log.warning("job %s: could not be given back (%s); its lease lapses and the "
                            "reaper counts the attempt", held.job_id, error)
        self.connection.wake()

    def _lapse(self, delivery_tag, why):
        held = _heartbeats.pop(delivery_tag)
        if held is not None:
            # A task may still be running (a connection was lost, not the pool): its ack then
            # still completes the job while the fence is current.
            _lapsed.put(delivery_tag, held)
            log.info("job %s (%s): its lease lapses and the reaper counts the attempt",
                     held.job_id, why)
        self.connection.wake()

    def basic_recover(self, requeue=False):
        return self.qos.restore_unacked()


def _never_started(tags) -> set:
    """Of these delivery tags, those whose Celery task never started, when they are known
    for sure: in a Celery worker that is shutting down (its pool has stopped, so nothing
    handed to it can start later), the messages prefetched but never accepted by a pool
    process. Anywhere else (a lost connection while the pool runs, plain kombu): none."""
    import sys
    if "celery.worker.state" not in sys.modules:
        return set()
    from celery.worker import state
    if state.should_stop is None and state.should_terminate is None:
        return set()
    started = {getattr(getattr(r, "message", None), "delivery_tag", None)
               for r in list(state.active_requests)}
    return {t for t in tags if t not in started}


def _on_cancel_note(payload: str) -> None:
    try:
        note = json.loads(payload)
        job_id, fence = int(note["job_id"]), int(note["fence"])
        reason = str(note.get("reason", "cancelled"))
    except (ValueError, KeyError, TypeError):
        log.warning("jobcap: unreadable %s payload %r", CANCEL_CHANNEL, payload)
        return
    _stop_task(job_id, fence, reason)


def _stop_task(job_id: int, fence: int, reason: str) -> None:
    """The attempt of a message this process holds ended on the server (cancel_job, which
    revoke() calls, or max_run_time): its lease is no longer kept, and in a Celery worker its
    task is marked revoked (one not started yet never runs) and, running, terminated as
    Celery's revoke(terminate=True) does: SIGTERM to the pool process running it."""
    import sys
    tag = f"{job_id}.{fence}"
    held = _heartbeats.pop(tag)
    if held is None:
        return
    if "celery.worker.state" not in sys.modules:
        return   # plain kombu: the consumer learns it when it acks (a stale fence, dropped)
    from celery.worker import state
    if held.task_id:
        state.revoked.add(held.task_id)
    controller = _worker_controller()
    pool = getattr(controller, "pool", None)
    for request in list(state.active_requests):
        if getattr(getattr(request, "message", None), "delivery_tag", None) != tag:
            continue
        log.info("jobcap: job %s (task %s) ended on the server while it ran (%s): "
                 "terminating it", job_id, request.id, reason)
        if pool is None:
            log.warning("jobcap: no worker pool to terminate task %s in", request.id)
            return
        try:
            request.terminate(pool, signal="SIGTERM")
        except Exception as error:   # a pool that cannot terminate (solo, threads)
            log.warning("jobcap: task %s could not be terminated (%s); its completion will "
                        "be refused", request.id, error)


def _eta(headers: dict) -> Optional[dt.datetime]:
    eta = headers.get("eta")
    if not eta:
        return None
    if isinstance(eta, str):
        eta = dt.datetime.fromisoformat(eta)
    if eta.tzinfo is None:
        eta = eta.replace(tzinfo=dt.timezone.utc)
    return eta


def _celery_worker_app():
    """The Celery app of this process when it runs a worker, else None."""
    import sys
    if "celery.apps.worker" not in sys.modules:   # imported by `celery worker` only
        return None
    from celery._state import get_current_app
    return get_current_app()


_REQUIRED = (("task_acks_late", True, "a task acked before it runs is completed before it "
              "runs"),
             ("task_reject_on_worker_lost", True, "a task whose process died would be acked, "
              "and completed"),
             ("task_acks_on_failure_or_timeout", False, "a failed or timed-out task would be "
              "acked, and completed as succeeded"))


def _wrong_settings(conf) -> list:
    wrong = [f"{name} must be {want} ({why})" for name, want, why in _REQUIRED
             if bool(conf.get(name)) != want]
    if conf.get("worker_enable_remote_control"):
        wrong.append("worker_enable_remote_control must be False (celery inspect and celery "
                     "control need a broadcast exchange, which the jobcap transport does not "
                     "have; revoke() works without it: it cancels the job in the database)")
    controller = _worker_controller()
    events = getattr(controller, "task_events", None)
    if events is None:
        events = conf.get("worker_send_task_events")
    if events:
        wrong.append("worker_send_task_events must be False and the worker run without -E "
                     "(Celery's task events go to a topic exchange that only monitors bind to; "
                     "celery events and flower cannot receive them on jobcap)")
    return wrong


_worker_ref = None


def _worker_controller():
    """The Celery WorkController of this process (for its -E flag), if one started."""
    return _worker_ref() if _worker_ref is not None else None


def _on_worker_init(sender=None, **kwargs):
    """A Celery worker on this transport starts: refuse it now, with every setting to change,
    when its settings cannot work. (basic_consume checks again; a refusal there ends the worker
    too, but Celery's command then exits with status 0.)"""
    global _worker_ref
    try:
        _worker_ref = weakref.ref(sender)
    except TypeError:
        _worker_ref = None
    app = getattr(sender, "app", None)
    conninfo = getattr(sender, "_conninfo", None)
    if app is None or not isinstance(getattr(conninfo, "transport", None), Transport):
        return
    wrong = _wrong_settings(app.conf)
    if wrong:
        raise SystemExit(_refusal(wrong))
    try:
        queues = [q.name for q in app.amqp.queues.consume_from.values()]
    except Exception:   # an app without queues yet: basic_consume checks each queue anyway
        queues = []
    if not queues:
        return
    try:
        with app.connection_for_read() as connection:
            channel = connection.channel()
            try:
                for name in queues:
                    channel._new_queue(name)
                    channel._check_access(name)
            finally:
                channel.close()
    except (AccessDenied, InvalidOption) as error:
        raise SystemExit(str(error)) from error
    except (psycopg.OperationalError, OSError) as error:
        # the database is not reachable yet: Celery's own connection retries take over, and
        # basic_consume checks each queue once connected
        log.info("jobcap: queues not checked at start: %s", error)


def _refusal(wrong: list) -> str:
    return ("jobcap: Celery settings the jobcap transport cannot work with:\n  - "
            + "\n  - ".join(wrong))


class InvalidOption(ValueError):
    """A transport option with a value the transport cannot use."""


def _check_number(name: str, value, positive: bool = False) -> None:
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    ok = number is not None and number == number and (number > 0 if positive else number >= 0)
    if not ok:
        raise InvalidOption(f"jobcap: transport option {name} must be a "
                            f"{'positive' if positive else 'non-negative'} number of seconds, "
                            f"not {value!r}")


#: Transport options kombu itself reads (connection retries, the virtual transport's own).
_KOMBU_OPTIONS = frozenset(("polling_interval", "max_retries", "interval_start",
                            "interval_step", "interval_max", "retry_policy", "body_encoding",
                            "deadletter_queue"))
_unknown_told: set = set()


class AccessDenied(PermissionError):
    """The role may not work a queue (or use jobcap), with the grant that is missing."""


def _access_advice(queue: str, role: str, error: psycopg.Error) -> str:
    said = error.diag.message_primary or str(error)
    if "schema jobcap" in said or "function" in said:
        return (f"jobcap: role {role!r} may not use jobcap ({said}). A superuser runs GRANT "
                f"jobcap_worker TO {role}, and the queue's owner SELECT jobcap.grant_queue("
                f"{queue!r}, {role!r}, create_missing => true).")
    return (f"jobcap: role {role!r} may not work queue {queue!r} ({said}). The queue's owner "
            f"runs SELECT jobcap.grant_queue({queue!r}, {role!r}, create_missing => true) (which "
            f"creates the queue if it does not exist yet).")


def _sql_literal(option: str, value) -> str:
    if option in ("backoff_base", "backoff_max"):
        return f"interval '{float(value):g} seconds'"
    if option == "notify":
        return "true" if value else "false"
    return str(int(value))


_options_told: set = set()


class Unsupported(NotImplementedError):
    """A kombu or Celery feature that the jobcap transport cannot provide, with what to do."""


def _unsupported_queue(queue: str) -> Optional[str]:
    """Why a queue of this name cannot work on jobcap (Celery's monitors and remote control
    declare queues bound to broadcast exchanges and consume them without acks), or None."""
    if queue.endswith(".pidbox"):
        return ("jobcap: Celery remote control (celery inspect, celery control, app.control "
                f"with replies; queue {queue!r}) needs a broadcast exchange, which the jobcap "
                "transport does not have. revoke() works: it cancels the task's job "
                "(jobcap.cancel_job). Watch queues with the views jobcap.queue_stats and "
                "jobcap.dead_jobs.")
    if queue.startswith("celeryev."):
        return ("jobcap: Celery's events (celery events, flower; queue "
                f"{queue!r}) need a topic exchange that the worker's events reach, which the "
                "jobcap transport does not have. Watch queues with the views jobcap.queue_stats "
                "and jobcap.dead_jobs.")
    return None


def _json_kind(value) -> str:
    if value is None:
        return "JSON null"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, (int, float)):
        return "a JSON number"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, list):
        return "a JSON array"
    return "a JSON object"


_SHAPE = ("a kombu message is an object with body (a string), content-type, headers and "
          "properties; Celery publishes them with task.delay() or apply_async()")


def _not_a_message(payload) -> Optional[str]:
    """Why a job's payload cannot be delivered as a kombu message (for a Celery worker, as a
    task message it accepts), or None. Checked before delivery: kombu and Celery fail on such
    a message outside any handler (Celery's worker stops, or acks it as done)."""
    if not isinstance(payload, dict):
        return f"not a kombu message: the payload is {_json_kind(payload)} ({_SHAPE})"
    missing = [k for k in ("body", "content-type", "properties") if k not in payload]
    if missing:
        return ("not a kombu message: the payload has no " + ", ".join(missing)
                + f" ({_SHAPE})")
    body, props = payload["body"], payload["properties"]
    headers = payload.get("headers")
    content_type = payload["content-type"]
    if not isinstance(body, str):
        return f"not a kombu message: its body is {_json_kind(body)}, not a string"
    if not isinstance(props, dict):
        return f"not a kombu message: its properties are {_json_kind(props)}, not an object"
    if headers is not None and not isinstance(headers, dict):
        return f"not a kombu message: its headers are {_json_kind(headers)}, not an object"
    if content_type is not None and not isinstance(content_type, str):
        return f"not a kombu message: its content-type is {_json_kind(content_type)}"
    encoding = props.get("body_encoding")
    raw = body.encode()
    if encoding == "base64":
        try:
            raw = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as error:
            return f"not a kombu message: its body is not base64 (body_encoding base64): {error}"
    elif encoding is not None:
        return f"not a kombu message: unknown body_encoding {encoding!r} (base64 or none)"
    app = _celery_worker_app()
    if app is None:
        return None
    accept = _accepted(app)
    if content_type not in accept:
        return (f"content type {content_type!r} is not in this worker's accept_content "
                f"({', '.join(sorted(accept))})")
    decoded = None
    if content_type == "application/json":
        try:
            decoded = kombu_loads(raw.decode(payload.get("content-encoding") or "utf-8"))
        except (ValueError, LookupError) as error:
            return f"its body does not decode as {content_type}: {error}"
    headers = headers or {}
    if "task" in headers:
        if not isinstance(headers["task"], str) or not isinstance(headers.get("id"), str):
            return "not a Celery task message: its task and id headers must be strings"
    elif not (isinstance(decoded, dict) and isinstance(decoded.get("task"), str)):
        return ("not a Celery task message: no task name in its headers (protocol 2) nor in "
                "its body (protocol 1)")
    return None


def _accepted(app) -> frozenset:
    from kombu.serialization import prepare_accept_content
    return frozenset(prepare_accept_content(app.conf.accept_content or ["json"]))


def _wrong_task_settings(payload) -> list:
    """Per-task overrides of the required settings, for the task named in a message."""
    app = _celery_worker_app()
    if app is None:
        return []
    name = ((payload or {}).get("headers") or {}).get("task")
    task = app.tasks.get(name) if name else None
    if task is None:
        return []
    attrs = {"task_acks_late": "acks_late", "task_reject_on_worker_lost": "reject_on_worker_lost",
             "task_acks_on_failure_or_timeout": "acks_on_failure_or_timeout"}
    return [f"task {name}: {attrs[n]} must be {want} ({why})" for n, want, why in _REQUIRED
            if bool(getattr(task, attrs[n], None)) != want]


def _internal_task(name) -> bool:
    """Celery's own tasks (celery.chord_unlock and the like) retry to wait for something, not
    because they failed: their retries are new messages (the job that retried is completed),
    so waiting never uses up a cap."""
    return isinstance(name, str) and name.startswith("celery.")


def _current_task_request():
    """The request of the Celery task running in this thread, if Celery is loaded."""
    try:
        from celery._state import get_current_task
    except ImportError:
        return None
    task = get_current_task()
    if task is None:
        return None
    request = task.request
    return None if getattr(request, "called_directly", True) else request


class Transport(virtual.Transport):
    Channel = Channel
    driver_type = "jobcap"
    driver_name = "psycopg"
    default_port = 5432
    polling_interval = 0.5
    connection_errors = virtual.Transport.connection_errors + (
        psycopg.OperationalError, psycopg.InterfaceError)
    channel_errors = virtual.Transport.channel_errors
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset(["direct"]), heartbeats=False)

    #: Most messages one poll of the event loop delivers before it lets the loop run again.
    deliveries_per_poll = 100

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        options = client.transport_options
        self.conninfo = options.get("conninfo") or _conninfo_of(client)
        _check_number("polling_interval", self.polling_interval, positive=True)
        unknown = sorted(set(options) - set(Channel.from_transport_options) - _KOMBU_OPTIONS
                         - _unknown_told)
        if unknown:
            _unknown_told.update(unknown)
            log.warning("jobcap: unknown transport option(s) %s, ignored; the jobcap transport "
                        "takes %s (and kombu's %s)", ", ".join(unknown),
                        ", ".join(Channel.from_transport_options[2:]),
                        ", ".join(sorted(_KOMBU_OPTIONS - {"body_encoding",
                                                           "deadletter_queue"})))
        self._hub = None
        self._timer = None
        self._listen: Optional[psycopg.Connection] = None
        self._acks: list = []
        self._wake_r = self._wake_w = -1
        self._wake_pending = False
        self.cancel_poll = float(options.get("cancel_poll", 1.0))
        _check_number("cancel_poll", self.cancel_poll, positive=True)
        self._cancel_polled = 0.0
        self._cancel_poll_ok = True

    def _poll_cancelled(self) -> None:
        """Without LISTEN (through a pooler), and once after each LISTEN: the held jobs that
        were cancelled, read with job_result (0.3.0; on a database at 0.2.0 a running task
        learns it at its ack or next fenced call)."""
        now = time.monotonic()
        if not self._cancel_poll_ok or (self._cancel_polled
                                        and now - self._cancel_polled < self.cancel_poll):
            return
        self._cancel_polled = now
        with _heartbeats.lock:
            held = list(_heartbeats.held.values())
        if not held:
            return
        try:
            rows = _settle(held[0].conninfo, POLL_CANCELLED, ([h.job_id for h in held],),
                           rows=True)
        except (psycopg.errors.UndefinedFunction, psycopg.errors.FeatureNotSupported):
            # A database at 0.2.0, or a distributed install (Citus) where job_result is
            # refused: polling cannot work; a task learns at its ack or next fenced call.
            self._cancel_poll_ok = False
            return
        except psycopg.Error as error:
            log.info("jobcap: reading the held jobs' states failed: %s", error)
            return
        fences = {h.job_id: h.fence for h in held}
        for job_id, in rows or ():
            _stop_task(job_id, fences[job_id], "cancelled")

    # --- Celery's event loop ----------------------------------------------------------------------
    #
    # Celery runs a transport that says it is asynchronous in its event loop (the hub), where
    # settling is done by callbacks the loop runs soon after a task finishes, also while a warm
    # shutdown waits for the pool (the hub runs the pending ones as it closes). In the blocking
    # loop that Celery uses otherwise, an ack waits in a list that only the next turn of that
    # loop runs: up to two seconds after the task finished, and never once a warm shutdown has
    # begun, so the finished tasks' leases lapsed and they ran again.
    #
    # The loop has no file descriptor to wait on for a table, so it polls: on a timer every
    # polling_interval, and at once when a settled message frees a prefetch slot (a byte on a
    # pipe that the loop watches).

    def register_with_event_loop(self, connection, loop):
        self._unregister()
        self._hub = loop
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        loop.add_reader(self._wake_r, self._on_wake)
        self._timer = loop.call_repeatedly(self.polling_interval, self._poll_once)
        # A queue created with notify sends a NOTIFY jobcap (payload: the queue) per enqueueing
        # transaction: with it a new message is claimed at once, not at the next poll. Through
        # a pooler (jobcap/pooling.py) the notifications would reach a server connection the
        # pooler holds for no client: the timer's polls are the wake-ups there.
        listen = pooling.connect(self.conninfo, autocommit=True,
                                 application_name="jobcap kombu listen")
        if listen.pooled:
            listen.close()
            log.info("jobcap: connected through a pooler: no LISTEN, polling every %gs",
                     self.polling_interval)
        else:
            self._listen = listen
            self._listen.execute("LISTEN jobcap")
            self._listen.execute(f"LISTEN {CANCEL_CHANNEL}")
            loop.add_reader(self._listen.fileno(), self._on_notify)
            # A job cancelled while nothing listened (before this LISTEN, a reconnect).
            self._cancel_polled = 0.0
        self.wake()

    def _on_notify(self) -> None:
        pgconn = self._listen.pgconn
        pgconn.consume_input()   # a broken connection raises here: Celery reconnects
        mine = False
        while True:
            note = pgconn.notifies()
            if note is None:
                break
            if note.relname == CANCEL_CHANNEL.encode():
                _on_cancel_note(note.extra.decode(errors="replace"))
                continue
            queue = note.extra.decode(errors="replace")
            mine = mine or any(queue in ch._active_queues for ch in self.channels)
        if mine:
            self._poll_once()

    def wake(self) -> None:
        """Polls again at the next turn of the event loop (no-op without one)."""
        if self._wake_w < 0 or self._wake_pending:
            return
        self._wake_pending = True
        try:
            os.write(self._wake_w, b"w")
        except OSError:   # full (a wake is pending anyway) or closed
            pass

    def _on_wake(self) -> None:
        self._wake_pending = False
        try:
            while os.read(self._wake_r, 512):
                pass
        except OSError:
            pass
        self._poll_once()

    def _poll_once(self) -> None:
        """Settles what was acked, then claims what the consumers take now, each queue's in
        one claim_job (its batch: the room left by the prefetch limit)."""
        if self._listen is None or self._cancel_polled == 0.0:
            self._poll_cancelled()
        acks, self._acks = self._acks, []
        full = False
        for channel in list(self.channels):
            queues = list(getattr(channel, "_active_queues", ()))
            if len(queues) > 1:   # another queue first next time: none waits behind a busy one
                channel._active_queues.append(channel._active_queues.pop(0))
            for queue in queues:
                room = min(channel._room(), self.deliveries_per_poll)
                if room <= 0:
                    break
                acked = None
                if len(acks) == 1 and acks[0].conninfo == channel._conninfo:
                    acked, acks = acks[0], []
                elif acks:
                    _complete(acks)
                    acks = []
                messages, claimed = channel._get_batch(queue, room, acked)
                for message in messages:
                    self._deliver(message, queue)
                full = full or claimed == room
        if acks:
            _complete(acks)
        if full:
            self.wake()   # more may be waiting: let the loop run, then go on

    def _flush_acks(self) -> None:
        acks, self._acks = self._acks, []
        if acks:
            _complete(acks)

    def _unregister(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        hub, self._hub = self._hub, None
        listen, self._listen = self._listen, None
        if listen is not None:
            if hub is not None:
                try:
                    hub.remove_reader(listen.fileno())
                except Exception:   # closed already, or the hub was reset
                    pass
            listen.close()
        r, w = self._wake_r, self._wake_w
        self._wake_r = self._wake_w = -1
        if r >= 0:
            if hub is not None:
                try:
                    hub.remove_reader(r)
                except Exception:   # the hub was reset or closed already
                    pass
            os.close(r)
            os.close(w)

    def close_connection(self, connection):
        self._flush_acks()
        self._unregister()
        return super().close_connection(connection)

    def driver_version(self):
        return psycopg.__version__

    @property
    def default_connection_params(self):
        # No host means libpq's default (PGHOST, or the Unix socket), as for psql: kombu would
        # otherwise warn that it reverts to "localhost", which is not what is connected to.
        return {}

    def establish_connection(self):
        # Fail here, where kombu expects connection errors, rather than at the first _get.
        conn = psycopg.connect(self.conninfo, connect_timeout=10)
        conn.close()
        return super().establish_connection()


def _conninfo_of(client) -> str:
    parts = {}
    if client.hostname and client.hostname != "localhost" or client.port:
        parts["host"] = client.hostname or "localhost"
    if client.port:
        parts["port"] = str(client.port)
    if client.userid:
        parts["user"] = client.userid
    if client.password:
        parts["password"] = client.password
    if client.virtual_host and client.virtual_host != "/":
        parts["dbname"] = client.virtual_host.lstrip("/")
    return psycopg.conninfo.make_conninfo(**parts)


def _on_task_failure(sender=None, exception=None, task_id=None, **kwargs):
    """Celery's task_failure: settle the job with the failure's own text.

    Celery then rejects the message without requeue; the job is settled already, so that
    reject finds a stale fence (or no message held) and changes nothing. Without this the
    reason would only say "rejected".

    A task that raised: given up (a failure is final in Celery), in the process that ran it.
    A time limit is a counted attempt, retried until the cap, as a SIGKILL is: time_out_job for
    the hard one (Celery killed the pool process; reported in the worker's main process, which
    holds the message) and the soft one (raised in the task).
    """
    try:
        from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
    except ImportError:
        return
    if isinstance(exception, TimeLimitExceeded) and task_id is not None:
        held = _heartbeats.pop_task(task_id)
        if held is None:
            return
        limit = exception.args[0] if exception.args else "?"
        reason = (f"time limit: hard time limit ({_seconds(limit)}) exceeded; Celery killed "
                  "the task's process")
        try:
            state = _time_out(held.conninfo, "crash_job", (held.job_id, held.fence, reason))
            log.info("job %s: %s; now %s", held.job_id, reason, state)
        except psycopg.Error as error:
            if not _is_stale(error):
                log.warning("job %s: could not record its time limit: %s", held.job_id, error)
        return
    request = getattr(sender, "request", None)
    if request is None or getattr(request, "jobcap_job_id", None) is None:
        return
    try:
        with sender.app.connection_for_write() as connection:
            conninfo = getattr(connection.transport, "conninfo", None)
    except Exception:   # not our transport after all, or no app: Celery's reject decides
        return
    if not conninfo:
        return
    if isinstance(exception, SoftTimeLimitExceeded):
        limit = (getattr(request, "timelimit", None) or (None, None))[1]
        if limit is None:
            limit = getattr(sender, "soft_time_limit", None)
        reason = f"time limit: soft time limit ({_seconds(limit)}) exceeded"
        try:
            _time_out(conninfo, "fail_job", (*fence_of(request), reason))
        except psycopg.Error as error:
            if not _is_stale(error):
                log.warning("job %s: could not record its time limit: %s",
                            request.jobcap_job_id, error)
        return
    query = "SELECT jobcap.give_up_job(%s, %s, %s)"
    reason = f"{type(exception).__name__}: {exception}"
    try:
        _settle(conninfo, query, (*fence_of(request), reason))
    except psycopg.Error as error:
        if not _is_stale(error):
            log.warning("job %s: could not record its failure: %s", request.jobcap_job_id,
                        error)


def _time_out(conninfo: str, before_0_3: str, params: tuple) -> str:
    """Ends an attempt stopped by a Celery time limit: time_out_job (history timed_out), or on a
    database still at jobcap 0.2.0, which has no time_out_job, the function named."""
    try:
        return _settle(conninfo, "SELECT jobcap.time_out_job(%s, %s, %s)", params)[0]
    except psycopg.errors.UndefinedFunction:
        return _settle(conninfo, f"SELECT jobcap.{before_0_3}(%s, %s, %s)", params)[0]


def _seconds(limit) -> str:
    try:
        return f"{float(limit):g} s"
    except (TypeError, ValueError):
        return "its limit"


def _connect_celery_signals() -> None:
    try:
        from celery import signals
    except ImportError:
        return
    signals.task_failure.connect(_on_task_failure, weak=False,
                                 dispatch_uid="jobcap.contrib.kombu.task_failure")
    signals.worker_init.connect(_on_worker_init, weak=False,
                                dispatch_uid="jobcap.contrib.kombu.worker_init")


def register(alias: str = "jobcap") -> None:
    """Lets ``broker_url='jobcap://...'`` find this transport (done on import)."""
    TRANSPORT_ALIASES.setdefault(alias, "jobcap.contrib.kombu:Transport")


register()
_connect_celery_signals()
