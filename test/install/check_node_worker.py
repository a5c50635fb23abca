"""The Node package is whole: `npm pack` of clients/node holds every file the package loads and
declares, and a Node worker runs from the packed tarball installed into a throwaway application
outside the repository (test/run install, beside check.py).

The tarball: every file of lib/ is in it, every relative require() of those files resolves
inside it, index.d.ts, README.md, LICENSE and package.json are in it, the tests are not. The
installed package: every value lib/index.js exports is declared in index.d.ts and every value
index.d.ts declares exists. Then a worker from the installed package runs a handler module in
its child processes (jobs that write in their transaction, jobs that do not and are completed
in a batch with their outputs, a job whose handler SIGKILLs its process: a crash, recorded, and
the others unaffected) and an in-process handler, against a throwaway server.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
NODE = os.path.join(ROOT, "clients", "node")
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
from pgserver import Server  # noqa: E402

server = None

EXPORTS = r'''
// What the installed package exports at run time, and where it was loaded from.
const path = require('node:path');
const jobcap = require('jobcap');
const from = path.dirname(require.resolve('jobcap'));
console.log(JSON.stringify({ names: Object.keys(jobcap), from }));
'''

HANDLER = r'''
// The handler module the worker's child processes load.
module.exports = async (job) => {
  const { kind } = job.payload;
  if (kind === 'kill') process.kill(process.pid, 'SIGKILL');
  if (kind === 'write') {
    await job.query('INSERT INTO node_effects (job_id, fence, pid) VALUES ($1, $2, $3)',
      [job.id, job.fence, process.pid]);
  } else {
    job.output = { pid: process.pid };  // no statement: completed in a batch
  }
};
'''

APP = r'''
// A worker from the installed package: isolated (a handler module), then in-process.
const path = require('node:path');
const jobcap = require('jobcap');

async function drain(worker, expected) {
  const outcomes = [];
  worker.on('settled', (job, outcome, error) => {
    outcomes.push({ id: job.id, outcome, error: error && error.constructor.name });
    if (outcomes.length === expected) worker.stop();
  });
  await worker.run({ handleSignals: false });
  return outcomes;
}

(async () => {
  const connection = JSON.parse(process.argv[2]);
  const isolated = await drain(new jobcap.Worker({ connection, queue: 'node_isolated',
    handler: path.join(__dirname, 'handler.js'), concurrency: 2, prefetch: 2, lease: 30000 }),
  Number(process.argv[3]));
  const inProcess = await drain(new jobcap.Worker({ connection, queue: 'node_inprocess',
    concurrency: 3, lease: 30000, handler: async (job) => { job.output = { n: job.payload.n }; } }),
  Number(process.argv[4]));
  console.log(JSON.stringify({ isolated, inProcess, pid: process.pid }));
})().catch((err) => { console.error(err); process.exit(1); });
'''


def run(cmd, cwd, timeout=600):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}"
                             f"{result.stderr}")
    return result.stdout


def setUpModule():
    global server
    server = Server().start()


def tearDownModule():
    if server is not None:
        server.stop()


class NodePackageTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="jobcap-node-app-")  # outside the repository
        self.addCleanup(shutil.rmtree, self.work, True)
        out = run(["npm", "pack", "--silent", "--pack-destination", self.work, NODE], self.work)
        self.tarball = out.strip().splitlines()[-1]
        listing = run(["tar", "tzf", os.path.join(self.work, self.tarball)], self.work).split()
        self.files = {f.removeprefix("package/") for f in listing}

    def test_the_tarball_holds_what_the_package_loads_and_declares(self):
        for want in ("package.json", "index.d.ts", "README.md", "LICENSE"):
            self.assertIn(want, self.files)
        lib = sorted(f for f in os.listdir(os.path.join(NODE, "lib")) if f.endswith(".js"))
        self.assertTrue(lib)
        for name in lib:
            self.assertIn(f"lib/{name}", self.files)
            with open(os.path.join(NODE, "lib", name)) as f:
                source = f.read()
            for target in re.findall(r"require\('(\.[^']*)'\)", source):
                resolved = os.path.normpath(os.path.join("lib", target))
                candidates = {resolved, resolved + ".js", os.path.join(resolved, "index.js")}
                self.assertTrue(candidates & self.files,
                                f"lib/{name} requires {target}, not in the tarball")
        with open(os.path.join(NODE, "package.json")) as f:
            package = json.load(f)
        self.assertIn(package["main"].removeprefix("./"), self.files)
        self.assertIn(package["types"].removeprefix("./"), self.files)
        self.assertFalse([f for f in self.files if f.startswith(("test/", "test-support/"))],
                         "tests stay out of the package")

    def test_a_worker_runs_from_the_installed_tarball(self):
        app = os.path.join(self.work, "app")
        os.mkdir(app)
        with open(os.path.join(app, "package.json"), "w") as f:
            json.dump({"name": "node-worker-app", "version": "1.0.0", "private": True,
                       "dependencies": {"jobcap": f"file:../{self.tarball}"}}, f)
        for name, text in (("exports.js", EXPORTS), ("handler.js", HANDLER), ("app.js", APP)):
            with open(os.path.join(app, name), "w") as f:
                f.write(text)
        run(["npm", "install", "--no-audit", "--no-fund", "--silent"], app)

        # The run-time exports and the declarations agree.
        seen = json.loads(run(["node", "exports.js"], app))
        self.assertEqual(seen["from"], os.path.join(app, "node_modules", "jobcap", "lib"))
        with open(os.path.join(app, "node_modules", "jobcap", "index.d.ts")) as f:
            declarations = f.read()
        values = set(re.findall(r"^export declare (?:class|function|const) (\w+)", declarations,
                                re.M))
        types = set(re.findall(r"^export (?:interface|type) (\w+)", declarations, re.M))
        self.assertFalse(values - set(seen["names"]), "declared in index.d.ts, not exported")
        self.assertFalse(set(seen["names"]) - values - types, "exported, not declared")

        conninfo = f"host={server.dir} port={server.port} user=postgres dbname=postgres"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE node_effects (job_id bigint, fence bigint, pid int)")
            for queue in ("node_isolated", "node_inprocess"):
                conn.execute("SELECT jobcap.create_queue(%s, max_attempts => 2)", (queue,))
            enqueue = "SELECT jobcap.enqueue_job(%s, %s::jsonb, max_attempts => %s)"
            kinds = ["write", "light"] * 4
            isolated = [conn.execute(enqueue, ("node_isolated", json.dumps({"kind": k}), 2))
                        .fetchone()[0] for k in kinds[:4]]
            killer = conn.execute(enqueue, ("node_isolated", '{"kind": "kill"}', 1)).fetchone()[0]
            isolated += [conn.execute(enqueue, ("node_isolated", json.dumps({"kind": k}), 2))
                         .fetchone()[0] for k in kinds[4:]]
            inprocess = [conn.execute(enqueue, ("node_inprocess", json.dumps({"n": n}), 2))
                         .fetchone()[0] for n in range(6)]
            connection = {"host": server.dir, "port": server.port, "user": "postgres",
                          "database": "postgres"}
            report = json.loads(run(["node", "app.js", json.dumps(connection),
                                     str(len(isolated) + 1), str(len(inprocess))], app,
                                    timeout=120).strip().splitlines()[-1])

            # job.id is a string of digits in Node (an id can pass 2^53 on a Citus cluster)
            outcomes = {int(o["id"]): o for o in report["isolated"]}
            self.assertEqual(outcomes[killer]["outcome"], "dead")
            self.assertEqual(outcomes[killer]["error"], "HandlerCrashedError")
            history = conn.execute("SELECT kind, error FROM jobcap.job_errors WHERE job_id = %s",
                                   (killer,)).fetchall()
            self.assertEqual(history, [("crashed", "killed by signal 9 (SIGKILL)")])
            pids = set()
            for job_id, kind in zip(isolated, kinds):
                self.assertEqual(outcomes[job_id]["outcome"], "succeeded", f"job {job_id}")
                state, attempts, output = conn.execute(
                    "SELECT state::text, attempts, output FROM jobcap.jobs WHERE job_id = %s",
                    (job_id,)).fetchone()
                self.assertEqual((state, attempts), ("succeeded", 1), f"job {job_id}")
                if kind == "write":
                    (pid,), = conn.execute("SELECT pid FROM node_effects WHERE job_id = %s",
                                           (job_id,)).fetchall()
                else:
                    pid = output["pid"]
                pids.add(pid)
            self.assertNotIn(report["pid"], pids, "handlers ran in child processes")
            self.assertLessEqual(len(pids), 3, "two children and a replacement, reused")

            self.assertEqual(sorted(int(o["id"]) for o in report["inProcess"]
                                    if o["outcome"] == "succeeded"), inprocess)
            outputs = [conn.execute("SELECT output FROM jobcap.jobs WHERE job_id = %s",
                                    (i,)).fetchone()[0] for i in inprocess]
            self.assertEqual(outputs, [{"n": n} for n in range(6)])


if __name__ == "__main__":
    unittest.main()
