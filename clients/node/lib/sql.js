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

async function createQueue(db, queue, { maxAttempts = null, lease = 300000, backoffBase = 10000,
  backoffMax = 3600000, notify = false } = {}) {
  await db.query('SELECT jobcap.create_queue($1, $2, $3, $4, $5, $6)',
    [queue, maxAttempts, interval(lease), interval(backoffBase), interval(backoffMax), notify]);
}

/** Enqueues one job in the caller's transaction; resolves to its id. */
async function enqueue(db, queue, payload = {}, { runAt = null, priority = 0, maxAttempts = null,
  dedupeKey = null } = {}) {
  const { rows } = await db.query(
    'SELECT jobcap.enqueue_job($1, $2, coalesce($3, now()), $4, $5, $6) AS id',
    [queue, JSON.stringify(payload), runAt, priority, maxAttempts, dedupeKey]);
  return Number(rows[0].id);
}

async function complete(db, jobId, fence) {
  const { rows } = await call(db, 'complete_job',
    'SELECT jobcap.complete_job($1, $2)::text AS state', [jobId, fence], jobId, fence);
  return rows[0].state;
}

async function fail(db, jobId, fence, error, retryIn = null) {
  const { rows } = await call(db, 'fail_job',
    'SELECT jobcap.fail_job($1, $2, $3, $4)::text AS state',
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
    'SELECT jobcap.release_job($1, $2)::text AS state', [jobId, fence], jobId, fence);
  return rows[0].state;
}

/** Ends an attempt whose handler's process died (history kind 'crashed'; it counts). */
async function crash(db, jobId, fence, error) {
  const { rows } = await call(db, 'crash_job',
    'SELECT jobcap.crash_job($1, $2, $3)::text AS state', [jobId, fence, error], jobId, fence);
  return rows[0].state;
}

module.exports = { interval, createQueue, enqueue, complete, fail, heartbeat, assertFence,
  release, crash };
