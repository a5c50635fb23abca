'use strict';
// The Node client against a throwaway server: settle, fence, timeouts, wake-ups, signals.
const { describe, it, before, after, beforeEach, afterEach } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const pg = require('pg');
const jobcap = require('../lib');
const { Server } = require('../test-support/pgserver');

let server;
let db;
let counter = 0;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitFor(predicate, timeout = 10000) {
  const end = Date.now() + timeout;
  while (Date.now() < end) {
    if (await predicate()) return;
    await sleep(20);
  }
  throw new Error(`condition not met within ${timeout} ms`);
}

before(async () => {
  server = new Server().start();
  db = new pg.Client(server.connection);
  await db.connect();
  await db.query('CREATE TABLE effects (job_id bigint NOT NULL, fence bigint NOT NULL)');
  // Ids and fences past 2^53, as a Citus cluster hands them out (node group g's ids start at
  // (g + 1) * 2^48, every node's fences past 2^53), and all odd (2^53 + 1, + 3, ...), which no
  // Number holds: a Number holding one would be another job's id or fence.
  await db.query('ALTER SEQUENCE jobcap.fences INCREMENT BY 2');
  await db.query('ALTER TABLE jobcap.jobs ALTER COLUMN job_id SET INCREMENT BY 2');
  await db.query("SELECT setval('jobcap.fences', 9007199254740993, false)," +
    " setval(pg_get_serial_sequence('jobcap.jobs', 'job_id'), 9007199254740993, false)");
});

after(async () => {
  if (db) await db.end();
  if (server) server.stop();
});

// Each test gets its own queue and collects the outcomes of the workers it starts.
let ctx;
beforeEach(async () => {
  ctx = { queue: `q${++counter}`, workers: [], outcomes: [] };
});
afterEach(async () => {
  await Promise.all(ctx.workers.map((w) => w.stop()));
});

async function queue(options = {}) {
  await jobcap.createQueue(db, ctx.queue,
    { maxAttempts: 5, lease: 30000, backoffBase: 0, backoffMax: 0, ...options });
}

function start(handler, options = {}) {
  const worker = new jobcap.Worker({ connection: server.connection, queue: ctx.queue, handler,
    pollMax: 200, exitOnHang: false, logger: { info() {}, warn() {}, error: console.error },
    ...options });
  worker.on('settled', (job, outcome, error) => ctx.outcomes.push({ id: job.id, outcome, error }));
  worker.run({ handleSignals: false });
  ctx.workers.push(worker);
  return worker;
}

const enqueue = (payload, options) => jobcap.enqueue(db, ctx.queue, payload, options);

// Job ids and fences are bigints, strings of digits here as node-postgres returns them (before()
// starts both past 2^53, where a Number would round them); compare their order as BigInts.
async function job(id) {
  const { rows } = await db.query(
    'SELECT state::text, attempts, fence FROM jobcap.jobs WHERE job_id = $1', [id]);
  return rows[0];
}

// Orders ids given as strings of digits by their value.
const byValue = (a, b) => (BigInt(a) < BigInt(b) ? -1 : BigInt(a) > BigInt(b) ? 1 : 0);

async function effects(id) {
  const { rows } = await db.query(
    'SELECT fence FROM effects WHERE job_id = $1 ORDER BY fence', [id]);
  return rows.map((r) => r.fence);
}

async function expireAndReap(id) {
  await db.query("UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'" +
    ' WHERE job_id = $1', [id]);
  await db.query('SELECT jobcap.reap_jobs()');
}

const writeEffect = (j) => j.query('INSERT INTO effects (job_id, fence) VALUES ($1, $2)', [j.id, j.fence]);

describe('stale fences', () => {
  it('maps SQLSTATE JC001 from every fenced call to StaleFenceError', async () => {
    await queue();
    const id = await enqueue({ n: 1 });
    const old = (await db.query("SELECT fence FROM jobcap.claim_job($1, 'w1')", [ctx.queue])).rows[0].fence;
    await expireAndReap(id);
    const current = (await db.query("SELECT fence FROM jobcap.claim_job($1, 'w2')", [ctx.queue])).rows[0].fence;
    assert.ok(BigInt(current) > BigInt(old));
    for (const call of [() => jobcap.complete(db, id, old), () => jobcap.fail(db, id, old, 'late'),
      () => jobcap.heartbeat(db, id, old), () => jobcap.assertFence(db, id, old)]) {
      await assert.rejects(call, (err) => {
        assert.ok(err instanceof jobcap.StaleFenceError);
        assert.equal(err.code, 'JC001');
        assert.equal(err.jobId, id);
        assert.equal(err.fence, old);
        assert.match(err.detail, /claimed again/);
        assert.equal(err.cause.code, 'JC001');
        return true;
      });
    }
    assert.equal(await jobcap.complete(db, id, current), 'succeeded');
  });

  it('recognises the raw error and leaves other errors alone', async () => {
    await queue();
    const id = await enqueue();
    const raw = await db.query('SELECT jobcap.assert_fence($1, 99)', [id]).catch((e) => e);
    assert.ok(jobcap.isStale(raw));
    assert.ok(jobcap.translate(raw) instanceof jobcap.StaleFenceError);
    const other = await db.query('SELECT jobcap.complete_job(-1, 1)').catch((e) => e);
    assert.equal(jobcap.isStale(other), false);
    assert.equal(jobcap.translate(other), other);
  });
});

describe('settling', () => {
  it('commits the handler\'s writes with the completion', async () => {
    await queue();
    const ids = [];
    for (let n = 0; n < 7; n++) ids.push(await enqueue({ n }));
    start(writeEffect, { concurrency: 3 });
    await waitFor(async () => {
      const { rows } = await db.query("SELECT count(*)::int AS n FROM jobcap.jobs WHERE queue = $1 AND state = 'succeeded'", [ctx.queue]);
      return rows[0].n === ids.length;
    });
    for (const id of ids) assert.deepEqual(await effects(id), [(await job(id)).fence]);
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), Array(7).fill('succeeded'));
  });

  it('fails with the error text and stops at the cap', async () => {
    await queue();
    const id = await enqueue({}, { maxAttempts: 3 });
    start(async (j) => {
      await writeEffect(j);
      throw new TypeError(`corrupt input on attempt ${j.attempt}`);
    });
    await waitFor(async () => (await job(id)).state === 'dead');
    assert.equal((await job(id)).attempts, 3);
    assert.deepEqual(await effects(id), [], 'a failed attempt\'s writes roll back');
    const { rows } = await db.query('SELECT error FROM jobcap.job_errors WHERE job_id = $1 ORDER BY seq', [id]);
    assert.equal(rows.length, 3);
    assert.match(rows[2].error, /^TypeError: corrupt input on attempt 3\n\s+at /);
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), ['retry', 'retry', 'dead']);
  });

  it('rolls back the writes of a handler whose lease was lost', async () => {
    await queue();
    const id = await enqueue();
    start(async (j) => {
      await writeEffect(j);
      if (j.attempt === 1) await expireAndReap(j.id);  // the lease runs out while it works
    });
    await waitFor(async () => (await job(id)).state === 'succeeded');
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), ['stale', 'succeeded']);
    assert.ok(ctx.outcomes[0].error instanceof jobcap.StaleFenceError);
    assert.equal(ctx.outcomes[0].error.operation, 'complete_job');
    assert.deepEqual(await effects(id), [(await job(id)).fence], 'only the current fence\'s write commits');
    assert.ok(BigInt(ctx.outcomes[0].error.fence) < BigInt((await job(id)).fence));
  });

  it('lets a handler assert its fence before it writes', async () => {
    await queue();
    const id = await enqueue();
    const seen = [];
    start(async (j) => {
      if (j.attempt === 1) await expireAndReap(j.id);
      try {
        await j.assertFence();
      } catch (err) {
        seen.push(err instanceof jobcap.StaleFenceError && j.fence);
        throw err;
      }
      await writeEffect(j);
    });
    await waitFor(async () => (await job(id)).state === 'succeeded');
    assert.equal(seen.length, 1);
    assert.ok(BigInt(seen[0]) < BigInt((await job(id)).fence));
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), ['stale', 'succeeded']);
    assert.deepEqual(await effects(id), [(await job(id)).fence]);
  });
});

describe('queue controls', () => {
  const claim = async (q, batch = 10) => (await db.query(
    "SELECT count(*)::int AS n FROM jobcap.claim_job($1, 'w', $2)", [q, batch])).rows[0].n;

  it('pauses and resumes a queue', async () => {
    await queue();
    await enqueue({ n: 1 });
    assert.equal(await jobcap.pauseQueue(db, ctx.queue), true);
    assert.equal(await jobcap.pauseQueue(db, ctx.queue), false);
    await enqueue({ n: 2 });
    assert.equal(await claim(ctx.queue), 0);
    assert.equal(await jobcap.resumeQueue(db, ctx.queue), true);
    assert.equal(await jobcap.resumeQueue(db, ctx.queue), false);
    assert.equal(await claim(ctx.queue), 2);
  });

  it('creates a queue with maxRunning and changes it', async () => {
    await queue({ maxRunning: 2 });
    for (let n = 0; n < 5; n++) await enqueue({ n });
    assert.equal(await claim(ctx.queue, 5), 2);
    assert.equal(await claim(ctx.queue, 5), 0);
    await jobcap.setMaxRunning(db, ctx.queue, 3);
    assert.equal(await claim(ctx.queue, 5), 1);
    await jobcap.setMaxRunning(db, ctx.queue, null);
    assert.equal(await claim(ctx.queue, 5), 2);
  });

  const queueRow = async () => (await db.query(
    'SELECT max_attempts, extract(epoch FROM lease)::int AS lease, max_running, max_snoozes,' +
    ' extract(epoch FROM max_run_time)::int AS max_run_time, rate_limit,' +
    ' extract(epoch FROM rate_period)::int AS rate_period, max_running_per_key, fairness' +
    ' FROM jobcap.queues WHERE queue = $1', [ctx.queue])).rows[0];

  it('creates a queue with every setting and alters only those given', async () => {
    await jobcap.createQueue(db, ctx.queue, { maxAttempts: 4, lease: 60000, maxRunning: 5,
      maxSnoozes: 2, maxRunTime: 90000, rateLimit: 100, ratePeriod: 60000, maxRunningPerKey: 3,
      fairness: 'round_robin' });
    assert.deepEqual(await queueRow(), { max_attempts: 4, lease: 60, max_running: 5, max_snoozes: 2,
      max_run_time: 90, rate_limit: 100, rate_period: 60, max_running_per_key: 3, fairness: 'round_robin' });
    // 0 removes a limit, as in SQL; what is not given is unchanged.
    await jobcap.alterQueue(db, ctx.queue, { maxRunning: 0, rateLimit: 0, fairness: 'fifo', maxSnoozes: 7 });
    assert.deepEqual(await queueRow(), { max_attempts: 4, lease: 60, max_running: null, max_snoozes: 7,
      max_run_time: 90, rate_limit: null, rate_period: 60, max_running_per_key: 3, fairness: 'fifo' });
    await jobcap.alterQueue(db, ctx.queue);
    assert.equal((await queueRow()).max_snoozes, 7);
    await assert.rejects(jobcap.alterQueue(db, ctx.queue, { fairness: 'lottery' }), { code: '22023' });
    await assert.rejects(jobcap.alterQueue(db, ctx.queue, { maxRuning: 1 }), TypeError);
    await assert.rejects(jobcap.createQueue(db, ctx.queue, { rateLimt: 1 }), TypeError);
  });

  it('creates a queue with the server\'s defaults for the settings not given', async () => {
    await jobcap.createQueue(db, ctx.queue);
    const row = await queueRow();
    assert.deepEqual([row.max_running, row.max_snoozes, row.max_run_time, row.rate_limit,
      row.rate_period, row.max_running_per_key, row.fairness], [null, 10, null, null, 1, null, 'fifo']);
  });

  it('cancels a job with cancelJob', async () => {
    await queue();
    const id = await enqueue();
    assert.equal(await jobcap.cancelJob(db, id), true);
    assert.equal((await job(id)).state, 'cancelled');
    assert.equal(await jobcap.cancelJob(db, id), false);
  });

  it('enqueues with a concurrencyKey', async () => {
    await queue();
    await db.query('SELECT jobcap.alter_queue($1, max_running_per_key => 1)', [ctx.queue]);
    for (const concurrencyKey of ['a', 'a', 'b', null]) await enqueue({}, { concurrencyKey });
    const { rows } = await db.query(
      'SELECT concurrency_key AS k FROM jobcap.jobs WHERE queue = $1 ORDER BY job_id', [ctx.queue]);
    assert.deepEqual(rows.map((r) => r.k), ['a', 'a', 'b', null]);
    assert.equal(await claim(ctx.queue, 5), 3);
    assert.equal(await claim(ctx.queue, 5), 0);
  });

  it('enqueues with a dedupeWindow and dedupe replace', async () => {
    await queue();
    const first = await enqueue({ v: 1 }, { dedupeKey: 'd', dedupeWindow: 3600000 });
    assert.equal(await enqueue({ v: 2 }, { dedupeKey: 'd', dedupe: 'replace' }), first);
    const { rows } = await db.query('SELECT payload FROM jobcap.jobs WHERE job_id = $1', [first]);
    assert.deepEqual(rows[0].payload, { v: 2 });
    await db.query('SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job($1, \'w\')',
      [ctx.queue]);
    // Succeeded within the window: the same job; without a window, a new one.
    assert.equal(await enqueue({}, { dedupeKey: 'd', dedupeWindow: 3600000 }), first);
    assert.notEqual(await enqueue({}, { dedupeKey: 'd' }), first);
    await assert.rejects(enqueue({}, { dedupeWindow: 60000 }), { code: '22023' });
  });

  it('keeps the output given to complete and set by the handler', async () => {
    await queue();
    const id = await enqueue();
    const { rows } = await db.query("SELECT fence FROM jobcap.claim_job($1, 'w')", [ctx.queue]);
    assert.equal(await jobcap.complete(db, id, rows[0].fence, { rows: 3 }), 'succeeded');
    const output = async (i) => (await db.query(
      'SELECT output FROM jobcap.jobs WHERE job_id = $1', [i])).rows[0].output;
    assert.deepEqual(await output(id), { rows: 3 });
    const ids = [];
    for (let n = 0; n < 3; n++) ids.push(await enqueue({ n }));
    start((j) => { if (j.payload.n) j.output = { double: j.payload.n * 2 }; });
    await waitFor(async () => (await Promise.all(ids.map(job))).every((r) => r.state === 'succeeded'));
    assert.deepEqual(await Promise.all(ids.map(output)), [null, { double: 2 }, { double: 4 }]);
  });

  it('reads a job through jobResult', async () => {
    await queue();
    const id = await enqueue();
    const claimed = async () => (await db.query(
      "SELECT fence FROM jobcap.claim_job($1, 'w')", [ctx.queue])).rows[0].fence;
    await jobcap.fail(db, id, await claimed(), 'smtp refused');
    assert.deepEqual(await jobcap.jobResult(db, id), {
      state: 'pending', attempts: 1, output: null, error: 'smtp refused', finishedAt: null });
    await db.query('UPDATE jobcap.jobs SET run_at = now() WHERE job_id = $1', [id]);
    await jobcap.complete(db, id, await claimed(), { sent: true });
    const done = await jobcap.jobResult(db, id);
    assert.equal(done.state, 'succeeded');
    assert.equal(done.attempts, 2);
    assert.deepEqual(done.output, { sent: true });
    assert.ok(done.finishedAt instanceof Date);
  });

  it('schedules and unschedules a periodic job', async () => {
    await queue();
    const name = `${ctx.queue}_tick`;
    const next = await jobcap.scheduleJob(db, name, '*/5 * * * *', ctx.queue, { task: 't' });
    assert.ok(next > new Date(Date.now() - 60000));
    assert.equal(next.getUTCMinutes() % 5, 0);
    const { rows } = await db.query('SELECT cron, payload FROM jobcap.schedules WHERE name = $1', [name]);
    assert.deepEqual(rows[0], { cron: '*/5 * * * *', payload: { task: 't' } });
    await assert.rejects(jobcap.scheduleJob(db, name, 'every minute', ctx.queue),
      (err) => err.code === '22023');
    assert.equal(await jobcap.unscheduleJob(db, name), true);
    assert.equal(await jobcap.unscheduleJob(db, name), false);
  });
});

describe('deadlines', () => {
  it('stops a handler at its timeout: signal aborted, statement cancelled, writes rolled back', async () => {
    await queue();
    const id = await enqueue();
    const signals = [];
    const started = Date.now();
    start(async (j) => {
      await writeEffect(j);
      if (j.attempt === 1) {
        signals.push(j.signal);
        await j.query('SELECT pg_sleep(30)');
      }
    }, { lease: 3000, timeout: 500 });
    await waitFor(async () => (await job(id)).state === 'succeeded');
    assert.ok(Date.now() - started < 2500, 'the retry came before the lease ran out');
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), ['retry', 'succeeded']);
    assert.ok(ctx.outcomes[0].error instanceof jobcap.JobTimeoutError);
    assert.ok(signals[0].aborted);
    assert.ok(signals[0].reason instanceof jobcap.JobTimeoutError);
    assert.deepEqual(await effects(id), [(await job(id)).fence]);
    const { rows } = await db.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'");
    assert.equal(rows[0].n, 0, 'the timed-out statement does not linger');
  });

  it('carries long work past the lease with heartbeats', async () => {
    await queue();
    const id = await enqueue();
    start(async (j) => {
      for (let i = 0; i < 6; i++) {
        await sleep(300);
        await j.heartbeat();
      }
      await writeEffect(j);
    }, { lease: 1000, timeout: 600 });
    const reaped = [];
    while ((await job(id)).state !== 'succeeded') {
      reaped.push(...(await db.query('SELECT job_id FROM jobcap.reap_jobs()')).rows);
      await sleep(50);
    }
    assert.deepEqual(reaped, []);
    assert.equal((await job(id)).attempts, 1);
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), ['succeeded']);
  });

  it('wants a timeout shorter than the lease', () => {
    const make = (o) => new jobcap.Worker({ connection: {}, queue: 'q', handler() {}, ...o });
    assert.throws(() => make({ lease: 1000, timeout: 1000 }), RangeError);
    assert.throws(() => make({ lease: 1000, timeout: 0 }), RangeError);
    assert.equal(make({ lease: 1000 }).timeout, 800);
  });
});

describe('wake-ups', () => {
  it('wakes an idle worker on NOTIFY', async () => {
    await queue({ notify: true });
    start(() => {}, { pollMin: 30000, pollMax: 30000 });
    await sleep(500);
    const started = Date.now();
    const id = await enqueue();
    await waitFor(async () => (await job(id)).state === 'succeeded', 5000);
    assert.ok(Date.now() - started < 2000);
  });

  it('polls within one interval when notify is off', async () => {
    await queue();
    start(() => {}, { pollMin: 50, pollMax: 400 });
    await sleep(1500);
    const started = Date.now();
    const id = await enqueue();
    await waitFor(async () => (await job(id)).state === 'succeeded', 5000);
    assert.ok(Date.now() - started < 900);
  });

  it('reconnects after losing its connections', async () => {
    await queue();
    start(() => {}, { pollMax: 100 });
    const first = await enqueue();
    await waitFor(async () => (await job(first)).state === 'succeeded');
    const { rows } = await db.query("SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity" +
      " WHERE application_name LIKE 'jobcap %'");
    assert.ok(rows[0].n >= 1);
    const second = await enqueue();
    await waitFor(async () => (await job(second)).state === 'succeeded');
  });
});

describe('connection loss mid-job', () => {
  it('survives its job connection dying between statements', async () => {
    await queue({ lease: 1000 });
    const id = await enqueue();
    let pid = null;
    start(async (j) => {
      if (j.attempt === 1) {
        pid = (await j.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
        await sleep(400);  // the connection dies meanwhile: no statement is running on it
      }
      await writeEffect(j);
    }, { lease: 1000, timeout: 800 });
    await waitFor(() => pid !== null);
    await db.query('SELECT pg_terminate_backend($1)', [pid]);
    await sleep(1200);  // the lease runs out; the reaper takes it back
    await db.query('SELECT jobcap.reap_jobs()');
    await waitFor(async () => (await job(id)).state === 'succeeded');
    assert.deepEqual(ctx.outcomes.map((o) => o.outcome), ['succeeded']);
    assert.equal((await job(id)).attempts, 2);
    assert.deepEqual(await effects(id), [(await job(id)).fence]);
  });
});

describe('processes', () => {
  const children = [];
  afterEach(() => {
    for (const child of children.splice(0)) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  function spawnWorker(mode, env = {}) {
    const child = spawn(process.execPath, [path.join(__dirname, '..', 'test-support', 'worker_script.js'),
      JSON.stringify(server.connection), ctx.queue, mode], { env: { ...process.env, ...env } });
    child.output = '';
    child.stdout.on('data', (d) => { child.output += d; });
    child.stderr.on('data', (d) => { child.output += d; });
    child.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    children.push(child);  // a failed test leaves no worker behind
    return child;
  }

  it('finishes the job in flight on SIGTERM and claims no more', async () => {
    await queue();
    const first = await enqueue();
    const second = await enqueue();
    const child = spawnWorker('slow');
    await waitFor(() => child.output.includes(`started ${first}`));
    child.kill('SIGTERM');
    const { code } = await child.exited;
    assert.equal(code, 0, child.output);
    assert.match(child.output, /exited cleanly/);
    assert.deepEqual({ ...(await job(first)), fence: undefined }, { state: 'succeeded', attempts: 1, fence: undefined });
    assert.deepEqual({ ...(await job(second)), fence: undefined }, { state: 'pending', attempts: 0, fence: undefined });
  });

  // A long handler stopped within 2 s of cancel_job from another session; the job ends
  // cancelled, its one attempt not retried, its write rolled back; the worker goes on.
  async function cancelStopsTheHandler(env) {
    await queue();
    const isolated = env.ISOLATED === '1';
    const long = await enqueue(isolated ? { do: 'cancel' } : {});
    // The notification's job_id and fence are read from its text: JSON.parse would round these.
    assert.notEqual(String(Number(long)), long, `job id ${long} is one a Number cannot hold`);
    const child = spawnWorker('cancel', { LEASE: 30000, TIMEOUT: 20000, ...env });
    await waitFor(() => child.output.includes(`started ${long}`));
    const sent = Date.now();
    const { rows } = await db.query('SELECT jobcap.cancel_job($1) AS ok', [long]);
    assert.equal(rows[0].ok, true);
    await waitFor(() => child.output.includes(`settled ${long} `), 5000);
    const took = Date.now() - sent;
    assert.match(child.output, new RegExp(`settled ${long} cancelled`), child.output);
    assert.ok(took < 2000, `the handler was stopped ${took} ms after cancel_job`);
    const quick = await enqueue(isolated ? { do: 'cancel', quick: true } : { quick: true });
    await waitFor(() => child.output.includes(`settled ${quick} `), 5000);
    assert.match(child.output, new RegExp(`settled ${quick} succeeded`), child.output);
    child.kill('SIGTERM');
    const { code } = await child.exited;
    assert.equal(code, 0, child.output);
    assert.deepEqual({ ...(await job(long)), fence: undefined }, { state: 'cancelled', attempts: 1, fence: undefined });
    assert.deepEqual(await effects(long), []);
    const kinds = (await db.query('SELECT kind FROM jobcap.job_errors WHERE job_id = $1 ORDER BY seq',
      [long])).rows.map((r) => r.kind);
    assert.deepEqual(kinds, ['cancelled']);
    return took;
  }

  it('aborts a running handler when its job is cancelled, and goes on', () => cancelStopsTheHandler({}));
  it('stops an isolated handler when its job is cancelled, and goes on',
    () => cancelStopsTheHandler({ ISOLATED: '1' }));
  it('without LISTEN finds a cancellation by polling', () =>
    cancelStopsTheHandler({ LISTEN: '0', CANCEL_POLL: '300' }));
  it('without LISTEN, isolated, finds a cancellation by polling', () =>
    cancelStopsTheHandler({ LISTEN: '0', CANCEL_POLL: '300', ISOLATED: '1' }));

  it('kills a process whose event loop is blocked, before the lease runs out', async () => {
    await queue();
    const id = await enqueue();
    const child = spawnWorker('block', { LEASE: 3000, TIMEOUT: 1000 });
    const { signal } = await child.exited;
    assert.equal(signal, 'SIGKILL', child.output);
    assert.match(child.output, /event loop is blocked/);
    const { rows } = await db.query('SELECT state::text, attempts, lease_expires_at > now() AS live' +
      ' FROM jobcap.jobs WHERE job_id = $1', [id]);
    assert.deepEqual(rows[0], { state: 'running', attempts: 1, live: true });
  });
});

describe('isolation', () => {
  const handlers = path.join(__dirname, '..', 'test-support', 'handlers.js');
  async function history(id) {
    const { rows } = await db.query('SELECT kind, attempt, error FROM jobcap.job_errors' +
      ' WHERE job_id = $1 ORDER BY seq', [id]);
    return rows;
  }
  const running = async () => Number((await db.query("SELECT count(*) FROM jobcap.jobs WHERE queue = $1" +
    " AND state = 'running'", [ctx.queue])).rows[0].count);

  it('lets a poison job that SIGKILLs its process die alone at its cap, batch after batch', async () => {
    await queue({ maxAttempts: 3 });
    const poison = [];
    const innocent = [];
    for (let b = 0; b < 3; b++) {  // batches of 5, one poison job in each, in a different place
      for (let n = 0; n < 5; n++) {
        const id = await enqueue({ do: n === b * 2 ? 'kill' : 'ok' });
        (n === b * 2 ? poison : innocent).push(id);
      }
    }
    start(handlers, { prefetch: 4 });  // holds up to 5: the batch
    await waitFor(async () => {
      for (const id of [...poison, ...innocent]) {
        if (!['succeeded', 'dead'].includes((await job(id)).state)) return false;
      }
      return ctx.outcomes.filter((o) => o.error instanceof jobcap.HandlerCrashedError).length === 9;
    }, 30000);
    for (const id of poison) {
      assert.deepEqual({ ...(await job(id)), fence: undefined }, { state: 'dead', attempts: 3, fence: undefined });
      assert.deepEqual(await history(id), [1, 2, 3].map((attempt) =>
        ({ kind: 'crashed', attempt, error: 'killed by signal 9 (SIGKILL)' })));
      assert.deepEqual(await effects(id), []);
    }
    for (const id of innocent) {
      const row = await job(id);
      assert.deepEqual([row.state, row.attempts], ['succeeded', 1], `job ${id}`);
      assert.deepEqual(await history(id), []);
      assert.deepEqual(await effects(id), [row.fence]);
    }
    const { rows } = await db.query('SELECT count(*)::int AS n, sum(crashes)::int AS crashes,' +
      ' sum(errors)::int AS errors FROM jobcap.dead_jobs WHERE queue = $1', [ctx.queue]);
    assert.deepEqual(rows[0], { n: 3, crashes: 9, errors: 0 });
  });

  it('records an abort as a crash and a thrown error as an error', async () => {
    await queue({ maxAttempts: 1 });
    const aborted = await enqueue({ do: 'abort' });
    const thrown = await enqueue({ do: 'throw' });
    start(handlers);
    await waitFor(async () => (await job(aborted)).state === 'dead' && (await job(thrown)).state === 'dead');
    assert.deepEqual(await history(aborted), [{ kind: 'crashed', attempt: 1, error: 'killed by signal 6 (SIGABRT)' }]);
    const [row] = await history(thrown);
    assert.equal(row.kind, 'error');
    assert.match(row.error, /^RangeError: bad input in job/);
  });

  it('kills a handler at its deadline, inside the lease, and fails the attempt', async () => {
    await queue({ maxAttempts: 1, lease: 3000 });
    const id = await enqueue({ do: 'hang' });
    const started = Date.now();
    start(handlers, { lease: 3000, timeout: 500 });
    await waitFor(async () => (await job(id)).state === 'dead');
    assert.ok(Date.now() - started < 3000, 'ended before the lease ran out');
    const [row] = await history(id);
    assert.equal(row.kind, 'error');
    assert.match(row.error, /JobTimeoutError.*killed/);
  });

  it('carries heartbeats from the child to the lease', async () => {
    await queue();
    const id = await enqueue({ do: 'beat' });
    start(handlers, { lease: 2000, timeout: 1200 });
    const reaped = [];
    while ((await job(id)).state !== 'succeeded') {
      reaped.push(...(await db.query('SELECT job_id FROM jobcap.reap_jobs() WHERE queue = $1', [ctx.queue])).rows);
      await sleep(50);
    }
    assert.deepEqual(reaped, []);
    assert.equal((await job(id)).attempts, 1);
  });

  it('holds no more than concurrency + prefetch jobs', async () => {
    await queue();
    const ids = [];
    for (let i = 0; i < 8; i++) ids.push(await enqueue({ ms: 200 }));
    start(handlers, { concurrency: 2, prefetch: 1 });
    let most = 0;
    for (;;) {
      most = Math.max(most, await running());
      let done = true;
      for (const id of ids) if ((await job(id)).state !== 'succeeded') done = false;
      if (done) break;
      await sleep(20);
    }
    assert.ok(most <= 3, `held ${most}`);
    assert.ok(most >= 2, 'two ran at once');
    for (const id of ids) assert.equal((await job(id)).attempts, 1);
  });
});

describe('settling in batches', () => {
  async function finishedAt(ids) {
    const { rows } = await db.query('SELECT count(DISTINCT finished_at)::int AS n FROM jobcap.jobs' +
      ' WHERE job_id = ANY($1)', [ids]);
    return rows[0].n;
  }
  // A handler that returns only once `n` jobs have arrived, so that they finish together.
  function gathering(n, before = async () => {}) {
    let arrived = 0;
    let open;
    const gate = new Promise((resolve) => { open = resolve; });
    return async (job) => {
      await before(job);
      if (++arrived === n) open();
      await gate;
    };
  }

  it('completes jobs that never used their connection in one statement, outputs kept', async () => {
    await queue();
    const ids = [];
    for (let n = 0; n < 5; n++) ids.push(await enqueue({ n }));
    const settle = gathering(5);
    start(async (job) => {
      await settle(job);
      if (job.payload.n % 2) job.output = { n: job.payload.n };
    }, { concurrency: 5 });
    await waitFor(() => ctx.outcomes.length === 5);
    for (const id of ids) assert.deepEqual([(await job(id)).state, (await job(id)).attempts], ['succeeded', 1]);
    // complete_jobs stamps its whole batch with one finished_at; separate completions differ.
    assert.equal(await finishedAt(ids), 1);
    const { rows } = await db.query('SELECT output FROM jobcap.jobs WHERE job_id = ANY($1) ORDER BY job_id', [ids]);
    assert.deepEqual(rows.map((r) => r.output), [null, { n: 1 }, null, { n: 3 }, null]);
  });

  it('lets one stale fence in a batch cost only its job', async () => {
    await queue();
    const ids = [];
    for (let n = 0; n < 5; n++) ids.push(await enqueue({ n }));
    const staleId = ids[2];
    const told = [];
    const settle = gathering(5, async (job) => {
      if (job.id === staleId && job.attempt === 1) await expireAndReap(job.id);
    });
    start(settle, { concurrency: 5, logger: { info: (m) => told.push(m), warn() {}, error: console.error } });
    await waitFor(async () => (await job(staleId)).state === 'succeeded' && ctx.outcomes.length === 6);
    // The batch was tried and refused as a whole (complete_jobs is all or nothing) ...
    assert.ok(told.some((m) => /completing 5 jobs together failed/.test(m)), told.join('\n'));
    // ... then each job was completed on its own: the stale one alone lost its attempt.
    for (const id of ids) {
      const row = await job(id);
      assert.deepEqual([row.state, row.attempts], ['succeeded', id === staleId ? 2 : 1], `job ${id}`);
    }
    const stale = ctx.outcomes.filter((o) => o.outcome === 'stale');
    assert.deepEqual(stale.map((o) => o.id), [staleId]);
    assert.ok(stale[0].error instanceof jobcap.StaleFenceError);
    assert.equal(stale[0].error.operation, 'complete_job');
    assert.deepEqual(ctx.outcomes.filter((o) => o.outcome === 'succeeded').map((o) => o.id).sort(byValue), ids);
  });

  it('once complete_jobs is refused (0A000, as on a Citus cluster), completes each job alone without trying it again', async () => {
    await queue();
    // Citus refuses a call it cannot route to one shard with 0A000; the stand-in refuses the
    // same way and counts its calls in a sequence (not rolled back with the refused call).
    await db.query('CREATE SEQUENCE refused_calls');
    await db.query('ALTER FUNCTION jobcap.complete_jobs(bigint[], bigint[], jsonb[]) RENAME TO complete_jobs_kept');
    try {
      await db.query(`CREATE FUNCTION jobcap.complete_jobs(job_ids bigint[], fences bigint[], outputs jsonb[] DEFAULT NULL)
        RETURNS integer LANGUAGE plpgsql AS $$ BEGIN PERFORM nextval('public.refused_calls');
        RAISE EXCEPTION 'complete_jobs is not routable' USING ERRCODE = 'feature_not_supported'; END $$`);
      const ids = [];
      for (let n = 0; n < 15; n++) ids.push(await enqueue({ n }));
      const rounds = [gathering(5), gathering(5), gathering(5)];
      const told = [];
      start((job) => rounds[Math.floor(job.payload.n / 5)](job),
        { concurrency: 5, prefetch: 0, logger: { info: (m) => told.push(m), warn() {}, error: console.error } });
      await waitFor(() => ctx.outcomes.length === 15);
      for (const id of ids) assert.deepEqual([(await job(id)).state, (await job(id)).attempts], ['succeeded', 1]);
      assert.deepEqual(ctx.outcomes.map((o) => o.outcome), Array(15).fill('succeeded'));
      // Three batches of five finished together; complete_jobs was tried for the first only.
      const { rows } = await db.query('SELECT last_value, is_called FROM refused_calls');
      assert.deepEqual([rows[0].last_value, rows[0].is_called], ['1', true]);
      assert.equal(told.filter((m) => /complete_jobs is refused here/.test(m)).length, 1, told.join('\n'));
    } finally {
      await db.query('DROP FUNCTION IF EXISTS jobcap.complete_jobs(bigint[], bigint[], jsonb[])');
      await db.query('ALTER FUNCTION jobcap.complete_jobs_kept(bigint[], bigint[], jsonb[]) RENAME TO complete_jobs');
      await db.query('DROP SEQUENCE refused_calls');
    }
  });

  it('has completeJobs all or nothing, and completeAndClaim', async () => {
    await queue();
    const ids = [];
    for (let n = 0; n < 3; n++) ids.push(await enqueue({ n }));
    const { rows } = await db.query("SELECT job_id, fence FROM jobcap.claim_job($1, 'w', 3)", [ctx.queue]);
    const fence = Object.fromEntries(rows.map((r) => [r.job_id, r.fence]));
    await expireAndReap(ids[1]);
    await assert.rejects(jobcap.completeJobs(db, ids, ids.map((id) => fence[id])), jobcap.StaleFenceError);
    assert.deepEqual(await Promise.all(ids.map(async (id) => (await job(id)).state)), ['running', 'pending', 'running']);
    assert.equal(await jobcap.completeJobs(db, [ids[0], ids[2]], [fence[ids[0]], fence[ids[2]]], [{ ok: true }, null]), 2);
    const { rows: out } = await db.query('SELECT output FROM jobcap.jobs WHERE job_id = $1', [ids[0]]);
    assert.deepEqual(out[0].output, { ok: true });
    const [next] = (await db.query("SELECT job_id, fence FROM jobcap.claim_job($1, 'w')", [ctx.queue])).rows;
    assert.equal(next.job_id, ids[1]);
    const claimed = await jobcap.completeAndClaim(db, ids[1], next.fence, ctx.queue, 'w', { output: [1] });
    assert.deepEqual(claimed, []);  // nothing left to claim
    assert.equal((await job(ids[1])).state, 'succeeded');
    await assert.rejects(jobcap.completeAndClaim(db, ids[1], next.fence, ctx.queue, 'w'), jobcap.StaleFenceError);
  });

  it('runs isolated jobs in long-lived children, replaces a killed one, batches the light ones', async () => {
    await queue({ maxAttempts: 1 });
    const handlers = path.join(__dirname, '..', 'test-support', 'handlers.js');
    const before = [];
    const after = [];
    for (let n = 0; n < 8; n++) before.push(await enqueue({ do: n % 2 ? 'light' : 'ok' }));
    const killer = await enqueue({ do: 'kill' });
    for (let n = 0; n < 8; n++) after.push(await enqueue({ do: n % 2 ? 'light' : 'ok' }));
    start(handlers, { concurrency: 2, prefetch: 2 });
    await waitFor(() => ctx.outcomes.length === 17, 30000);
    assert.deepEqual({ ...(await job(killer)), fence: undefined }, { state: 'dead', attempts: 1, fence: undefined });
    const { rows: crashes } = await db.query('SELECT kind, error FROM jobcap.job_errors WHERE job_id = $1', [killer]);
    assert.deepEqual(crashes, [{ kind: 'crashed', error: 'killed by signal 9 (SIGKILL)' }]);
    for (const id of [...before, ...after]) {
      const row = await job(id);
      assert.deepEqual([row.state, row.attempts], ['succeeded', 1], `job ${id}`);
    }
    const { rows } = await db.query("SELECT output->>'pid' AS pid FROM jobcap.jobs WHERE job_id = ANY($1)" +
      ' AND output IS NOT NULL', [[...before, ...after]]);
    const pids = new Set(rows.map((r) => Number(r.pid)));
    assert.equal(rows.length, 8);
    assert.ok(!pids.has(process.pid), 'the handlers ran in child processes');
    assert.ok(pids.size <= 3, `two children and one replacement, reused job to job: ${[...pids]}`);
  });
});

describe('isolated processes', () => {
  it('on SIGTERM during a batch finishes the started job and releases the others', async () => {
    await queue();
    const ids = [];
    ids.push(await enqueue({ started: true, ms: 1000 }));
    for (let i = 0; i < 4; i++) ids.push(await enqueue({ ms: 1000 }));
    const child = spawn(process.execPath, [path.join(__dirname, '..', 'test-support', 'worker_script.js'),
      JSON.stringify(server.connection), ctx.queue, 'isolated'], { env: { ...process.env, PREFETCH: '4' } });
    child.output = '';
    child.stdout.on('data', (d) => { child.output += d; });
    child.stderr.on('data', (d) => { child.output += d; });
    const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    try {
      await waitFor(() => child.output.includes(`started ${ids[0]}`));
      const { rows } = await db.query("SELECT count(*)::int AS n FROM jobcap.jobs WHERE queue = $1" +
        " AND state = 'running'", [ctx.queue]);
      assert.equal(rows[0].n, 5, 'the batch was held');
      child.kill('SIGTERM');
      const { code } = await exited;
      assert.equal(code, 0, child.output);
      assert.match(child.output, /exited cleanly/);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
    assert.deepEqual({ ...(await job(ids[0])), fence: undefined }, { state: 'succeeded', attempts: 1, fence: undefined });
    for (const id of ids.slice(1)) {
      assert.deepEqual({ ...(await job(id)), fence: undefined }, { state: 'pending', attempts: 0, fence: undefined });
    }
  });
});
