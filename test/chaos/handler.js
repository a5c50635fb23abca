'use strict';
// The chaos kinds, as a handler module: worker.js runs it isolated, in child processes of the
// jobcap Node client. CHAOS_CONNECTION and CHAOS_NAME come from worker.js through the
// environment. Same kinds, effects and events as worker.py.
const path = require('node:path');
const jobcap = require(path.join(__dirname, '..', '..', 'clients', 'node', 'lib'));

const connection = JSON.parse(process.env.CHAOS_CONNECTION);
const name = process.env.CHAOS_NAME;
const timeout = Number(process.env.CHAOS_TIMEOUT || 2) * 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One autocommit connection for events and the hanger's moves outside its job; statements on it
// go one at a time.
let side = null;
let sideTail = Promise.resolve();
function onSide(fn) {
  const run = sideTail.then(async () => {
    if (!side) {
      const client = new jobcap.Client({ ...connection, application_name: `chaos side ${name}` });
      client.on('error', () => { if (side === client) side = null; });
      await client.connect();
      side = client;
    }
    return fn(side);
  });
  sideTail = run.catch(() => {});
  return run;
}

async function event(job, what) {
  await onSide((c) => c.query('INSERT INTO events (worker, job_id, fence, event) VALUES ($1, $2, $3, $4)',
    [name, job.id, job.fence, what])).catch(() => {});
}

const effect = (db, job) => db.query('INSERT INTO effects (job_id, fence, worker) VALUES ($1, $2, $3)',
  [job.id, job.fence, name]);

async function hang(job) {
  await onSide((c) => c.query("UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'" +
    " WHERE job_id = $1 AND fence = $2 AND state = 'running'", [job.id, job.fence]));
  const end = Date.now() + timeout * 0.7;
  let reaped = false;
  while (Date.now() < end && !reaped) {
    const { rows } = await onSide((c) => c.query(
      "SELECT state = 'running' AND fence = $1 AS mine FROM jobcap.jobs WHERE job_id = $2", [job.fence, job.id]));
    reaped = !rows[0].mine;
    if (!reaped) await sleep(50);
  }
  if (!reaped) return event(job, 'hanger_not_reaped');
  await event(job, 'hanger_reaped');
  // An effect under the stale fence, guarded by assert_fence in its own transaction: rejected.
  const outcome = await onSide(async (c) => {
    await c.query('BEGIN');
    try {
      await effect(c, job);
      await jobcap.assertFence(c, job.id, job.fence);
      await c.query('COMMIT');
      return 'stale_effect_accepted';
    } catch (err) {
      await c.query('ROLLBACK');
      if (err instanceof jobcap.StaleFenceError) return 'stale_effect_rejected';
      throw err;
    }
  });
  await event(job, outcome);
}

// The failover run (test/failover) keeps a ledger outside the database: every claim a handler
// was given and every settlement the worker was told committed, one line each (O_APPEND).
function ledger(what, job) {
  if (process.env.CHAOS_LEDGER) {
    require('node:fs').appendFileSync(process.env.CHAOS_LEDGER, `${what} ${job.id} ${job.fence} ${name}\n`);
  }
}

async function handle(job) {
  ledger('claim', job);
  const { kind } = job.payload;
  if (kind === 'killer') {
    await effect(job.client, job);  // uncommitted: it must vanish with the process
    process.kill(process.pid, 'SIGKILL');
  }
  if (kind === 'poison') throw new Error(`poison job ${job.id} cannot be processed`);
  if (kind === 'flaky' && job.attempt <= job.payload.fail_times) {
    throw new Error(`flaky job ${job.id} failed on attempt ${job.attempt}`);
  }
  if (kind === 'hanger' && job.attempt <= job.payload.hang_attempts) await hang(job);
  await sleep(job.payload.work_ms || 0);
  await effect(job.client, job);
}

module.exports = { handler: handle, event, ledger, sideTail: () => sideTail, closeSide: async () => { await sideTail; if (side) await side.end().catch(() => {}); } };
