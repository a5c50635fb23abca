"""jobcap for Python: a worker loop over PostgreSQL's jobcap extension (psycopg 3).

    import jobcap
    worker = jobcap.Worker("dbname=app", "emails", handle, lease=60, timeout=45)
    worker.run()
"""
from .errors import STALE_FENCE, JobcapError, JobTimeout, StaleFence, is_stale, translate
from .sql import (assert_fence, complete, create_queue, enqueue, fail, heartbeat, pause_queue,
                  resume_queue, schedule_job, set_max_running, unschedule_job)
from .worker import HANG_EXIT_STATUS, Job, Worker

__all__ = [
    "STALE_FENCE", "JobcapError", "JobTimeout", "StaleFence", "is_stale", "translate",
    "assert_fence", "complete", "create_queue", "enqueue", "fail", "heartbeat",
    "pause_queue", "resume_queue", "schedule_job", "set_max_running", "unschedule_job",
    "HANG_EXIT_STATUS", "Job", "Worker",
]
__version__ = "0.1.0"
