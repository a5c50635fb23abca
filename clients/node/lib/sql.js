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

module.exports = { interval, createQueue, enqueue, complete, fail, heartbeat, assertFence };
