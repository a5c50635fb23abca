'use strict';
// Errors of the jobcap client, and the one place where SQLSTATEs become them.

/** SQLSTATE of a fence that is no longer current (the lease was reaped, the job re-claimed,
 * cancelled or settled meanwhile). */
const STALE_FENCE = 'JC001';

class JobcapError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = this.constructor.name;
  }
}

/** The lease behind a fence is gone: stop working on the job. Whatever was written in the
 * transaction that got this error rolls back with it. */
class StaleFenceError extends JobcapError {
  constructor(message, { jobId, fence, operation, detail, cause } = {}) {
    super(message, { cause });
    this.code = STALE_FENCE;
    this.jobId = jobId;
    this.fence = fence;
    this.operation = operation;
    this.detail = detail;
  }
}

/** The handler ran past its deadline. Also the reason of job.signal when it aborts. */
class JobTimeoutError extends JobcapError {}

/** The job's attempt ended on the server while its handler ran: it was cancelled
 * (jobcap.cancel_job, `reason` 'cancelled') or its max_run_time passed ('timed_out'). The reason
 * of job.signal when it aborts for that. The fence is stale: the worker neither completes nor
 * fails the job. */
class JobCancelledError extends JobcapError {
  constructor(message = 'the job was cancelled while its handler ran', reason = 'cancelled') {
    super(message);
    this.reason = reason;
  }
}

/** A handler's process died without settling its job (a signal, an exit): the attempt was
 * recorded with jobcap.crash_job, as a crash. */
class HandlerCrashedError extends JobcapError {}

/** An error a handler threw in its child process, as text (its name kept in `errorName`). */
class HandlerError extends JobcapError {
  constructor(message, errorName) {
    super(message);
    this.errorName = errorName;
  }
}

/** The pooler in front of the server pools in a mode the worker cannot work in (PgBouncer's
 * statement pooling refuses transactions): not a connection error, retrying cannot help. */
class PoolModeError extends JobcapError {}

/** What PgBouncer answers a transaction with, in statement pooling. */
const STATEMENT_POOLING = 'transaction blocks not allowed in statement pooling mode';

function isStale(err) {
  return err instanceof StaleFenceError || (err != null && err.code === STALE_FENCE);
}

/** A pg error with SQLSTATE JC001 as a StaleFenceError; anything else unchanged. */
function translate(err, operation, jobId, fence) {
  if (err instanceof StaleFenceError || err == null || err.code !== STALE_FENCE) return err;
  return new StaleFenceError(err.message, { jobId, fence, operation, detail: err.detail, cause: err });
}

/** Errors that mean the connection is gone (not that the statement failed). */
function isConnectionError(err) {
  if (err == null || err instanceof PoolModeError) return false;
  const code = err.code;
  if (code === undefined) return /connection|terminated|closed|not queryable/i.test(err.message);
  return /^(08|57P)/.test(code) ||
    ['ECONNREFUSED', 'ECONNRESET', 'ENOENT', 'EPIPE', 'ETIMEDOUT'].includes(code);
}

module.exports = {
  STALE_FENCE, JobcapError, StaleFenceError, JobTimeoutError, JobCancelledError, HandlerCrashedError,
  HandlerError,
  PoolModeError, STATEMENT_POOLING, isStale, translate,
  isConnectionError,
};
