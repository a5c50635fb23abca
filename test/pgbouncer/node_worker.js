'use strict';
// The Node client's worker through the pooler: node node_worker.js CONNINFO QUEUE listen|default
// CLIENT_DIR (in-process, two jobs at once). Each job writes its effect in the job's transaction;
// a job with "hang" in its payload hangs on its first attempt (the matrix SIGKILLs the worker then).
const jobcap = require(process.argv[5]);

const [connectionString, queue, listenArg] = process.argv.slice(2);
const worker = new jobcap.Worker({
  connection: connectionString, queue, concurrency: 2, lease: 4000, pollMin: 50, pollMax: 1000,
  listen: listenArg === 'listen' ? true : undefined,
  logger: { info: (m) => console.log(m), warn: (m) => console.log(m), error: (m) => console.log(m) },
  handler: async (job) => {
    if (job.payload.hang && job.attempt === 1) await new Promise((r) => setTimeout(r, 600000));
    await job.query("INSERT INTO effects (client, n, job_id, fence) VALUES ('node', $1, $2, $3)",
      [job.payload.n, job.id, job.fence]);
  },
});
worker.on('settled', (job, outcome) => {
  if (outcome === 'cancelled') console.log(`job ${job.id} cancelled: handler stopped`);
});
worker.run().then(() => process.exit(0), (err) => {
  if (jobcap.PoolModeError && err instanceof jobcap.PoolModeError) {
    console.log(`refused: ${err.message}`);
    process.exit(3);
  }
  console.log(`worker failed: ${err.stack}`);
  process.exit(1);
});
