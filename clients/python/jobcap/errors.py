"""Exceptions of the jobcap client, and the one place where SQLSTATEs become them."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import psycopg

#: The SQLSTATE jobcap raises when a fence is no longer current (the lease was reaped and the job
#: claimed again, or it was cancelled or settled meanwhile).
STALE_FENCE = "JC001"


class JobcapError(Exception):
    """Base class of the errors this client raises itself."""


class StaleFence(JobcapError):
    """The lease behind a fence is no longer current: stop working on the job.

    Whatever the worker wrote in the transaction that got this error rolls back with it; the
    job now belongs to someone else (or is settled). Raised by complete, fail, heartbeat and
    assert_fence, and by any statement of the handler that hits SQLSTATE JC001.
    """

    def __init__(self, message: str, *, job_id: Optional[int] = None,
                 fence: Optional[int] = None, operation: Optional[str] = None,
                 detail: Optional[str] = None):
        super().__init__(message)
        self.job_id = job_id
        self.fence = fence
        self.operation = operation
        self.detail = detail
        self.sqlstate = STALE_FENCE


class HandlerCrashed(JobcapError):
    """A handler's process died without settling its job (a signal, an exit): the supervisor
    recorded the attempt with jobcap.crash_job, as a crash."""


class JobTimeout(BaseException):
    """Raised inside a handler that ran past its deadline.

    A BaseException, like asyncio.CancelledError, so that ``except Exception`` in handler code
    does not swallow it. A handler that swallows it anyway is ended by the worker process
    exiting before its lease runs out (see Worker's exit_on_hang).
    """


class JobCancelled(BaseException):
    """Raised inside a handler whose attempt ended on the server while it ran: the job was
    cancelled (jobcap.cancel_job, reason "cancelled") or its max_run_time passed (reason
    "timed_out"). The worker learns it from a notification on the channel jobcap_cancel (or, when
    it cannot LISTEN, by polling) and stops the handler at once; the fence is already stale, so
    nothing the handler writes can commit, and the worker neither completes nor fails the job.

    A BaseException, like JobTimeout, so that ``except Exception`` does not swallow it. A handler
    that would rather stop at a point of its own polls ``job.cancelled`` (a threading.Event).
    """

    def __init__(self, message: str = "the job was cancelled while its handler ran",
                 reason: str = "cancelled"):
        super().__init__(message)
        self.reason = reason


def is_stale(error: BaseException) -> bool:
    """True for a StaleFence, or a psycopg error carrying SQLSTATE JC001."""
    return isinstance(error, StaleFence) or (
        isinstance(error, psycopg.Error) and getattr(error, "sqlstate", None) == STALE_FENCE)


def as_stale(error: psycopg.Error, operation: Optional[str] = None,
             job_id: Optional[int] = None, fence: Optional[int] = None) -> StaleFence:
    diag = error.diag
    stale = StaleFence(diag.message_primary or str(error), job_id=job_id, fence=fence,
                       operation=operation, detail=diag.message_detail)
    stale.__cause__ = error
    return stale


@contextlib.contextmanager
def translate(operation: Optional[str] = None, job_id: Optional[int] = None,
              fence: Optional[int] = None) -> Iterator[None]:
    """Turns SQLSTATE JC001 raised in the block into StaleFence; other errors pass unchanged."""
    try:
        yield
    except psycopg.Error as error:
        if getattr(error, "sqlstate", None) == STALE_FENCE:
            raise as_stale(error, operation, job_id, fence) from error
        raise
