'use strict';
// A chaos worker in Node: the jobcap Node client, isolated, running the chaos kinds of
// handler.js in its child processes.
// usage: node worker.js CONNECTION_JSON NAME  (CHAOS_LEASE, CHAOS_TIMEOUT in seconds,
// CHAOS_CONCURRENCY). Same kinds, effects and events as worker.py.
const path = require('node:path');

process.env.CHAOS_CONNECTION = process.argv[2];  // for handler.js, here and in the children
process.env.CHAOS_NAME = process.argv[3];
const jobcap = require(path.join(__dirname, '..', '..', 'clients', 'node', 'lib'));
const { event, ledger, closeSide } = require('./handler');

const connection = JSON.parse(process.argv[2]);
const name = process.argv[3];
const lease = Number(process.env.CHAOS_LEASE || 3) * 1000;
const timeout = Number(process.env.CHAOS_TIMEOUT || 2) * 1000;
const concurrency = Number(process.env.CHAOS_CONCURRENCY || 4);
process.on('uncaughtException', (err) => {
  console.log(`worker ${name}: uncaught ${err.stack}`);
  process.exit(1);
});

const worker = new jobcap.Worker({
  connection, queue: 'chaos', name, concurrency, lease, timeout, pollMin: 50, pollMax: 1000,
  handler: path.join(__dirname, 'handler.js'),
  logger: { info() {}, warn: (m) => console.log(m), error: (m) => console.log(m) },
});
worker.on('settled', (job, outcome, error) => {
  if (outcome === 'succeeded' || outcome === 'dead') ledger(outcome, job);
  if (outcome === 'stale') event(job, `stale:${(error && error.operation) || 'handler'}`);
});
worker.run().then(closeSide);
