'use strict';
// The worker loop: claim up to `concurrency` + `prefetch` jobs, run up to `concurrency` handlers
// at once, each under a deadline in its own transaction, settle, repeat. One control connection
// LISTENs, claims, heartbeats, releases and records crashes.
//
// Isolated (handler given as a module path): each running handler is in a child process of its
// own (child_process.fork of lib/child.js, reused from job to job), with its own connection for
// the job's transaction. A handler that kills its process (SIGKILL, a segfault, process.exit)
// costs nothing to the other jobs: this process sees the child exit and records the attempt at
// once with jobcap.crash_job ("killed by signal N", history kind 'crashed'). At the deadline the
// child is killed and the attempt failed with a JobTimeoutError. In-process (handler given as a
// function): a pool of `concurrency` connections carries the jobs' transactions.
//
// Jobs claimed but not started wait (at most `prefetch` of them) with their leases kept alive by
// heartbeats; on stop() or SIGTERM they are given back with jobcap.release_job (pending again,
// their attempts not counted) and the running ones finish.
//
// Settling. The job's transaction begins with the handler's first use of job.client (or
// job.query, job.assertFence): a job whose handler wrote completes in that transaction, with
// its writes. A job whose handler never used its connection has nothing to commit with its
// completion: it is completed on the control connection together with the others that finished
// meanwhile, in one statement with the next claim (jobcap.complete_and_claim for one job,
// jobcap.complete_jobs for more, each with its own fence). complete_jobs is all or nothing:
// when it raises a stale fence (JC001), each job of the batch is completed on its own, so a
// stale fence costs its job only.
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
const path = require('node:path');
const { fork } = require('node:child_process');
const { performance } = require('node:perf_hooks');
const pg = require('pg');
const { Client } = require('./multihost');
const sql = require('./sql');
const { Watchdog } = require('./watchdog');
const { JobTimeoutError, JobCancelledError, HandlerCrashedError, HandlerError, StaleFenceError,
  isStale, translate, isConnectionError, PoolModeError, STATEMENT_POOLING } = require('./errors');

const COLUMNS = 'job_id, fence, attempt, max_attempts, payload, lease_expires_at';
const CLAIM = `SELECT ${COLUMNS} FROM jobcap.claim_job($1, $2, $3, $4)`;
// Without an output these call the declarations 0.1.0 has too (six and two arguments).
const COMPLETE_AND_CLAIM = `SELECT ${COLUMNS} FROM jobcap.complete_and_claim($1, $2, $3, $4, $5, $6)`;
const COMPLETE_AND_CLAIM_OUTPUT =
  `SELECT ${COLUMNS} FROM jobcap.complete_and_claim($1, $2, $3, $4, $5, $6, $7::jsonb)`;
const COMPLETE_JOBS = 'SELECT jobcap.complete_jobs($1::bigint[], $2::bigint[])';
const COMPLETE_JOBS_OUTPUT = 'SELECT jobcap.complete_jobs($1::bigint[], $2::bigint[], $3::jsonb[])';
// The claim's batch depends on the completion's result, so the claim runs after it (once: a
// materialised CTE), in the same statement.
const thenClaim = (complete, n) => `WITH done(n) AS MATERIALIZED (${complete}) SELECT c.* FROM done` +
  ` CROSS JOIN LATERAL jobcap.claim_job($${n}, $${n + 1}, $${n + 2} + 0 * done.n, $${n + 3}) AS c`;
const MAX_BATCH = 10000;  // complete_jobs takes at most this many jobs per call
const DONE = Symbol('done');
const TIMEOUT = Symbol('timeout');
const CANCELLED = Symbol('cancelled');
/** The channel on which the server tells the worker holding a job that its attempt ended while
 * it ran (cancel_job, max_run_time); payload {"job_id": n, "fence": f, "reason": r}. */
const CANCEL_CHANNEL = 'jobcap_cancel';
/** Isolated: how long a handler's process has to report a cancelled job before it is killed. */
const CANCEL_GRACE = 1000;
// Without LISTEN: the running jobs that were cancelled (job_result, 0.3.0).
const POLL_CANCELLED = 'SELECT j.job_id::text AS job_id FROM pg_catalog.unnest($1::bigint[]) AS j(job_id)' +
  " CROSS JOIN LATERAL jobcap.job_result(j.job_id) AS r WHERE r.state = 'cancelled'";

/** A claimed job, as the handler sees it. `client` has the job's transaction open: write
 * through it and the writes commit with complete_job or not at all (do not COMMIT yourself).
 * `fence` is the lease generation: hand it downstream as an idempotency key. `id` and `fence`
 * are strings of decimal digits, as node-postgres gives a bigint: either can pass 2^53 (on a
 * Citus cluster every fence does, and job ids from the 32nd node on), where a Number would
 * round it to another job's. */
class Job {
  constructor(worker, row, grantedAt) {
    this.id = String(row.job_id);
    this.fence = String(row.fence);
    this.attempt = row.attempt;
    this.maxAttempts = row.max_attempts;
    this.payload = row.payload;
    this.leaseExpiresAt = row.lease_expires_at;
    this._client = null;
    this._begun = null;  // the BEGIN of the job's transaction, sent at the first use of client
    this.signal = null;
    /** Set by the handler (anything JSON) to keep a result with the job (jobs.output). */
    this.output = null;
    this._worker = worker;
    this._grantedAt = grantedAt;
  }

  /** True when a failure now makes the job dead. */
  get lastAttempt() { return this.attempt >= this.maxAttempts; }

  /** The connection with the job's transaction open (it begins at this first use). */
  get client() {
    if (this._client && !this._begun) {
      // node-postgres runs a client's queries in order: BEGIN goes before the handler's first.
      this._begun = this._client.query('BEGIN');
      this._begun.catch(() => {});  // the handler's own statements fail too; awaited after it
    }
    return this._client;
  }

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

/** Runs the handler for the jobs of one queue until stop() or SIGTERM. `handler` is a module
 * path (isolated: each job in a child process) or a function (in-process).
 * Emits 'settled' (job, outcome, error) with outcome 'succeeded', 'retry', 'dead', 'stale' or
 * 'released'. */
class Worker extends EventEmitter {
  constructor({ connection, queue, handler, name, concurrency = 1, prefetch = 0, lease = 60000,
    timeout, pollMin = 50, pollMax = 5000, exitOnHang = true, logger = quietLogger, listen,
    cancelPoll = 1000 }) {
    super();
    if (typeof handler !== 'function' && typeof handler !== 'string') {
      throw new TypeError('handler must be a module path (isolated) or a function (in-process)');
    }
    if (!(Number.isInteger(prefetch) && prefetch >= 0)) throw new RangeError('prefetch must be a non-negative integer');
    if (!queue) throw new TypeError('queue is required');
    if (!(Number.isInteger(concurrency) && concurrency >= 1)) throw new RangeError('concurrency must be a positive integer');
    if (!(lease > 0)) throw new RangeError('lease must be positive');
    if (timeout === undefined) timeout = lease * 0.8;
    if (!(timeout > 0 && timeout < lease)) {
      throw new RangeError(`timeout (${timeout} ms) must be positive and shorter than the lease ` +
        `(${lease} ms): the handler must stop while the lease is ours`);
    }
    if (!(pollMin > 0 && pollMin <= pollMax)) throw new RangeError('pollMin must be positive and at most pollMax');
    if (!(cancelPoll > 0)) throw new RangeError('cancelPoll must be positive');
    this.config = typeof connection === 'string' ? { connectionString: connection } : { ...connection };
    this.queue = queue;
    this.handler = handler;
    this.isolated = typeof handler === 'string';
    this.handlerModule = this.isolated ? path.resolve(handler) : null;
    this.prefetch = prefetch;
    this.name = name || `${os.hostname()}:${process.pid}`;
    this.concurrency = concurrency;
    this.lease = lease;
    this.timeout = timeout;
    this.grace = (lease - timeout) / 2;
    this.pollMin = pollMin;
    this.pollMax = pollMax;
    this.exitOnHang = exitOnHang;
    this.logger = logger;
    // LISTEN for wake-ups: undefined, unless the control connection goes through a pooler
    // (see _ensureControl), where a transaction pooler would drop the notifications.
    this.listen = listen;
    this._pooled = false;
    // Without LISTEN (through a transaction pooler), how often the running jobs' states are
    // read to find the cancelled ones.
    this.cancelPoll = cancelPoll;
    this._listening = false;
    this._cancelPollOk = true;  // false once job_result is missing (0.2.0) or refused (Citus)
    // False once complete_jobs was refused (0A000: on a Citus cluster, which routes only calls
    // naming one job's shard): from then on each job is completed on its own, with no refused
    // try per batch first.
    this._batchOk = true;
    this._polling = false;

    this._control = null;
    this._controlBroken = false;
    this._controlTail = Promise.resolve();  // one statement at a time on the control connection
    this._pool = null;
    this._inflight = new Set();
    this._entries = new Map();   // job id -> { job, deadline, timer, fire }
    this._waiting = [];          // claimed, not started
    this._finished = [];          // finished with nothing to commit: { job, output } to complete
    this._children = [];         // isolated: idle handler processes
    this._living = new Set();    // isolated: every handler process
    this._fatal = null;
    this._spawning = [];         // isolated: handler processes starting, not yet handed a job
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
    this._pool = new pg.Pool({ ...this.config, Client, max: this.concurrency,
      application_name: `jobcap worker ${this.name}`.slice(0, 63) });
    this._pool.on('error', (err) => this.logger.warn(`worker ${this.name}: idle connection lost: ${err.message}`));
    if (this.exitOnHang) this._watchdog = new Watchdog(this.grace, this.name);
    let poll = this.pollMin;
    let retry = 200;
    const keeper = setInterval(() => this._keepWaiting(), Math.max(this.lease / 3, 10));
    const cancelWatch = setInterval(() => {
      if (!this._listening) this._pollCancelled();
    }, this.cancelPoll);
    try {
      if (this.isolated) {
        // Fails early, before any claim, when the handler's module cannot be loaded.
        for (let i = 0; i < this.concurrency; i++) this._spare();
        await Promise.all(this._spawning);
      }
      while (!this._stopping) {
        this._dispatch();
        const room = this.concurrency + this.prefetch - this._inflight.size - this._waiting.length;
        if (room <= 0 && this._finished.length === 0) {
          await this._nap(Infinity);
          continue;
        }
        let jobs;
        try {
          jobs = await this._settle(Math.max(room, 0));
          retry = 200;
        } catch (err) {
          if (!isConnectionError(err)) throw err;
          this.logger.warn(`worker ${this.name}: database unavailable (${err.message}); retrying in ${retry} ms`);
          await this._dropControl();
          await this._nap(retry, true);
          retry = Math.min(retry * 2, 5000);
          continue;
        }
        if (room <= 0) continue;
        if (jobs.length > 0) {
          poll = this.pollMin;
          this._waiting.push(...jobs);
          continue;
        }
        if (this._finished.length > 0) continue;
        if (!(await this._nap(poll))) poll = Math.min(poll * 2, this.pollMax);
      }
      await this._releaseWaiting();
      await Promise.allSettled([...this._inflight]);
      await this._settleAtStop();
    } finally {
      clearInterval(keeper);
      clearInterval(cancelWatch);
      if (handleSignals) {
        process.removeListener('SIGTERM', onSignal);
        process.removeListener('SIGINT', onSignal);
      }
      await this._releaseWaiting().catch(() => {});
      await Promise.allSettled([...this._inflight]);
      await this._settleAtStop();
      for (const child of this._living) {
        if (child.connected) child.disconnect();
      }
      this._children = [];
      if (this._watchdog) this._watchdog.stop();
      this._watchdog = null;
      await this._dropControl();
      await this._pool.end().catch(() => {});
      this._pool = null;
      this.logger.info(`worker ${this.name} stopped`);
    }
    if (this._fatal) throw this._fatal;
  }

  // --- held jobs: started, kept, given back --------------------------------------------------

  /** Starts waiting jobs while a slot is free. */
  _dispatch() {
    while (!this._stopping && this._inflight.size < this.concurrency && this._waiting.length > 0) {
      const job = this._waiting.shift();
      if (job.lost) {
        this._settled(job, job.lost instanceof JobCancelledError ? 'cancelled' : 'stale', job.lost);
        continue;
      }
      this._track(job);
    }
  }

  /** Heartbeats the jobs that wait (to start, or to be completed), so their leases outlast the
   * wait. */
  _keepWaiting() {
    const now = performance.now();
    for (const job of [...this._waiting, ...this._finished.map((d) => d.job)]) {
      if (job.lost || job._renewing || now - job._grantedAt < this.lease / 3) continue;
      job._renewing = true;
      this._heartbeat(job).catch((err) => {
        if (isStale(err)) job.lost = err;
        else this.logger.warn(`worker ${this.name}: heartbeat of job ${job.id} failed: ${err.message}`);
      }).finally(() => { job._renewing = false; });
    }
  }

  /** Gives back the jobs held but not started: pending again, their attempts not counted. */
  async _releaseWaiting() {
    const jobs = this._waiting.splice(0);
    for (const job of jobs) {
      if (!job.lost) await this._release(job);
    }
  }

  async _release(job) {
    try {
      await this._onControl((control) => sql.release(control, job.id, job.fence));
      this._settled(job, 'released', null);
    } catch (err) {
      if (isStale(err)) this._settled(job, 'stale', err);
      else {
        this.logger.warn(`worker ${this.name}: could not release job ${job.id} (${err.message}); ` +
          'it goes back when its lease expires');
      }
    }
  }

  // --- cancellation ---------------------------------------------------------------------------

  /** An attempt ended on the server (a notification on jobcap_cancel, or polling): stops its
   * handler if it runs here, drops it if it waits to start. */
  _onCancel(jobId, fence, reason) {
    const entry = this._entries.get(jobId);
    if (entry && entry.job.fence === fence && entry.cancel) entry.cancel(reason);
    for (const job of this._waiting) {
      if (job.id === jobId && job.fence === fence && !job.lost) {
        job.lost = new JobCancelledError(`job ${jobId} ended on the server before it started (${reason})`, reason);
      }
    }
  }

  _onCancelNotification(payload) {
    let message;
    try {
      message = JSON.parse(payload);
    } catch (err) {
      this.logger.warn(`worker ${this.name}: unreadable ${CANCEL_CHANNEL} payload ${payload}`);
      return;
    }
    // The id and fence as written in the payload: JSON.parse has rounded either beyond 2^53.
    const id = /"job_id"\s*:\s*(-?\d+)/.exec(payload);
    const fence = /"fence"\s*:\s*(-?\d+)/.exec(payload);
    this._onCancel(id ? id[1] : String(message.job_id), fence ? fence[1] : String(message.fence),
      String(message.reason || 'cancelled'));
  }

  /** Without LISTEN: reads the states of the running jobs and stops the cancelled ones (also
   * once after a new LISTEN, for a notification sent while the worker reconnected). On a
   * database still at 0.2.0 (no job_result) the handler learns it at its next fenced call. */
  async _pollCancelled() {
    const running = [...this._entries.values()].filter((e) => e.cancel && !e.cancelled).map((e) => e.job);
    if (running.length === 0 || !this._cancelPollOk || this._polling || !this._control) return;
    this._polling = true;
    try {
      const { rows } = await this._onControl((control) =>
        control.query(POLL_CANCELLED, [running.map((job) => job.id)]));
      const fences = new Map(running.map((job) => [job.id, job.fence]));
      for (const { job_id: id } of rows) this._onCancel(id, fences.get(id), 'cancelled');
    } catch (err) {
      // 42883: a database at 0.2.0; 0A000: a distributed install (Citus), where job_result is
      // refused. Either way polling cannot work; the handler learns at its next fenced call.
      if (err && (err.code === '42883' || err.code === '0A000')) this._cancelPollOk = false;
    } finally {
      this._polling = false;
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
    const client = new Client({ ...this.config,
      application_name: `jobcap control ${this.name}`.slice(0, 63) });
    client.on('error', (err) => {
      this._controlBroken = true;
      this.logger.warn(`worker ${this.name}: control connection lost: ${err.message}`);
    });
    client.on('end', () => { this._controlBroken = true; });
    client.on('notification', (note) => {
      if (note.channel === 'jobcap' && note.payload === this.queue) this._wake();
      else if (note.channel === CANCEL_CHANNEL) this._onCancelNotification(note.payload);
    });
    let listening = false;
    try {
      await client.connect();
      // A pooler that multiplexes server connections (PgBouncer, in any pool mode) hands each
      // client a cancel key of its own: the process it names is not the server's backend.
      // Through one, consecutive transactions may run on different server connections: a
      // notification would reach a server connection the pooler holds for no client (it drops
      // it), so the loop polls; and pg_cancel_backend of client.processID would name no backend.
      const { rows } = await client.query('SELECT pg_catalog.pg_backend_pid() AS pid');
      this._pooled = rows[0].pid !== client.processID;
      if (this._pooled) {
        try {
          await client.query('BEGIN');
          await client.query('COMMIT');
        } catch (err) {
          if (!String(err && err.message).includes(STATEMENT_POOLING)) throw err;
          throw new PoolModeError('jobcap: a jobcap worker needs transactions, and the pooler in ' +
            'front of the server (PgBouncer in pool_mode = statement) refuses them: use ' +
            'pool_mode = transaction (or session) for this database', { cause: err });
        }
      }
      listening = this.listen === undefined ? !this._pooled : Boolean(this.listen);
      if (listening) await client.query(`LISTEN jobcap; LISTEN ${CANCEL_CHANNEL}`);
    } catch (err) {
      client.end().catch(() => {});
      throw err;
    }
    this._control = client;
    this._controlBroken = false;
    this._listening = listening;
    // A notification sent while there was no listening connection is lost: look once.
    if (listening && this._entries.size > 0) setImmediate(() => this._pollCancelled());
    if (listening) this.logger.info(`worker ${this.name}: connected, listening for queue ${this.queue}`);
    else {
      this.logger.info(`worker ${this.name}: connected through a pooler, polling queue ${this.queue} ` +
        `(every ${this.pollMin} to ${this.pollMax} ms; listen: true to LISTEN under session pooling)`);
    }
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

  // --- settling in batches ------------------------------------------------------------------

  /** A job finished with nothing in its transaction: it is completed with the next batch
   * (the loop wakes when the job's slot is free: _track). */
  _defer(job, output) {
    this._finished.push({ job, output });
  }

  /** Completes the finished jobs waiting for it and claims up to `claim` more, in one statement
   * on the control connection; resolves to the jobs claimed. A stale fence in the batch
   * (complete_jobs is all or nothing) or another error of the statement: each job is then
   * completed on its own. A lost connection puts the jobs back and rejects. */
  async _settle(claim) {
    const done = this._finished.splice(0, MAX_BATCH);
    const current = [];
    for (const entry of done) {
      if (entry.job.lost) this._settled(entry.job, 'stale', entry.job.lost);
      else current.push(entry);
    }
    if (current.length === 0) return claim > 0 ? this._claim(claim) : [];
    const lease = sql.interval(this.lease);
    return this._onControl(async (control) => {
      const sent = performance.now();
      let text;
      let values;
      const withOutput = current.some((d) => d.output != null);
      if (current.length === 1 && claim > 0) {
        const { job, output } = current[0];
        text = withOutput ? COMPLETE_AND_CLAIM_OUTPUT : COMPLETE_AND_CLAIM;
        values = [job.id, job.fence, this.queue, this.name, claim, lease];
        if (withOutput) values.push(output);
      } else {
        text = withOutput ? COMPLETE_JOBS_OUTPUT : COMPLETE_JOBS;
        values = [current.map((d) => d.job.id), current.map((d) => d.job.fence)];
        if (withOutput) values.push(current.map((d) => d.output));
        if (claim > 0) {
          text = thenClaim(text, values.length + 1);
          values.push(this.queue, this.name, claim, lease);
        }
      }
      const eachOnItsOwn = async () => {
        await this._completeEach(control, current);
        if (claim <= 0) return [];
        const claimedAt = performance.now();
        const claimed = await control.query(CLAIM, [this.queue, this.name, claim, lease]);
        return claimed.rows.map((row) => new Job(this, row, claimedAt));
      };
      let rows;
      const batched = text !== COMPLETE_AND_CLAIM && text !== COMPLETE_AND_CLAIM_OUTPUT;
      if (!this._batchOk && batched) return eachOnItsOwn();
      try {
        ({ rows } = await control.query(text, values));
      } catch (err) {
        if (isConnectionError(err) && !isStale(err)) {
          this._finished.unshift(...current);
          throw err;
        }
        if (err && err.code === '0A000' && batched) {
          this._batchOk = false;
          this.logger.info(`worker ${this.name}: complete_jobs is refused here (${err.message}); ` +
            'completing each job on its own from now on');
        } else {
          this.logger.info(`worker ${this.name}: completing ${current.length} jobs together ` +
            `failed (${err.message}); completing each on its own`);
        }
        return eachOnItsOwn();
      }
      for (const { job } of current) this._settled(job, 'succeeded', null);
      return claim > 0 ? rows.map((row) => new Job(this, row, sent)) : [];
    });
  }

  /** Completes each job in a transaction of its own (autocommit): a stale fence is that job's
   * outcome; another error fails that job, as a failed completion in its transaction would. */
  async _completeEach(control, entries) {
    for (let i = 0; i < entries.length; i++) {
      const { job, output } = entries[i];
      try {
        const { rows } = output == null
          ? await control.query('SELECT jobcap.complete_job($1, $2) AS state', [job.id, job.fence])
          : await control.query('SELECT jobcap.complete_job($1, $2, $3::jsonb) AS state',
            [job.id, job.fence, output]);
        this._settled(job, rows[0].state, null);
      } catch (err) {
        if (isStale(err)) {
          this._settled(job, 'stale', translate(err, 'complete_job', job.id, job.fence));
        } else if (isConnectionError(err)) {
          this._finished.unshift(...entries.slice(i));
          throw err;
        } else {
          try {
            const state = await sql.fail(control, job.id, job.fence, errorText(err));
            this._settled(job, state === 'pending' ? 'retry' : state, err);
          } catch (failErr) {
            if (isStale(failErr)) this._settled(job, 'stale', failErr);
            else {
              this._finished.unshift(...entries.slice(i + 1));
              throw failErr;
            }
          }
        }
      }
    }
  }

  /** Completes what finished, as the loop ends; what cannot be completed goes back when its
   * lease expires. */
  async _settleAtStop() {
    while (this._finished.length > 0) {
      const left = this._finished.length;
      try {
        await this._settle(0);
      } catch (err) {
        this.logger.warn(`worker ${this.name}: could not complete ${left} finished jobs ` +
          `(${err.message}); they go back when their leases expire`);
        this._finished = [];
      }
    }
  }

  // --- one job -------------------------------------------------------------------------------

  _track(job) {
    const running = this._runJob(job)
      .catch((err) => this.logger.error(`worker ${this.name}: job ${job.id}: ${err.stack}`))
      .finally(() => {
        this._inflight.delete(running);
        this._dispatch();  // a waiting job takes the slot now, not after the loop's round trip
        this._wake();
      });
    this._inflight.add(running);
  }

  async _runJob(job) {
    if (performance.now() - job._grantedAt > this.lease / 3) {
      // It waited behind others: renew its lease so the full timeout fits.
      try {
        await this._heartbeat(job);
      } catch (err) {
        if (isStale(err)) {
          this._settled(job, 'stale', err);
          return;
        }
      }
    }
    if (this.isolated) {
      await this._runIsolated(job);
      return;
    }
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
    job._client = client;
    job.signal = controller.signal;
    const entry = { job, deadline: job._grantedAt + this.timeout, timer: null, fire: null,
      cancel: null, cancelled: null };
    const timedOut = new Promise((resolve) => { entry.fire = resolve; });
    const cancelled = new Promise((resolve) => {
      entry.cancel = (reason) => {
        if (entry.cancelled) return;
        entry.cancelled = reason;
        resolve(CANCELLED);
      };
    });
    this._entries.set(job.id, entry);
    this._arm(entry);
    let destroy = false;
    try {
      const work = Promise.resolve().then(() => this.handler(job));
      const result = await Promise.race([work.then(() => DONE), timedOut.then(() => TIMEOUT), cancelled]);
      if (result === CANCELLED) {
        // The attempt already ended on the server (its fence is stale): abort the handler,
        // drop its connection and transaction, and neither complete nor fail the job. A
        // handler that ignores the signal runs on detached, without its connection.
        work.catch(() => {});
        this._unwatch(entry);
        const err = new JobCancelledError(`job ${job.id} ended on the server while its handler ran ` +
          `(${entry.cancelled})`, entry.cancelled);
        controller.abort(err);
        destroy = true;
        await this._cancel(client);
        this._settled(job, 'cancelled', err);
        return;
      }
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
      if (!job._begun) {
        // Nothing to commit with the completion: it joins the next batch.
        this._defer(job, job.output == null ? null : JSON.stringify(job.output));
        return;
      }
      await job._begun;
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
      if (job._begun) {
        try {
          await client.query('ROLLBACK');
        } catch (rollbackErr) {
          destroy = true;
        }
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

  // --- isolated: one child process per running job -------------------------------------------

  /** An idle handler process, or one being started, or a new one. */
  _acquireChild() {
    while (this._children.length > 0) {
      const idle = this._children.pop();
      if (idle.connected && idle.exitCode === null && idle.signalCode === null) return Promise.resolve(idle);
    }
    if (this._spawning.length > 0) return this._spawning.shift();
    return this._spawnChild();
  }

  /** Starts a handler process ahead of need (at start, and after one died), so that its start-up
   * is not charged to a job's timeout. */
  _spare() {
    const ready = this._spawnChild();
    ready.catch(() => {});
    this._spawning.push(ready);
    return ready;
  }

  /** A new handler process, resolved once it has loaded the handler's module. */
  _spawnChild() {
    const config = { ...this.config, application_name: `jobcap job ${this.name}`.slice(0, 63) };
    const child = fork(path.join(__dirname, 'child.js'), [this.handlerModule, JSON.stringify(config)],
      { stdio: 'inherit', serialization: 'json' });
    this._living.add(child);
    child.on('exit', () => {
      this._living.delete(child);
      this._children = this._children.filter((c) => c !== child);
    });
    child.on('message', (msg) => {
      if (msg.type === 'heartbeat' && child.job && child.job.id === msg.jobId) {
        this._heartbeat(child.job).then(
          (expires) => child.connected && child.send({ type: 'heartbeat', id: msg.id, expires: expires.toISOString() }),
          (err) => child.connected && child.send({ type: 'heartbeat', id: msg.id, jobId: msg.jobId,
            error: err.message, stale: isStale(err) }));
      }
    });
    return new Promise((resolve, reject) => {
      const onMessage = (msg) => {
        if (msg.type !== 'ready') return;
        child.removeListener('exit', onExit);
        child.removeListener('message', onMessage);
        resolve(child);
      };
      const onExit = (code, signal) => {
        child.removeListener('message', onMessage);
        reject(new Error(`the handler module ${this.handlerModule} could not be loaded ` +
          `(its process exited with ${signal || `status ${code}`})`));
      };
      child.on('message', onMessage);
      child.once('exit', onExit);
    });
  }

  async _runIsolated(job) {
    let child;
    try {
      child = await this._acquireChild();
    } catch (err) {
      // A handler that cannot load would crash every job to its cap: give the job back, stop.
      this.logger.error(`worker ${this.name}: ${err.message}; stopping`);
      this._fatal = this._fatal || err;
      this._waiting.unshift(job);
      this.stop();
      return;
    }
    const entry = { job, deadline: job._grantedAt + this.timeout, timer: null, fire: null,
      cancel: null, cancelled: null };
    let timedOut = false;
    let killTimer = null;
    const ended = new Promise((resolve) => {
      entry.fire = () => {
        timedOut = true;
        child.kill('SIGKILL');
      };
      // The process aborts the handler's signal, drops its connection and reports at once; one
      // that does not within CANCEL_GRACE is killed.
      entry.cancel = (reason) => {
        if (entry.cancelled || timedOut) return;
        entry.cancelled = reason;
        if (child.connected) child.send({ type: 'cancel', jobId: job.id, reason });
        killTimer = setTimeout(() => child.kill('SIGKILL'), CANCEL_GRACE);
      };
      const onMessage = (msg) => {
        if (msg.type !== 'outcome' || msg.jobId !== job.id || timedOut) return;
        child.removeListener('message', onMessage);
        child.removeListener('exit', onExit);
        resolve({ message: msg });
      };
      const onExit = (code, signal) => {
        child.removeListener('message', onMessage);
        resolve({ code, signal });
      };
      child.on('message', onMessage);
      child.once('exit', onExit);
    });
    this._entries.set(job.id, entry);
    this._arm(entry);
    child.job = job;
    child.send({ type: 'run', job: { id: job.id, fence: job.fence, attempt: job.attempt,
      maxAttempts: job.maxAttempts, payload: job.payload, leaseExpiresAt: job.leaseExpiresAt } });
    const result = await ended;
    if (killTimer) clearTimeout(killTimer);
    this._unwatch(entry);
    child.job = null;
    if (entry.cancelled && (!result.message || result.message.outcome === 'cancelled')) {
      if (result.message) this._children.push(child);
      else if (!this._stopping) this._spare();
      const how = result.message ? 'its handler was aborted' : 'its process was killed';
      this._settled(job, 'cancelled', new JobCancelledError(`job ${job.id} ended on the server ` +
        `while its handler ran (${entry.cancelled}); ${how}`, entry.cancelled));
      return;
    }
    if (result.message) {
      this._children.push(child);
      const msg = result.message;
      if (msg.outcome === 'done') {
        this._defer(job, msg.output);
        return;
      }
      if (msg.outcome === 'unstarted') {
        this.logger.warn(`worker ${this.name}: job ${job.id} could not start (${msg.error}); giving it back`);
        await this._release(job);
        return;
      }
      if (msg.outcome === 'lost') {
        this.logger.warn(`worker ${this.name}: job ${job.id} lost its connection (${msg.error}); ` +
          'it goes back when its lease expires');
        return;
      }
      let error = null;
      if (msg.outcome === 'stale') {
        error = new StaleFenceError(msg.error, { jobId: job.id, fence: job.fence, operation: msg.operation || undefined });
      } else if (msg.error) {
        error = new HandlerError(msg.error, msg.name);
      }
      this._settled(job, msg.outcome, error);
      return;
    }
    if (!this._stopping) this._spare();
    if (timedOut) {
      const err = new JobTimeoutError(`handler ran past its ${this.timeout} ms timeout`);
      await this._fail(job, null, `${err.name}: ${err.message} (its process was killed)`, err);
      return;
    }
    const text = result.signal
      ? `killed by signal ${os.constants.signals[result.signal] || '?'} (${result.signal})`
      : `exited with status ${result.code} without settling the job`;
    await this._crash(job, text);
  }

  /** Records the attempt of a job whose handler's process died, as a crash. */
  async _crash(job, text) {
    const cause = new HandlerCrashedError(text);
    try {
      const state = await this._onControl((control) => sql.crash(control, job.id, job.fence, text));
      this._settled(job, state === 'pending' ? 'retry' : state, cause);
    } catch (err) {
      if (isStale(err)) {
        this._settled(job, 'stale', err);
      } else {
        this.logger.warn(`worker ${this.name}: could not record the crash of job ${job.id} ` +
          `(${err.message}); it goes back when its lease expires`);
      }
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
    if (!client.processID || this._pooled) return;
    try {
      await this._onControl((control) =>
        control.query('SELECT pg_cancel_backend($1)', [client.processID]));
    } catch (err) {
      // Best effort: closing the connection rolls the transaction back in any case.
    }
  }

  _settled(job, outcome, error) {
    if (!['succeeded', 'stale', 'released', 'cancelled'].includes(outcome)) {
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
