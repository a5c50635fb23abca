"""Throwaway applications, outside the repository, install each client the documented way and
run a job against a throwaway server (test/run install).

Python: a venv made with --system-site-packages (Debian 12's python3 is PEP 668
externally-managed; Debian's python3-psycopg satisfies the dependency), then
`pip install --no-build-isolation --no-index <repo>/clients/python` (offline: Debian's
python3-setuptools and python3-wheel build it), and a wheel from one command,
`pip wheel --no-build-isolation --no-index --no-deps -w DIR <repo>/clients/python`, installed
into a second venv. Node: `npm pack` of clients/node, an app whose package.json depends on the
tarball (`file:`), `npm install` (pg, and typescript with @types/node and @types/pg for the type
check, from the npm registry), `tsc --noEmit` on a TypeScript file that uses the declarations.
Each app enqueues a job, runs a worker (isolated: the handler in a child process) until the job
succeeded, and prints what it saw.
"""
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
from pgserver import Server  # noqa: E402

server = None

# The clients' versions, each written once in its own sources.
with open(os.path.join(ROOT, "clients", "python", "jobcap", "_version.py")) as f:
    PY_VERSION = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)
with open(os.path.join(ROOT, "clients", "node", "package.json")) as f:
    NODE_VERSION = json.load(f)["version"]

PY_APP = '''
import os, sys
import jobcap, psycopg

conninfo = sys.argv[1]
where = os.path.dirname(jobcap.__file__)
assert where.startswith(sys.prefix), f"jobcap imported from {where}, not from the venv"

def handle(job):
    job.execute("INSERT INTO install_effects VALUES (%s, %s)", (job.id, os.getpid()))

with psycopg.connect(conninfo, autocommit=True) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS install_effects (job_id bigint, pid int)")
    jobcap.create_queue(conn, sys.argv[2])
    job_id = jobcap.enqueue(conn, sys.argv[2], {"hello": "world"})

def settled(job, outcome, error):
    print(f"job {job.id} {outcome}", flush=True)
    worker.stop()

worker = jobcap.Worker(conninfo, sys.argv[2], handle, lease=30, on_settled=settled)
worker.run(handle_signals=False)
with psycopg.connect(conninfo) as conn:
    state, pid = conn.execute("SELECT j.state::text, e.pid FROM jobcap.jobs j JOIN install_effects e"
                              " USING (job_id) WHERE job_id = %s", (job_id,)).fetchone()
assert state == "succeeded", state
assert pid != os.getpid(), "the handler ran in a child process"
print(f"jobcap {jobcap.__version__} from {where}: {state}")
'''

NODE_APP = '''
const path = require('node:path');
const pg = require('pg');
const jobcap = require('jobcap');
const { version } = require('jobcap/package.json');

(async () => {
  const connection = JSON.parse(process.argv[2]);
  const queue = process.argv[3];
  const db = new pg.Client(connection);
  await db.connect();
  await db.query('CREATE TABLE IF NOT EXISTS install_effects (job_id bigint, pid int)');
  await jobcap.createQueue(db, queue);
  const id = await jobcap.enqueue(db, queue, { hello: 'world' });
  const worker = new jobcap.Worker({ connection, queue, handler: path.join(__dirname, 'handler.js'),
    lease: 30000 });
  worker.on('settled', (job, outcome) => { console.log(`job ${job.id} ${outcome}`); worker.stop(); });
  await worker.run({ handleSignals: false });
  const { rows } = await db.query('SELECT j.state::text AS state, e.pid FROM jobcap.jobs j' +
    ' JOIN install_effects e USING (job_id) WHERE job_id = $1', [id]);
  await db.end();
  if (rows[0].state !== 'succeeded') throw new Error(`state ${rows[0].state}`);
  if (rows[0].pid === process.pid) throw new Error('the handler ran in this process');
  console.log(`jobcap ${version} from ${path.dirname(require.resolve('jobcap'))}: ${rows[0].state}`);
})().catch((err) => { console.error(err); process.exit(1); });
'''

NODE_HANDLER = '''
module.exports = async (job) => {
  await job.query('INSERT INTO install_effects VALUES ($1, $2)', [job.id, process.pid]);
};
'''

TS_APP = '''
import { Worker, Job, StaleFenceError, enqueue, release, Outcome } from 'jobcap';
import { Client } from 'pg';

interface Receipt { order: number }
async function handle(job: Job<Receipt>): Promise<void> {
  await job.query('SELECT $1::int', [job.payload.order]);
  if (job.lastAttempt) await job.heartbeat();
}
const worker = new Worker<Receipt>({ connection: 'postgres:///x', queue: 'q', handler: './handler.js',
  concurrency: 2, prefetch: 1 });
worker.on('settled', (job: Job<Receipt>, outcome: Outcome, error: Error | null) => {
  if (error instanceof StaleFenceError) console.log(error.jobId, error.fence, outcome, job.fence);
});
const inProcess = new Worker<Receipt>({ connection: { host: '/tmp' }, queue: 'q', handler: handle });
async function main(db: Client): Promise<string> {
  const id: string = await enqueue(db, 'q', { order: 1 });
  await release(db, id, 1);
  await inProcess.stop();
  return id;
}
void main;
'''


def run(cmd, cwd, env=None, timeout=600):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
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


class InstallTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="jobcap-app-")  # outside the repository
        self.addCleanup(shutil.rmtree, self.work, True)

    def test_python_pip_install_into_a_venv_with_system_site_packages(self):
        venv = os.path.join(self.work, "venv")
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], self.work)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "--disable-pip-version-check",
               "--no-cache-dir"]
        source = os.path.join(self.work, "src")
        # pip builds in the source tree; a copy keeps the checkout clean (and may be read-only).
        shutil.copytree(os.path.join(ROOT, "clients", "python"), source,
                        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
        run(pip + ["install", "--no-build-isolation", "--no-index", source], self.work)
        with open(os.path.join(self.work, "app.py"), "w") as f:
            f.write(PY_APP)
        out = run([os.path.join(venv, "bin", "python"), "app.py", server.conninfo, "py_app"],
                  self.work)
        self.assertIn("succeeded", out)
        show = run(pip + ["show", "jobcap"], self.work)
        self.assertIn(f"Version: {PY_VERSION}", show)
        self.assertIn("License:", show)

        # The wheel, from one command, installed into a second venv.
        dist = os.path.join(self.work, "dist")
        run(pip + ["wheel", "--no-build-isolation", "--no-index", "--no-deps", "-w", dist, source],
            self.work)
        wheels = [w for w in os.listdir(dist) if w.endswith(".whl")]
        self.assertEqual(wheels, [f"jobcap-{PY_VERSION}-py3-none-any.whl"])
        other = os.path.join(self.work, "venv2")
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", other], self.work)
        run([os.path.join(other, "bin", "python"), "-m", "pip", "install", "--no-index",
             os.path.join(dist, wheels[0])], self.work)
        meta = run([os.path.join(other, "bin", "python"), "-c",
                    "import importlib.metadata as m; d = m.metadata('jobcap');"
                    "print(d['Version'], d['License'] is not None, 'Description' in d or bool(d.get_payload()))"],
                   self.work)
        self.assertEqual(meta.split(), [PY_VERSION, "True", "True"])
        out = run([os.path.join(other, "bin", "python"), "app.py", server.conninfo, "py_wheel"],
                  self.work)
        self.assertIn("succeeded", out)

    def test_node_npm_pack_and_a_file_dependency(self):
        out = run(["npm", "pack", "--silent", "--pack-destination", self.work,
                   os.path.join(ROOT, "clients", "node")], self.work)
        tarball = out.strip().splitlines()[-1]
        self.assertEqual(tarball, f"jobcap-{NODE_VERSION}.tgz")
        listing = run(["tar", "tzf", os.path.join(self.work, tarball)], self.work).split()
        for want in ("package/index.d.ts", "package/lib/child.js", "package/LICENSE",
                     "package/README.md"):
            self.assertIn(want, listing)
        self.assertFalse([f for f in listing if "/test" in f], "tests stay out of the package")
        app = os.path.join(self.work, "app")
        os.mkdir(app)
        with open(os.path.join(app, "package.json"), "w") as f:
            json.dump({"name": "throwaway-app", "version": "1.0.0", "private": True,
                       "dependencies": {"jobcap": f"file:../{tarball}"},
                       "devDependencies": {"typescript": "^5", "@types/node": "*",
                                           "@types/pg": "*"}}, f)
        for name, text in (("app.js", NODE_APP), ("handler.js", NODE_HANDLER),
                           ("check.ts", TS_APP)):
            with open(os.path.join(app, name), "w") as f:
                f.write(text)
        run(["npm", "install", "--no-audit", "--no-fund", "--silent"], app)
        run([os.path.join(app, "node_modules", ".bin", "tsc"), "--noEmit", "--strict",
             "--module", "commonjs", "--target", "es2022", "--types", "node", "check.ts"], app)
        connection = {"host": server.dir, "port": server.port, "user": "postgres",
                      "database": "postgres"}
        out = run(["node", "app.js", json.dumps(connection), "node_app"], app)
        self.assertIn("succeeded", out)
        self.assertIn(os.path.join(app, "node_modules", "jobcap"), out)


def load_tests(loader, tests, pattern):
    """test/run install discovers this file by name (-p check.py): the other check_*.py files
    of this folder, one per client or framework and independent of each other, run with it,
    unless the discovery's pattern finds them itself."""
    import fnmatch
    import glob
    for path in sorted(glob.glob(os.path.join(HERE, "check_*.py"))):
        name = os.path.basename(path)
        if pattern is not None and fnmatch.fnmatch(name, pattern):
            continue
        tests.addTests(loader.loadTestsFromName(name[:-3]))
    return tests


if __name__ == "__main__":
    unittest.main()
