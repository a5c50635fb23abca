'use strict';
// A handler's process. The supervising Worker forks it (child_process.fork) with the handler's
// module path, sends it one job at a time over IPC, and owns the lease: this process keeps its
// own connection for the jobs' transactions, runs the handler, completes or fails the job in
// the handler's transaction and reports the outcome. A job whose handler never used its
// connection is reported as done, and the supervisor completes it with others in one
// statement. If this process dies (a signal, process.exit, an uncaught error), the supervisor
// records the attempt as a crash (jobcap.crash_job).
const { Client } = require('./multihost');
const sql = require('./sql');
const { isStale, translate, isConnectionError, JobCancelledError } = require('./errors');

const [modulePath, configJson] = process.argv.slice(2);
const config = JSON.parse(configJson);
// The supervisor decides when to stop: a SIGTERM sent to the whole process group (a terminal's
// Ctrl-C, systemd) must not end a job in flight.
process.on('SIGTERM', () => {});
process.on('SIGINT', () => {});
process.on('disconnect', () => process.exit(0));  // the supervisor is gone

/** A message to the supervisor; none once it is gone (this process then exits on 'disconnect'). */
function send(message) {
  if (process.connected) process.send(message, () => {});
}

let handler;
let client = null;
const heartbeats = new Map();  // request id -> { resolve, reject }
let nextRequest = 0;
let cancelRunning = null;  // (jobId, reason): aborts the running job's handler
const CANCELLED = Symbol('cancelled');

function loadHandler() {
  const mod = require(modulePath);
  const fn = typeof mod === 'function' ? mod : (mod && (mod.handler || mod.default));
  if (typeof fn !== 'function') {
    throw new TypeError(`${modulePath} exports no handler (module.exports = async (job) => ..., or exports.handler)`);
  }
  return fn;
}

function errorText(err) {
  if (!(err instanceof Error)) return `Error: ${String(err)}`;
  const head = `${err.name}: ${err.message}`;
  return err.stack && err.stack.startsWith(head) ? err.stack : `${head}\n${err.stack || ''}`;
}

/** The job as a handler in a child process sees it: the same surface as in-process. */
class ChildJob {
  constructor(data, db, signal) {
    Object.assign(this, data);
    this._client = db;
    this._begun = null;  // the BEGIN of the job's transaction, sent at the first use of client
    this.signal = signal;
    /** Set by the handler (anything JSON) to keep a result with the job (jobs.output). */
    this.output = null;
  }

  get lastAttempt() { return this.attempt >= this.maxAttempts; }

  /** The connection with the job's transaction open (it begins at this first use). */
  get client() {
    if (!this._begun) {
      // node-postgres runs a client's queries in order: BEGIN goes before the handler's first.
      this._begun = this._client.query('BEGIN');
      this._begun.catch(() => {});  // the handler's own statements fail too; awaited after it
    }
    return this._client;
  }

  async query(text, values) {
    try {
      return await this.client.query(text, values);
    } catch (err) {
      throw translate(err, undefined, this.id, this.fence);
    }
  }

  assertFence() { return sql.assertFence(this.client, this.id, this.fence); }

  /** Asks the supervisor, which holds the lease, to extend it (and the deadline with it). */
  heartbeat() {
    const id = ++nextRequest;
    return new Promise((resolve, reject) => {
      heartbeats.set(id, { resolve, reject });
      send({ type: 'heartbeat', id, jobId: this.id });
    });
  }
}

async function connection() {
  if (client) return client;
  const c = new Client(config);
  c.on('error', () => { if (client === c) client = null; });
  await c.connect();
  client = c;
  return c;
}

async function run(data) {
  let db;
  try {
    db = await connection();
  } catch (err) {
    return { outcome: 'unstarted', error: err.message };  // the supervisor gives it back
  }
  const controller = new AbortController();
  const job = new ChildJob(data, db, controller.signal);
  let reason = null;
  const cancelled = new Promise((resolve) => {
    cancelRunning = (jobId, why) => {
      if (jobId !== job.id || reason) return;
      reason = why;
      resolve(CANCELLED);
    };
  });
  try {
    const work = Promise.resolve().then(() => handler(job));
    const result = await Promise.race([work, cancelled]);
    cancelRunning = null;
    if (result === CANCELLED) {
      // The attempt already ended on the server: abort the handler, drop the connection (and
      // the job's transaction with it); whatever the handler does afterwards is ignored.
      work.catch(() => {});
      controller.abort(new JobCancelledError(`job ${job.id} ended on the server while its handler ran ` +
        `(${reason})`, reason));
      client = null;
      db.end().catch(() => {});
      return { outcome: 'cancelled', reason };
    }
    if (!job._begun) {
      // Nothing to commit with the completion: the supervisor completes it in a batch.
      return { outcome: 'done', output: job.output == null ? null : JSON.stringify(job.output) };
    }
    await job._begun;
    const state = await sql.complete(db, job.id, job.fence, job.output);
    await db.query('COMMIT');
    return { outcome: state };
  } catch (err) {
    cancelRunning = null;
    if (isConnectionError(err) && !isStale(err)) {
      client = null;
      db.end().catch(() => {});
      return { outcome: 'lost', error: err.message };
    }
    if (job._begun) {
      try {
        await db.query('ROLLBACK');
      } catch (rollbackErr) {
        client = null;
        db.end().catch(() => {});
        return { outcome: 'lost', error: rollbackErr.message };
      }
    }
    if (isStale(err)) {
      const stale = translate(err, err.operation, job.id, job.fence);
      return { outcome: 'stale', error: stale.message, operation: stale.operation || null };
    }
    const text = errorText(err);
    try {
      const state = await sql.fail(db, job.id, job.fence, text);
      return { outcome: state === 'pending' ? 'retry' : state, error: text,
        name: err instanceof Error ? err.name : 'Error' };
    } catch (failErr) {
      if (isStale(failErr)) {
        return { outcome: 'stale', error: failErr.message, operation: 'fail_job' };
      }
      return { outcome: 'lost', error: failErr.message };
    }
  }
}

process.on('message', (msg) => {
  if (msg.type === 'run') {
    run(msg.job).then((result) => send({ type: 'outcome', jobId: msg.job.id, ...result }));
  } else if (msg.type === 'cancel') {
    if (cancelRunning) cancelRunning(msg.jobId, msg.reason);
  } else if (msg.type === 'heartbeat') {
    const waiter = heartbeats.get(msg.id);
    if (!waiter) return;
    heartbeats.delete(msg.id);
    if (msg.error) {
      const { StaleFenceError } = require('./errors');
      waiter.reject(msg.stale ? new StaleFenceError(msg.error, { jobId: msg.jobId, operation: 'heartbeat' })
        : new Error(msg.error));
    } else {
      waiter.resolve(new Date(msg.expires));
    }
  }
});

handler = loadHandler();
connection().catch(() => {});  // ready before the first job; retried then if it failed
send({ type: 'ready' });
