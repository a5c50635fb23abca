'use strict';
// Thin wrappers over jobcap's SQL functions. `db` is a pg Client, PoolClient or Pool.
// Durations are milliseconds, sent as intervals.
const { translate } = require('./errors');

const interval = (ms) => (ms == null ? null : `${ms} milliseconds`);

async function call(db, operation, text, values, jobId, fence) {
  try {
    return await db.query(text, values);
  } catch (err) {
    throw translate(err, operation, jobId, fence);
  }
}

// A queue's settings as the client names them, with their SQL names; durations in ms.
const QUEUE_SETTINGS = {
  maxAttempts: ['max_attempts'], lease: ['lease', interval], backoffBase: ['backoff_base', interval],
  backoffMax: ['backoff_max', interval], notify: ['notify'], maxRunning: ['max_running'],
  maxSnoozes: ['max_snoozes'], maxRunTime: ['max_run_time', interval], rateLimit: ['rate_limit'],
  ratePeriod: ['rate_period', interval], maxRunningPerKey: ['max_running_per_key'],
  fairness: ['fairness'],
};
// jobcap 0.3.0's: passed by name and only when given, so that a call without them is the one a
// 0.2.0 database knows.
const QUEUE_SETTINGS_0_3 = ['maxSnoozes', 'maxRunTime', 'rateLimit', 'ratePeriod',
  'maxRunningPerKey', 'fairness'];

// The named arguments (", name => $n") for the settings given, numbered after `first` others.
function namedSettings(settings, names, first) {
  const sql = [];
  const values = [];
  for (const name of names) {
    const value = settings[name];
    if (value == null) continue;
    const [column, convert] = QUEUE_SETTINGS[name];
    values.push(convert ? convert(value) : value);
    sql.push(`, ${column} => $${first + values.length}`);
  }
  return { sql: sql.join(''), values };
}

/** Creates a queue; maxRunning caps the jobs of the queue that run at once (null: no cap).
 * jobcap 0.3.0's settings (null: the server's default): maxSnoozes, maxRunTime (ms), rateLimit
 * claims per ratePeriod (ms, default 1000), maxRunningPerKey, fairness ('fifo' or
 * 'round_robin'). */
async function createQueue(db, queue, { maxAttempts = null, lease = 300000, backoffBase = 10000,
  backoffMax = 3600000, notify = false, maxRunning = null, ...newer } = {}) {
  const unknown = Object.keys(newer).filter((k) => !QUEUE_SETTINGS_0_3.includes(k));
  if (unknown.length > 0) throw new TypeError(`createQueue: unknown option ${unknown[0]}`);
  const extra = namedSettings(newer, QUEUE_SETTINGS_0_3, 7);
  await db.query(`SELECT jobcap.create_queue($1, $2, $3, $4, $5, $6, $7${extra.sql})`,
    [queue, maxAttempts, interval(lease), interval(backoffBase), interval(backoffMax), notify,
      maxRunning, ...extra.values]);
}

/** Changes the settings given (null or absent: unchanged); as in SQL, 0 removes a limit
 * (maxRunning, maxRunTime, rateLimit, maxRunningPerKey). */
async function alterQueue(db, queue, settings = {}) {
  const unknown = Object.keys(settings).filter((k) => !(k in QUEUE_SETTINGS));
  if (unknown.length > 0) throw new TypeError(`alterQueue: unknown option ${unknown[0]}`);
  const extra = namedSettings(settings, Object.keys(QUEUE_SETTINGS), 1);
  await db.query(`SELECT jobcap.alter_queue($1${extra.sql})`, [queue, ...extra.values]);
}

/** Changes a queue's cap on jobs running at once; null removes it. */
async function setMaxRunning(db, queue, maxRunning) {
  await db.query('SELECT jobcap.alter_queue($1, max_running => $2)',
    [queue, maxRunning == null ? 0 : maxRunning]);
}

/** Cancels a job that has not finished (pending, waiting or running: its worker is told at once
 * and its handler stopped); its waiting dependents are cancelled too. False when it had
 * finished already. */
async function cancelJob(db, jobId) {
  const { rows } = await db.query('SELECT jobcap.cancel_job($1) AS cancelled', [jobId]);
  return rows[0].cancelled;
}

/** Stops handing out jobs of queue (running jobs settle); false if it was paused already. */
async function pauseQueue(db, queue) {
  const { rows } = await db.query('SELECT jobcap.pause_queue($1) AS changed', [queue]);
  return rows[0].changed;
}

/** Hands out jobs of a paused queue again; false if it was not paused. */
async function resumeQueue(db, queue) {
  const { rows } = await db.query('SELECT jobcap.resume_queue($1) AS changed', [queue]);
  return rows[0].changed;
}

/** Creates or replaces a periodic job (five-field cron, UTC); resolves to its next slot. */
async function scheduleJob(db, name, cron, queue, payload = {}, { priority = 0,
  maxAttempts = null } = {}) {
  const { rows } = await db.query(
    'SELECT jobcap.schedule_job($1, $2, $3, $4, $5, $6) AS next_run',
    [name, cron, queue, JSON.stringify(payload), priority, maxAttempts]);
  return rows[0].next_run;
}

/** Removes a periodic job; false if there was none. */
async function unscheduleJob(db, name) {
  const { rows } = await db.query('SELECT jobcap.unschedule_job($1) AS removed', [name]);
  return rows[0].removed;
}

/** Enqueues one job in the caller's transaction; resolves to its id. jobcap 0.3.0:
 * concurrencyKey, dedupeWindow (ms: dedupeKey also finds the key's succeeded or cancelled job
 * enqueued within it) and dedupe ('keep' or 'replace': a pending job holding the key takes this
 * payload and runAt); without them, the call a 0.2.0 database knows. */
async function enqueue(db, queue, payload = {}, { runAt = null, priority = 0, maxAttempts = null,
  dedupeKey = null, concurrencyKey = null, dedupeWindow = null, dedupe = 'keep' } = {}) {
  const args = [queue, JSON.stringify(payload), runAt, priority, maxAttempts, dedupeKey];
  let sql = 'SELECT jobcap.enqueue_job($1, $2, coalesce($3, now()), $4, $5, $6';
  for (const [name, value, unset] of [['concurrency_key', concurrencyKey, null],
    ['dedupe_window', interval(dedupeWindow), null], ['dedupe', dedupe, 'keep']]) {
    if (value != unset) {
      args.push(value);
      sql += `, ${name} => $${args.length}`;
    }
  }
  const { rows } = await db.query(`${sql}) AS id`, args);
  return String(rows[0].id);  // digits, as a bigint comes: an id can pass 2^53 (on Citus)
}

/** Completes a job under its fence; output (anything JSON, null for none) is kept in
 * jobs.output, bounded by jobcap.max_output_bytes. */
async function complete(db, jobId, fence, output = null) {
  const { rows } = output == null
    ? await call(db, 'complete_job',
      'SELECT jobcap.complete_job($1, $2) AS state', [jobId, fence], jobId, fence)
    : await call(db, 'complete_job', 'SELECT jobcap.complete_job($1, $2, $3) AS state',
      [jobId, fence, JSON.stringify(output)], jobId, fence);
  return rows[0].state;
}

async function fail(db, jobId, fence, error, retryIn = null) {
  const { rows } = await call(db, 'fail_job',
    'SELECT jobcap.fail_job($1, $2, $3, $4) AS state',
    [jobId, fence, error, interval(retryIn)], jobId, fence);
  return rows[0].state;
}

async function heartbeat(db, jobId, fence, extend = null) {
  const { rows } = await call(db, 'heartbeat',
    'SELECT jobcap.heartbeat($1, $2, $3) AS expires', [jobId, fence, interval(extend)],
    jobId, fence);
  return rows[0].expires;
}

async function assertFence(db, jobId, fence) {
  await call(db, 'assert_fence', 'SELECT jobcap.assert_fence($1, $2)', [jobId, fence],
    jobId, fence);
}

/** Gives back a claimed job whose handler never started (jobcap.release_job): pending again,
 * the claim's attempt not counted. Only for a job whose work never began: releasing one that
 * ran would let it run past its cap. */
async function release(db, jobId, fence) {
  const { rows } = await call(db, 'release_job',
    'SELECT jobcap.release_job($1, $2) AS state', [jobId, fence], jobId, fence);
  return rows[0].state;
}

/** Ends an attempt whose handler's process died (history kind 'crashed'; it counts). */
async function crash(db, jobId, fence, error) {
  const { rows } = await call(db, 'crash_job',
    'SELECT jobcap.crash_job($1, $2, $3) AS state', [jobId, fence, error], jobId, fence);
  return rows[0].state;
}

/** Completes several jobs in one statement, each under its own fence; resolves to how many.
 * All or nothing: when any fence is stale it throws StaleFenceError and completes none, so a
 * caller that must not lose the others completes each on its own then (as the worker does).
 * outputs: null, or one JSON value (or null) per job. */
async function completeJobs(db, jobIds, fences, outputs = null) {
  const { rows } = outputs == null
    ? await call(db, 'complete_jobs', 'SELECT jobcap.complete_jobs($1::bigint[], $2::bigint[]) AS n',
      [jobIds, fences])
    : await call(db, 'complete_jobs',
      'SELECT jobcap.complete_jobs($1::bigint[], $2::bigint[], $3::jsonb[]) AS n',
      [jobIds, fences, outputs.map((o) => (o == null ? null : JSON.stringify(o)))]);
  return rows[0].n;
}

/** Completes a job and claims up to `batch` more in one statement (one commit for both);
 * resolves to the claimed rows. A stale fence throws before anything is claimed. */
async function completeAndClaim(db, jobId, fence, queue, worker, { batch = 1, lease = null,
  output = null } = {}) {
  const columns = 'job_id, fence, attempt, max_attempts, payload, lease_expires_at';
  const { rows } = output == null
    ? await call(db, 'complete_and_claim',
      `SELECT ${columns} FROM jobcap.complete_and_claim($1, $2, $3, $4, $5, $6)`,
      [jobId, fence, queue, worker, batch, interval(lease)], jobId, fence)
    : await call(db, 'complete_and_claim',
      `SELECT ${columns} FROM jobcap.complete_and_claim($1, $2, $3, $4, $5, $6, $7::jsonb)`,
      [jobId, fence, queue, worker, batch, interval(lease), JSON.stringify(output)], jobId, fence);
  return rows;
}

/**
 * Reads a job of a queue the role may work, for the side that enqueued it (no privilege on
 * jobcap.jobs needed): { state, attempts, output, error, finishedAt }. A job of another queue,
 * or one retention deleted, is refused (42501) for a worker role.
 */
async function jobResult(db, jobId) {
  const { rows } = await db.query(
    'SELECT state::text, attempts, output, error, finished_at FROM jobcap.job_result($1)', [jobId]);
  const r = rows[0];
  return { state: r.state, attempts: r.attempts, output: r.output, error: r.error,
    finishedAt: r.finished_at };
}

module.exports = {
  interval, createQueue, alterQueue, setMaxRunning, cancelJob, pauseQueue, resumeQueue, scheduleJob, unscheduleJob,
  enqueue, complete, completeJobs, completeAndClaim, fail, heartbeat, assertFence, release, crash,
  jobResult,
};
