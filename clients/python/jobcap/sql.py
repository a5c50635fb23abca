"""Thin wrappers over jobcap's SQL functions for code that is not a worker loop."""
from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple, Optional, Union

import psycopg
from psycopg.types.json import Jsonb

from .errors import translate

Seconds = Union[int, float, dt.timedelta]


def interval(value: Optional[Seconds]) -> Optional[dt.timedelta]:
    """Seconds (or a timedelta) as a timedelta, which psycopg sends as an interval."""
    if value is None or isinstance(value, dt.timedelta):
        return value
    return dt.timedelta(seconds=value)


# The queue settings 0.3.0 added, in their SQL names: passed by name, and only when given, so a
# call without them is the one a 0.2.0 database knows.
_QUEUE_OPTIONS_0_3 = ("max_snoozes", "max_run_time", "rate_limit", "rate_period",
                      "max_running_per_key", "fairness")
_INTERVALS = {"lease", "backoff_base", "backoff_max", "max_run_time", "rate_period"}


def _named(settings: dict) -> tuple:
    """The SQL of named arguments (name => %s, ...) and their values, for the settings given."""
    given = [(k, interval(v) if k in _INTERVALS else v) for k, v in settings.items()
             if v is not None]
    return "".join(f", {k} => %s" for k, _ in given), tuple(v for _, v in given)


def create_queue(conn: psycopg.Connection, queue: str, *, max_attempts: Optional[int] = None,
                 lease: Seconds = 300, backoff_base: Seconds = 10, backoff_max: Seconds = 3600,
                 notify: bool = False, max_running: Optional[int] = None,
                 max_snoozes: Optional[int] = None, max_run_time: Optional[Seconds] = None,
                 rate_limit: Optional[int] = None, rate_period: Optional[Seconds] = None,
                 max_running_per_key: Optional[int] = None,
                 fairness: Optional[str] = None) -> None:
    """Creates a queue. max_running caps the jobs of the queue that run at once (None: no cap).

    jobcap 0.3.0's settings (None: the server's default): max_snoozes (snoozes per job that do
    not count as attempts, default 10), max_run_time (an attempt's limit, even while it
    heartbeats), rate_limit claims per rate_period (default 1 s), max_running_per_key (running
    jobs per concurrency key), fairness ('fifo' or 'round_robin'). See docs/reference.md.
    """
    given = dict(locals())
    extra, values = _named({k: given[k] for k in _QUEUE_OPTIONS_0_3})
    conn.execute(f"SELECT jobcap.create_queue(%s, %s, %s, %s, %s, %s, %s{extra})",
                 (queue, max_attempts, interval(lease), interval(backoff_base),
                  interval(backoff_max), notify, max_running) + values)


def alter_queue(conn: psycopg.Connection, queue: str, *, max_attempts: Optional[int] = None,
                lease: Optional[Seconds] = None, backoff_base: Optional[Seconds] = None,
                backoff_max: Optional[Seconds] = None, notify: Optional[bool] = None,
                max_running: Optional[int] = None, max_snoozes: Optional[int] = None,
                max_run_time: Optional[Seconds] = None, rate_limit: Optional[int] = None,
                rate_period: Optional[Seconds] = None, max_running_per_key: Optional[int] = None,
                fairness: Optional[str] = None) -> None:
    """Changes the settings given; None leaves one as it is. As in SQL, 0 removes a limit:
    max_running=0, max_run_time=0, rate_limit=0, max_running_per_key=0."""
    given = dict(locals())
    del given["conn"], given["queue"]
    extra, values = _named(given)
    conn.execute(f"SELECT jobcap.alter_queue(%s{extra})", (queue,) + values)


def set_max_running(conn: psycopg.Connection, queue: str, max_running: Optional[int]) -> None:
    """Changes a queue's cap on jobs running at once; None removes it."""
    conn.execute("SELECT jobcap.alter_queue(%s, max_running => %s)",
                 (queue, 0 if max_running is None else max_running))


def cancel_job(conn: psycopg.Connection, job_id: int) -> bool:
    """Cancels a job that has not finished: pending, waiting or running (its worker is told at
    once, and its handler stopped: docs/workflows.md); its waiting dependents are cancelled too.
    False when the job had finished already."""
    return conn.execute("SELECT jobcap.cancel_job(%s)", (job_id,)).fetchone()[0]


def pause_queue(conn: psycopg.Connection, queue: str) -> bool:
    """Stops handing out jobs of queue (running jobs settle); False if it was paused already."""
    return conn.execute("SELECT jobcap.pause_queue(%s)", (queue,)).fetchone()[0]


def resume_queue(conn: psycopg.Connection, queue: str) -> bool:
    """Hands out jobs of a paused queue again; False if it was not paused."""
    return conn.execute("SELECT jobcap.resume_queue(%s)", (queue,)).fetchone()[0]


def schedule_job(conn: psycopg.Connection, name: str, cron: str, queue: str, payload: Any = None,
                 *, priority: int = 0, max_attempts: Optional[int] = None) -> dt.datetime:
    """Creates or replaces a periodic job (five-field cron, UTC); returns its next slot."""
    return conn.execute(
        "SELECT jobcap.schedule_job(%s, %s, %s, %s, %s, %s)",
        (name, cron, queue, Jsonb({} if payload is None else payload), priority,
         max_attempts)).fetchone()[0]


def unschedule_job(conn: psycopg.Connection, name: str) -> bool:
    """Removes a periodic job; False if there was none."""
    return conn.execute("SELECT jobcap.unschedule_job(%s)", (name,)).fetchone()[0]


def enqueue(conn: psycopg.Connection, queue: str, payload: Any = None, *,
            run_at: Optional[dt.datetime] = None, priority: int = 0,
            max_attempts: Optional[int] = None, dedupe_key: Optional[str] = None,
            concurrency_key: Optional[str] = None, dedupe_window: Optional[Seconds] = None,
            dedupe: str = "keep") -> int:
    """Enqueues one job in the caller's transaction and returns its id.

    Enqueue in the same transaction as the write that makes the job necessary: both commit or
    neither does. A queue created with notify wakes its listening workers when this commits.
    jobcap 0.3.0: concurrency_key is the key the queue's max_running_per_key and fairness apply
    to; dedupe_window (seconds or a timedelta) makes dedupe_key also return the key's succeeded
    or cancelled job enqueued within it; dedupe="replace" gives a pending job holding the key
    this payload and run_at. Without them the call is the one a 0.2.0 database knows.
    """
    sql = "SELECT jobcap.enqueue_job(%s, %s, coalesce(%s, now()), %s, %s, %s"
    args = [queue, Jsonb({} if payload is None else payload), run_at, priority, max_attempts,
            dedupe_key]
    for name, value, default in (("concurrency_key", concurrency_key, None),
                                 ("dedupe_window", interval(dedupe_window), None),
                                 ("dedupe", dedupe, "keep")):
        if value != default:
            sql += f", {name} => %s"
            args.append(value)
    return conn.execute(sql + ")", args).fetchone()[0]


def complete(conn: psycopg.Connection, job_id: int, fence: int, output: Any = None) -> str:
    """Completes a job under its fence; output (JSON, None for none) is kept in jobs.output,
    bounded by jobcap.max_output_bytes."""
    with translate("complete_job", job_id, fence):
        if output is None:
            return conn.execute("SELECT jobcap.complete_job(%s, %s)",
                                (job_id, fence)).fetchone()[0]
        return conn.execute("SELECT jobcap.complete_job(%s, %s, %s)",
                            (job_id, fence, Jsonb(output))).fetchone()[0]


class JobResult(NamedTuple):
    """What job_result returns: the job's state, its attempts so far, the output complete_job
    kept (None for none), the last error reported (None for none) and when it finished."""
    state: str
    attempts: int
    output: Any
    error: Optional[str]
    finished_at: Optional[dt.datetime]


def job_result(conn: psycopg.Connection, job_id: int) -> JobResult:
    """Reads a job of a queue the role may work, for the side that enqueued it (no privilege on
    jobcap.jobs needed). A job of another queue, or one retention deleted, raises
    InsufficientPrivilege for a worker role."""
    row = conn.execute("SELECT state::text, attempts, output, error, finished_at"
                       "  FROM jobcap.job_result(%s)", (job_id,)).fetchone()
    return JobResult(*row)


def fail(conn: psycopg.Connection, job_id: int, fence: int, error: str,
         retry_in: Optional[Seconds] = None) -> str:
    with translate("fail_job", job_id, fence):
        return conn.execute("SELECT jobcap.fail_job(%s, %s, %s, %s)",
                            (job_id, fence, error, interval(retry_in))).fetchone()[0]


def heartbeat(conn: psycopg.Connection, job_id: int, fence: int,
              extend: Optional[Seconds] = None) -> dt.datetime:
    with translate("heartbeat", job_id, fence):
        return conn.execute("SELECT jobcap.heartbeat(%s, %s, %s)",
                            (job_id, fence, interval(extend))).fetchone()[0]


def assert_fence(conn: psycopg.Connection, job_id: int, fence: int) -> None:
    with translate("assert_fence", job_id, fence):
        conn.execute("SELECT jobcap.assert_fence(%s, %s)", (job_id, fence))


def release(conn: psycopg.Connection, job_id: int, fence: int) -> str:
    """Gives back a claimed job whose handler never started (see jobcap.release_job).

    Only for a job whose work never began: the claim's attempt is not counted, so releasing a
    job that ran would let it run past its cap.
    """
    with translate("release_job", job_id, fence):
        return conn.execute("SELECT jobcap.release_job(%s, %s)",
                            (job_id, fence)).fetchone()[0]


def crash(conn: psycopg.Connection, job_id: int, fence: int, error: str) -> str:
    """Ends an attempt whose handler's process died (history kind 'crashed'; it counts)."""
    with translate("crash_job", job_id, fence):
        return conn.execute("SELECT jobcap.crash_job(%s, %s, %s)",
                            (job_id, fence, error)).fetchone()[0]


def complete_jobs(conn: psycopg.Connection, job_ids: list, fences: list,
                  outputs: Optional[list] = None) -> int:
    """Completes several jobs in one statement, each under its own fence; returns how many.

    All or nothing: when any fence is stale it raises StaleFence (job_id and fence name the
    first stale pair) and completes none of them, so a caller that must not lose the others
    completes each on its own then (as the worker loop does). outputs: None, or one JSON value
    (or None) per job.
    """
    with translate("complete_jobs"):
        if outputs is None:
            return conn.execute("SELECT jobcap.complete_jobs(%s::bigint[], %s::bigint[])",
                                (list(job_ids), list(fences))).fetchone()[0]
        return conn.execute(
            "SELECT jobcap.complete_jobs(%s::bigint[], %s::bigint[], %s::jsonb[])",
            (list(job_ids), list(fences),
             [None if o is None else Jsonb(o) for o in outputs])).fetchone()[0]


def complete_and_claim(conn: psycopg.Connection, job_id: int, fence: int, queue: str,
                       worker: str, batch: int = 1, lease: Optional[Seconds] = None,
                       output: Any = None) -> list:
    """Completes a job and claims up to batch more in one statement (one commit for both);
    returns the claimed rows (job_id, fence, attempt, max_attempts, payload, lease_expires_at).
    A stale fence raises StaleFence before anything is claimed. Commit before doing the work:
    the claim counted the attempts."""
    columns = "job_id, fence, attempt, max_attempts, payload, lease_expires_at"
    with translate("complete_and_claim", job_id, fence):
        if output is None:
            return conn.execute(
                f"SELECT {columns} FROM jobcap.complete_and_claim(%s, %s, %s, %s, %s, %s)",
                (job_id, fence, queue, worker, batch, interval(lease))).fetchall()
        return conn.execute(
            f"SELECT {columns} FROM jobcap.complete_and_claim(%s, %s, %s, %s, %s, %s, %s)",
            (job_id, fence, queue, worker, batch, interval(lease), Jsonb(output))).fetchall()
