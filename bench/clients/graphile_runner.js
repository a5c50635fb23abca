'use strict';
// graphile-worker's runner with a trivial task, for bench/clients/run. graphile-worker is not
// part of jobcap: bench/clients/run installs it from the npm registry into a directory outside
// the repository and passes that directory here.
// usage: node graphile_runner.js GRAPHILE_DIR CONNECTION_STRING CONCURRENCY [batched]
//   batched: its batching options on (a local queue of CONCURRENCY + 1 jobs, completions
//   batched with a delay of 0 ms), as its performance documentation suggests.
const path = require('node:path');

const [dir, connectionString, concurrency, mode] = process.argv.slice(2);
const { run } = require(path.join(dir, 'node_modules', 'graphile-worker'));

(async () => {
  const worker = mode === 'batched'
    ? { localQueue: { size: Number(concurrency) + 1 }, completeJobBatchDelay: 0 } : {};
  const runner = await run({
    connectionString, concurrency: Number(concurrency), noHandleSignals: true, pollInterval: 1000,
    preset: { worker }, taskList: { noop: async () => {} },
  });
  const stop = () => runner.stop();
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  await runner.promise;
})().catch((err) => { console.error(err); process.exit(1); });
