'use strict';
// The handler module of the isolation tests: the Worker forks a process that loads it.
// payload.do: 'kill' SIGKILLs its own process, 'abort' aborts it (SIGABRT, as a native crash
// would), 'throw' throws, 'hang' blocks the event loop, 'sleep' waits payload.ms; 'light' does
// not use its connection at all (it keeps its process id as its output: the supervisor
// completes it in a batch); every other job that returns writes its effect in the job's
// transaction first.
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

module.exports = async function handle(job) {
  const what = job.payload.do || 'ok';
  if (what === 'kill') process.kill(process.pid, 'SIGKILL');
  if (what === 'abort') process.abort();
  if (what === 'throw') throw new RangeError(`bad input in job ${job.id}`);
  if (what === 'hang') for (;;) { /* a synchronous hang: only a kill ends it */ }
  if (what === 'cancel') {  // worker_script.js cancel: writes, then waits 30 s unless quick
    await job.query('INSERT INTO effects (job_id, fence) VALUES ($1, $2)', [job.id, job.fence]);
    console.log(`started ${job.id}`);
    if (!job.payload.quick) await sleep(30000);
    return;
  }
  if (what === 'beat') {
    for (let i = 0; i < 8; i++) {  // 2.4 s: past a 2 s lease
      await sleep(300);
      await job.heartbeat();
    }
  }
  if (job.payload.started) console.log(`started ${job.id}`);
  if (job.payload.ms) await sleep(job.payload.ms);
  if (what === 'light') {
    job.output = { pid: process.pid };
    return;
  }
  await job.query('INSERT INTO effects (job_id, fence) VALUES ($1, $2)', [job.id, job.fence]);
};
