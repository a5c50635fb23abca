'use strict';
// A worker process for the tests that need real signals.
// usage: node worker_script.js CONNECTION_JSON QUEUE MODE
//   slow      each job writes an effect, then waits 1 s (SIGTERM must let it finish)
//   block     each job blocks the event loop for good (the watchdog must kill the process)
//   isolated  handlers from test-support/handlers.js in child processes (PREFETCH: jobs held
//             beyond the running one)
//   cancel    each job writes an effect, prints "started ID" and waits 30 s (until its signal
//             aborts) unless its payload is {"quick": true}; every outcome is printed as
//             "settled ID OUTCOME"; ISOLATED=1 runs it in a child process (handlers.js, do:
//             'cancel', which ignores its signal); LISTEN=0: no LISTEN, cancellations found by
//             polling every CANCEL_POLL ms
const path = require('node:path');
const { setTimeout: wait } = require('node:timers/promises');
const { Worker } = require('../lib');

const [connection, queue, mode] = [JSON.parse(process.argv[2]), process.argv[3], process.argv[4]];
const listen = { 0: false, 1: true }[process.env.LISTEN];
const isolated = mode === 'isolated' || (mode === 'cancel' && process.env.ISOLATED === '1');
const worker = new Worker({
  connection, queue, pollMax: 200, prefetch: Number(process.env.PREFETCH || 0), listen,
  cancelPoll: Number(process.env.CANCEL_POLL || 1000),
  lease: Number(process.env.LEASE || 5000), timeout: Number(process.env.TIMEOUT || 3000),
  logger: { info: (m) => console.log(m), warn: (m) => console.log(m), error: (m) => console.log(m) },
  handler: isolated ? path.join(__dirname, 'handlers.js') : async (job) => {
    await job.query('INSERT INTO effects (job_id, fence) VALUES ($1, $2)', [job.id, job.fence]);
    if (mode === 'cancel') {
      console.log(`started ${job.id}`);
      // As a handler should: its wait rejects when job.signal aborts (the rejection is ignored).
      if (!(job.payload && job.payload.quick)) await wait(30000, null, { signal: job.signal });
    } else if (mode === 'slow') {
      console.log(`started ${job.id}`);
      await new Promise((resolve) => setTimeout(resolve, 1000));
    } else if (mode === 'block') {
      for (;;) { /* a synchronous hang */ }
    }
  },
});
if (mode === 'cancel') worker.on('settled', (job, outcome) => console.log(`settled ${job.id} ${outcome}`));
worker.run().then(() => console.log('exited cleanly'));
