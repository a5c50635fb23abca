'use strict';
// A jobcap Node worker with a trivial handler, for bench/clients/run.
// usage: node node_worker.js CONNECTION_JSON QUEUE MODE [option=value ...]
//   MODE inprocess (a function handler) or isolated (a module handler: child processes);
//   options are the Worker's (concurrency, prefetch), integers. SIGTERM stops it.
const path = require('node:path');
const { Worker } = require(path.join(__dirname, '..', '..', 'clients', 'node', 'lib'));

const [connection, queue, mode] = [JSON.parse(process.argv[2]), process.argv[3], process.argv[4]];
const options = Object.fromEntries(process.argv.slice(5).map((a) => {
  const [k, v] = a.split('=');
  return [k, Number(v)];
}));
const handler = mode === 'isolated' ? path.join(__dirname, 'node_handler.js') : async () => {};
const worker = new Worker({ connection, queue, handler, lease: 300000, pollMax: 1000, ...options });
worker.run().catch((err) => { console.error(err); process.exit(1); });
