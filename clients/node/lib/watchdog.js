'use strict';
// The last resort of the hard timeout: a thread that kills the process when the event loop is
// blocked past a job's deadline (a handler in a synchronous loop can be stopped no other
// way). It acts only when both hold: the earliest deadline plus the grace has passed, and the
// main thread has not ticked for the grace. The process then dies before its lease runs out,
// and the reaper counts the attempt as for any crash.
const { Worker: Thread } = require('node:worker_threads');

const THREAD = `
const { workerData } = require('node:worker_threads');
const fs = require('node:fs');
const shared = new BigInt64Array(workerData.buffer);
const grace = workerData.grace;
let last = Date.now();
let resumed = last;
setInterval(() => {
  const now = Date.now();
  if (now - last > 1000) resumed = now;  // this process was frozen (SIGSTOP): grace anew
  last = now;
  const deadline = Number(Atomics.load(shared, 0));
  const tick = Number(Atomics.load(shared, 1));
  if (deadline > 0 && now > Math.max(deadline, resumed) + grace && now - tick > grace) {
    fs.writeSync(2, 'jobcap worker ' + workerData.name + ': the event loop is blocked past a ' +
      'job deadline; killing the process before its lease runs out\\n');
    process.kill(process.pid, 'SIGKILL');
  }
}, Math.max(20, Math.min(250, grace / 4)));
`;

class Watchdog {
  constructor(graceMs, name) {
    this._shared = new BigInt64Array(new SharedArrayBuffer(16));
    this._thread = new Thread(THREAD, { eval: true,
      workerData: { buffer: this._shared.buffer, grace: graceMs, name } });
    this._thread.unref();
    this._tick = setInterval(() => Atomics.store(this._shared, 1, BigInt(Date.now())),
      Math.max(20, Math.min(250, graceMs / 4)));
    this._tick.unref();
    Atomics.store(this._shared, 1, BigInt(Date.now()));
  }

  /** The earliest deadline of the jobs running now (epoch ms), 0 for none. */
  deadline(epochMs) {
    Atomics.store(this._shared, 0, BigInt(Math.ceil(epochMs)));
  }

  stop() {
    clearInterval(this._tick);
    this._thread.terminate();
  }
}

module.exports = { Watchdog };
