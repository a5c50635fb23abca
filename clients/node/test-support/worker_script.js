'use strict';
// A worker process for the tests that need real signals.
// usage: node worker_script.js CONNECTION_JSON QUEUE MODE
//   slow      each job writes an effect, then waits 1 s (SIGTERM must let it finish)
//   block     each job blocks the event loop for good (the watchdog must kill the process)
//   isolated  handlers from test-support/handlers.js in child processes (PREFETCH: jobs held
//             beyond the running one)
const path = require('node:path');
const { Worker } = require('../lib');

const [connection, queue, mode] = [JSON.parse(process.argv[2]), process.argv[3], process.argv[4]];
const worker = new Worker({
  connection, queue, pollMax: 200, prefetch: Number(process.env.PREFETCH || 0),
  lease: Number(process.env.LEASE || 5000), timeout: Number(process.env.TIMEOUT || 3000),
  logger: { info: (m) => console.log(m), warn: (m) => console.log(m), error: (m) => console.log(m) },
  handler: mode === 'isolated' ? path.join(__dirname, 'handlers.js') : async (job) => {
    await job.query('INSERT INTO effects (job_id, fence) VALUES ($1, $2)', [job.id, job.fence]);
    if (mode === 'slow') {
      console.log(`started ${job.id}`);
      await new Promise((resolve) => setTimeout(resolve, 1000));
    } else if (mode === 'block') {
      for (;;) { /* a synchronous hang */ }
    }
  },
});
worker.run().then(() => console.log('exited cleanly'));
