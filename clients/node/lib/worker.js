'use strict';
// The worker loop: claim up to `concurrency` jobs, run each handler under a deadline in its own
// transaction, settle it, repeat. One control connection LISTENs, claims and heartbeats; a
// pool of `concurrency` connections carries the jobs' transactions.
//
// The deadline. A handler must finish `timeout` ms after its lease was last granted (claim or
// job.heartbeat()), and timeout < lease, so it is stopped while the lease is still ours. At
// the deadline job.signal aborts, the job's connection is cancelled and closed (its
// transaction can no longer commit), and the attempt is failed. JavaScript cannot stop a
// promise, so a handler that ignores the signal keeps running detached, without its
// connection; a handler that blocks the event loop is ended by the watchdog thread, which
// kills the process before the lease runs out (exitOnHang).
const { EventEmitter } = require('node:events');
const os = require('node:os');
const { performance } = require('node:perf_hooks');
const pg = require('pg');
const sql = require('./sql');
const { Watchdog } = require('./watchdog');
const { JobTimeoutError, isStale, translate, isConnectionError } = require('./errors');

const CLAIM = 'SELECT job_id, fence, attempt, max_attempts, payload, lease_expires_at' +
  ' FROM jobcap.claim_job($1, $2, $3, $4)';
const DONE = Symbol('done');
const TIMEOUT = Symbol('timeout');

/** A claimed job, as the handler sees it. `client` has the job's transaction open: write
 * through it and the writes commit with complete_job or not at all (do not COMMIT yourself).
 * `fence` is the lease generation: hand it downstream as an idempotency key. */
class Job {
  constructor(worker, row, grantedAt) {
    this.id = Number(row.job_id);
    this.fence = Number(row.fence);
    this.attempt = row.attempt;
    this.maxAttempts = row.max_attempts;
    this.payload = row.payload;
    this.leaseExpiresAt = row.lease_expires_at;
    this.client = null;
    this.signal = null;
    /** Set by the handler (anything JSON) to keep a result with the job (jobs.output). */
    this.output = null;
    this._worker = worker;
    this._grantedAt = grantedAt;
  }

  /** True when a failure now makes the job dead. */
  get lastAttempt() { return this.attempt >= this.maxAttempts; }

  /** Runs a statement in the job's transaction. */
  async query(text, values) {
    try {
      return await this.client.query(text, values);
    } catch (err) {
      throw translate(err, undefined, this.id, this.fence);
    }
  }

  /** Throws StaleFenceError unless the lease is current, and holds the job row to commit, so
   * writes committed with it committed under a current lease. */
  assertFence() { return sql.assertFence(this.client, this.id, this.fence); }

  /** Extends the lease by its length from now, and the deadline with it. Outside the job's
   * transaction, so the reaper sees it at once. Throws StaleFenceError if the lease is gone. */
  heartbeat() { return this._worker._heartbeat(this); }
}

function errorText(err) {
  if (!(err instanceof Error)) return `Error: ${String(err)}`;
  const head = `${err.name}: ${err.message}`;
  return err.stack && err.stack.startsWith(head) ? err.stack : `${head}\n${err.stack || ''}`;
}

const quietLogger = { info() {}, warn: (...a) => console.warn(...a), error: (...a) => console.error(...a) };

/** Runs `handler(job)` for the jobs of one queue until stop() or SIGTERM.
 * Emits 'settled' (job, outcome, error) with outcome 'succeeded', 'retry', 'dead' or 'stale'. */
class Worker extends EventEmitter {
  constructor({ connection, queue, handler, name, concurrency = 1, lease = 60000, timeout,
    pollMin = 50, pollMax = 5000, exitOnHang = true, logger = quietLogger }) {
    super();
    if (typeof handler !== 'function') throw new TypeError('handler must be a function');
    if (!queue) throw new TypeError('queue is required');
    if (!(Number.isInteger(concurrency) && concurrency >= 1)) throw new RangeError('concurrency must be a positive integer');
    if (!(lease > 0)) throw new RangeError('lease must be positive');
    if (timeout === undefined) timeout = lease * 0.8;
    if (!(timeout > 0 && timeout < lease)) {
      throw new RangeError(`timeout (${timeout} ms) must be positive and shorter than the lease ` +
        `(${lease} ms): the handler must stop while the lease is ours`);
    }
    if (!(pollMin > 0 && pollMin <= pollMax)) throw new RangeError('pollMin must be positive and at most pollMax');
    this.config = typeof connection === 'string' ? { connectionString: connection } : { ...connection };
    this.queue = queue;
    this.handler = handler;
    this.name = name || `${os.hostname()}:${process.pid}`;
    this.concurrency = concurrency;
    this.lease = lease;
    this.timeout = timeout;
    this.grace = (lease - timeout) / 2;
    this.pollMin = pollMin;
    this.pollMax = pollMax;
    this.exitOnHang = exitOnHang;
    this.logger = logger;

    this._control = null;
    this._controlBroken = false;
    this._controlTail = Promise.resolve();  // one statement at a time on the control connection
    this._pool = null;
    this._inflight = new Set();
    this._entries = new Map();   // job id -> { job, deadline, timer, fire }
    this._stopping = false;
    this._woken = false;
    this._nudge = null;
    this._watchdog = null;
    this._done = null;
  }

  get stopping() { return this._stopping; }

  /** Asks the loop to stop: it finishes the jobs it holds, claims no more. Resolves when run()
   * has returned. */
  stop() {
    this._stopping = true;
    this._wake();
    return this._done || Promise.resolve();
  }

  /** The loop; resolves once stopped. Takes SIGTERM and SIGINT as stop() unless told not to. */
  run({ handleSignals = true } = {}) {
    if (this._done) throw new Error('this worker is already running');
    this._stopping = false;
    this._done = this._run(handleSignals).finally(() => { this._done = null; });
    return this._done;
  }

  async _run(handleSignals) {
    const onSignal = (signal) => {
      this.logger.info(`worker ${this.name}: ${signal}, finishing the jobs it holds`);
      this.stop();
    };
    if (handleSignals) {
      process.once('SIGTERM', onSignal);
      process.once('SIGINT', onSignal);
    }
    this._pool = new pg.Pool({ ...this.config, max: this.concurrency,
      application_name: `jobcap worker ${this.name}`.slice(0, 63) });
    this._pool.on('error', (err) => this.logger.warn(`worker ${this.name}: idle connection lost: ${err.message}`));
    if (this.exitOnHang) this._watchdog = new Watchdog(this.grace, this.name);
    let poll = this.pollMin;
    let retry = 200;
    try {
      while (!this._stopping) {
        if (this._inflight.size >= this.concurrency) {
          await this._nap(Infinity);
          continue;
        }
        let jobs;
        try {
          jobs = await this._claim(this.concurrency - this._inflight.size);
          retry = 200;
        } catch (err) {
          if (!isConnectionError(err)) throw err;
          this.logger.warn(`worker ${this.name}: database unavailable (${err.message}); retrying in ${retry} ms`);
          await this._dropControl();
          await this._nap(retry, true);
          retry = Math.min(retry * 2, 5000);
          continue;
        }
        if (jobs.length > 0) {
          poll = this.pollMin;
          for (const job of jobs) this._track(job);
          continue;
        }
        if (!(await this._nap(poll))) poll = Math.min(poll * 2, this.pollMax);
      }
      await Promise.allSettled([...this._inflight]);
    } finally {
      if (handleSignals) {
        process.removeListener('SIGTERM', onSignal);
        process.removeListener('SIGINT', onSignal);
      }
      await Promise.allSettled([...this._inflight]);
      if (this._watchdog) this._watchdog.stop();
      this._watchdog = null;
      await this._dropControl();
      await this._pool.end().catch(() => {});
      this._pool = null;
      this.logger.info(`worker ${this.name} stopped`);
    }
  }

  // --- waking and napping --------------------------------------------------------------------

  _wake() {
    this._woken = true;
    if (this._nudge) this._nudge();
  }

  /** Waits for a wake-up (notification, a freed slot, stop) or `ms`. True when woken. */
  _nap(ms, ignoreWakeups = false) {
    if (this._stopping) return Promise.resolve(true);
    if (this._woken && !ignoreWakeups) {
      this._woken = false;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      let timer = null;
      const finish = (woken) => {
        if (timer) clearTimeout(timer);
        this._nudge = null;
        if (woken) this._woken = false;
        resolve(woken);
      };
      this._nudge = ignoreWakeups ? () => { if (this._stopping) finish(true); } : () => finish(true);
      if (ms !== Infinity) timer = setTimeout(() => finish(false), ms);
    });
  }

  // --- the control connection ----------------------------------------------------------------

  async _ensureControl() {
    if (this._control && !this._controlBroken) return;
    await this._dropControl();
    const client = new pg.Client({ ...this.config,
      application_name: `jobcap control ${this.name}`.slice(0, 63) });
    client.on('error', (err) => {
      this._controlBroken = true;
      this.logger.warn(`worker ${this.name}: control connection lost: ${err.message}`);
    });
    client.on('end', () => { this._controlBroken = true; });
    client.on('notification', (note) => {
      if (note.channel === 'jobcap' && note.payload === this.queue) this._wake();
    });
    try {
      await client.connect();
      await client.query('LISTEN jobcap');
    } catch (err) {
      client.end().catch(() => {});
      throw err;
    }
    this._control = client;
    this._controlBroken = false;
    this.logger.info(`worker ${this.name}: connected, listening for queue ${this.queue}`);
  }

  /** Runs fn(client) on the control connection, after whatever runs there now. */
  _onControl(fn) {
    const run = this._controlTail.then(async () => {
      await this._ensureControl();
      return fn(this._control);
    });
    this._controlTail = run.catch(() => {});
    return run;
  }

  async _dropControl() {
    const client = this._control;
    this._control = null;
    if (client) await client.end().catch(() => {});
  }

  async _claim(n) {
    return this._onControl(async (control) => {
      const sent = performance.now();
      const { rows } = await control.query(CLAIM,
        [this.queue, this.name, n, sql.interval(this.lease)]);
      return rows.map((row) => new Job(this, row, sent));
    });
  }

  // --- one job -------------------------------------------------------------------------------

  _track(job) {
    const running = this._runJob(job)
      .catch((err) => this.logger.error(`worker ${this.name}: job ${job.id}: ${err.stack}`))
      .finally(() => {
        this._inflight.delete(running);
        this._wake();
      });
    this._inflight.add(running);
  }

  async _runJob(job) {
    let client;
    try {
      client = await this._pool.connect();
    } catch (err) {
      this.logger.warn(`worker ${this.name}: no connection for job ${job.id} (${err.message}); ` +
        'it goes back when its lease expires');
      return;
    }
    // A checked-out client has no 'error' listener of the pool's: without ours, a connection
    // that dies while the handler is between statements would crash the process.
    let broken = null;
    const onError = (err) => { broken = err; };
    client.on('error', onError);
    const controller = new AbortController();
    job.client = client;
    job.signal = controller.signal;
    const entry = { job, deadline: job._grantedAt + this.timeout, timer: null, fire: null };
    const timedOut = new Promise((resolve) => { entry.fire = resolve; });
    this._entries.set(job.id, entry);
    this._arm(entry);
    let destroy = false;
    try {
      await client.query('BEGIN');
      const work = Promise.resolve().then(() => this.handler(job));
      const result = await Promise.race([work.then(() => DONE), timedOut.then(() => TIMEOUT)]);
      if (result === TIMEOUT) {
        work.catch(() => {});  // it runs on, detached and without its connection
        this._unwatch(entry);
        const err = new JobTimeoutError(`handler ran past its ${this.timeout} ms timeout`);
        controller.abort(err);
        destroy = true;
        await this._cancel(client);
        await this._fail(job, null, `${err.name}: ${err.message}`, err);
        return;
      }
      this._unwatch(entry);
      const state = await sql.complete(client, job.id, job.fence, job.output);
      await client.query('COMMIT');
      this._settled(job, state, null);
    } catch (err) {
      this._unwatch(entry);
      if ((broken || isConnectionError(err)) && !isStale(err)) {
        destroy = true;
        this.logger.warn(`worker ${this.name}: job ${job.id} lost its connection (${err.message}); ` +
          'it goes back when its lease expires');
        return;
      }
      try {
        await client.query('ROLLBACK');
      } catch (rollbackErr) {
        destroy = true;
      }
      if (isStale(err)) {
        this._settled(job, 'stale', translate(err, err.operation, job.id, job.fence));
        return;
      }
      await this._fail(job, destroy ? null : client, errorText(err), err);
    } finally {
      this._unwatch(entry);
      this._entries.delete(job.id);
      client.removeListener('error', onError);
      client.release(destroy || broken ? true : undefined);
    }
  }

  /** Fails the attempt on `client` (the job's, rolled back) or, when null, on the control
   * connection. */
  async _fail(job, client, text, cause) {
    try {
      const state = client ? await sql.fail(client, job.id, job.fence, text)
        : await this._onControl((control) => sql.fail(control, job.id, job.fence, text));
      this._settled(job, state === 'pending' ? 'retry' : state, cause);
    } catch (err) {
      if (isStale(err)) {
        this._settled(job, 'stale', err);
      } else {
        this.logger.warn(`worker ${this.name}: could not fail job ${job.id} (${err.message}); ` +
          'it goes back when its lease expires');
      }
    }
  }

  /** Cancels whatever the job's connection is running, so nothing of it lingers server-side. */
  async _cancel(client) {
    if (!client.processID) return;
    try {
      await this._onControl((control) =>
        control.query('SELECT pg_cancel_backend($1)', [client.processID]));
    } catch (err) {
      // Best effort: closing the connection rolls the transaction back in any case.
    }
  }

  _settled(job, outcome, error) {
    if (outcome !== 'succeeded' && outcome !== 'stale') {
      this.logger.info(`worker ${this.name}: job ${job.id} attempt ${job.attempt}/${job.maxAttempts} ` +
        `failed (${outcome}): ${error && error.message}`);
    }
    try {
      this.emit('settled', job, outcome, error);
    } catch (err) {
      this.logger.error(`worker ${this.name}: a 'settled' listener threw: ${err.stack}`);
    }
  }

  // --- deadlines and leases ------------------------------------------------------------------

  _arm(entry) {
    if (entry.timer) clearTimeout(entry.timer);
    entry.timer = setTimeout(entry.fire, Math.max(entry.deadline - performance.now(), 1));
    this._updateWatchdog();
  }

  _unwatch(entry) {
    if (entry.timer) clearTimeout(entry.timer);
    entry.timer = null;
    entry.watched = false;
    this._entries.delete(entry.job.id);
    this._updateWatchdog();
  }

  _updateWatchdog() {
    if (!this._watchdog) return;
    let earliest = Infinity;
    for (const e of this._entries.values()) earliest = Math.min(earliest, e.deadline);
    this._watchdog.deadline(earliest === Infinity ? 0 : Date.now() + (earliest - performance.now()));
  }

  async _heartbeat(job) {
    let sent;
    const expires = await this._onControl((control) => {
      sent = performance.now();
      return sql.heartbeat(control, job.id, job.fence);
    });
    job.leaseExpiresAt = expires;
    job._grantedAt = sent;
    const entry = this._entries.get(job.id);
    if (entry && entry.timer) {
      entry.deadline = sent + this.timeout;
      this._arm(entry);
    }
    return expires;
  }
}

module.exports = { Worker, Job, errorText };
