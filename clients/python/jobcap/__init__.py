"""jobcap for Python: a worker loop over PostgreSQL's jobcap extension (psycopg 3).

    import jobcap
    worker = jobcap.Worker("dbname=app", "emails", handle, lease=60, timeout=45)
    worker.run()
"""
from ._version import __version__
from .errors import (STALE_FENCE, HandlerCrashed, JobCancelled, JobcapError, JobTimeout,
                     StaleFence, is_stale, translate)
from .pooling import PoolModeError
from .sql import (JobResult, alter_queue, assert_fence, cancel_job, complete, complete_and_claim,
                  complete_jobs, crash, create_queue, enqueue, fail, heartbeat, job_result,
                  pause_queue, release, resume_queue, schedule_job, set_max_running,
                  unschedule_job)
from .worker import HANG_EXIT_STATUS, HandlerError, Job, Worker

__all__ = [
    "STALE_FENCE", "HandlerCrashed", "HandlerError", "JobCancelled", "JobcapError", "JobTimeout",
    "StaleFence",
    "is_stale", "translate", "assert_fence", "complete", "complete_and_claim", "complete_jobs",
    "crash", "create_queue", "alter_queue", "cancel_job", "enqueue", "fail", "heartbeat",
    "job_result", "JobResult", "release",
    "pause_queue", "resume_queue", "schedule_job", "set_max_running", "unschedule_job",
    "HANG_EXIT_STATUS", "Job", "Worker", "__version__",
    "PoolModeError",
]
