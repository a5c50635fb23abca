"""The code blocks of the READMEs run as they are, so that none can rot.

README.md: its ```sql blocks, in order, with psql in a new database that has only the role
`mailer` and the table `thumbnails` they use (the first block creates the extension); the
worker loop's job must end succeeded with its row written.

clients/python/README.md: every ```python block; clients/node/README.md: every ```js block
(and ```sql blocks of either, run with psql). Each runs in a throwaway application outside the
repository that installed the package the documented way (a venv with Debian's packages and
`pip install --no-build-isolation --no-index`; `npm pack` and a `file:` dependency on the
tarball), against a throwaway server whose database `shop` has what the blocks use: the queues
`receipts` and `exports` and the table `receipts`. A js block whose first line is a comment
naming a file (`// worker.js`) is written to that file, all of them before any runs, so that
one block can name another's module. The reader's own modules the blocks import (`mailer`,
`reports`) are stubs here.

Before each block runs, one job waits in each queue. A block that exits must exit 0. A block
still running is a worker: it must complete a job of the queue it serves, and then exit 0 on
SIGTERM (which it must take as a clean stop). Run it with test/run install (or
`python3 -m unittest discover -s test/install -p 'check_*.py'` with JOBCAP_PG_BINDIR set).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
from pgserver import Server  # noqa: E402

BLOCK = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
RUNS = {"python": "python", "js": "js", "javascript": "js", "sql": "sql"}
EXTENSIONS = {"python": "py", "js": "js", "sql": "sql"}
QUEUES = {"receipts": {"order": 42}, "exports": {"day": "2026-12-01"}}

PY_STUBS = {
    "mailer.py": '"""The reader\'s mail client, a stub."""\n\n\n'
                 'def send(order, fencing_token=None):\n'
                 '    print(f"mail for order {order}, token {fencing_token}", flush=True)\n',
    "reports.py": '"""The reader\'s export code, a stub that uses the job\'s connection."""\n\n\n'
                  'def write_export(day, conn):\n'
                  '    return conn.execute("SELECT 3").fetchone()[0]\n',
}
JS_STUBS = {
    "mailer.js": "// The reader's mail client, a stub.\n"
                 "exports.send = async (order, options) => {\n"
                 "  console.log(`mail for order ${order}`, JSON.stringify(options));\n};\n",
    "reports.js": "// The reader's export code, a stub that uses the job's connection.\n"
                  "exports.writeExport = async (day, job) => {\n"
                  "  const { rows } = await job.query('SELECT 3 AS n');\n"
                  "  return rows[0].n;\n};\n",
}

server = None


def setUpModule():
    global server
    server = Server().start()
    server.psql("CREATE DATABASE shop")
    with psycopg.connect(shop_conninfo(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION jobcap")
        conn.execute("CREATE TABLE receipts (order_id int NOT NULL)")
        for queue in QUEUES:
            conn.execute("SELECT jobcap.create_queue(%s, notify => true)", (queue,))


def tearDownModule():
    if server is not None:
        server.stop()


def shop_conninfo():
    return f"host={server.dir} port={server.port} user=postgres dbname=shop"


def blocks(readme):
    """(language, text) of the blocks of README that run, in order."""
    with open(readme) as f:
        text = f.read()
    return [(RUNS[lang], body) for lang, body in BLOCK.findall(text) if lang in RUNS]


def run(cmd, cwd, timeout=600):
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}"
                             f"{result.stderr}")
    return result.stdout


class ReadmeTest(unittest.TestCase):
    def setUp(self):
        self.app = tempfile.mkdtemp(prefix="jobcap-readme-")  # outside the repository
        self.addCleanup(shutil.rmtree, self.app, True)
        self.env = {**os.environ, "PGHOST": server.dir, "PGPORT": str(server.port),
                    "PGUSER": "postgres", "PGDATABASE": "shop"}
        self.env.pop("PYTHONPATH", None)
        self.env.pop("NODE_PATH", None)

    def write(self, files):
        for name, text in files.items():
            with open(os.path.join(self.app, name), "w") as f:
                f.write(text)

    def test_python_readme(self):
        venv = os.path.join(self.app, "venv")
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], self.app)
        source = os.path.join(self.app, "src")
        shutil.copytree(os.path.join(ROOT, "clients", "python"), source,
                        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
        run([os.path.join(venv, "bin", "python"), "-m", "pip", "--disable-pip-version-check",
             "--no-cache-dir", "install", "--no-build-isolation", "--no-index", source], self.app)
        shutil.rmtree(source)
        self.write(PY_STUBS)
        python = os.path.join(venv, "bin", "python")
        self.run_blocks(os.path.join(ROOT, "clients", "python", "README.md"), "python",
                        lambda path: [python, path])

    def test_node_readme(self):
        out = run(["npm", "pack", "--silent", "--pack-destination", self.app,
                   os.path.join(ROOT, "clients", "node")], self.app)
        tarball = out.strip().splitlines()[-1]
        with open(os.path.join(self.app, "package.json"), "w") as f:
            json.dump({"name": "readme-app", "version": "1.0.0", "private": True,
                       "dependencies": {"jobcap": f"file:./{tarball}"}}, f)
        run(["npm", "install", "--no-audit", "--no-fund", "--silent"], self.app)
        self.write(JS_STUBS)
        self.run_blocks(os.path.join(ROOT, "clients", "node", "README.md"), "js",
                        lambda path: ["node", path])

    def test_main_readme_sql(self):
        server.psql("CREATE DATABASE readme")
        self.addCleanup(server.psql, "DROP DATABASE readme")
        conninfo = f"host={server.dir} port={server.port} user=postgres dbname=readme"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("DO $$ BEGIN CREATE ROLE mailer; EXCEPTION WHEN duplicate_object"
                         " THEN NULL; END $$")
            conn.execute("CREATE TABLE thumbnails (job_id bigint, file text)")
        found = [body for lang, body in blocks(os.path.join(ROOT, "README.md")) if lang == "sql"]
        self.assertGreaterEqual(len(found), 3, "the README's sql blocks")
        psql = os.path.join(server.bindir, "psql")
        for n, body in enumerate(found):
            with self.subTest(block=n + 1, first=body.splitlines()[0]):
                name = f"readme{n + 1}.sql"
                self.write({name: body})
                run([psql, "-X", "-v", "ON_ERROR_STOP=1", "-h", server.dir, "-p", str(server.port),
                     "-U", "postgres", "-d", "readme", "-f", name], self.app)
        with psycopg.connect(conninfo) as conn:
            row = conn.execute("SELECT j.state::text, j.attempts, t.file FROM jobcap.jobs j"
                               " JOIN thumbnails t USING (job_id) WHERE j.queue = 'media'").fetchall()
        self.assertEqual(row, [("succeeded", 1, "a.jpg")])

    def run_blocks(self, readme, language, command):
        found = blocks(readme)
        self.assertTrue([b for b in found if b[0] == language], f"no {language} block in {readme}")
        # Files named by their first line first: one block may name another's module.
        paths = []
        for n, (lang, body) in enumerate(found):
            named = re.match(r"^(?://|#) ([\w.-]+\.(?:js|py))\s*$", body.splitlines()[0])
            name = named.group(1) if named else f"block{n + 1}.{EXTENSIONS[lang]}"
            self.assertNotIn(name, paths, f"two blocks of {readme} name {name}")
            self.write({name: body})
            paths.append(name)
        workers = 0
        for (lang, body), name in zip(found, paths):
            with self.subTest(block=name):
                first = body.splitlines()[0]
                cmd = (["psql", "-X", "-v", "ON_ERROR_STOP=1", "-f", name] if lang == "sql"
                       else command(name))
                if lang == "sql":
                    cmd[0] = os.path.join(server.bindir, "psql")
                workers += self.run_block(cmd, f"{readme} block {name} ({first})")
        self.assertGreaterEqual(workers, 1, f"no block of {readme} ran a worker")

    def run_block(self, cmd, what):
        """Runs one block; returns 1 when it was a worker (it completed a job), else 0."""
        with psycopg.connect(shop_conninfo(), autocommit=True) as conn:
            conn.execute("TRUNCATE jobcap.jobs, jobcap.job_errors")
            ids = {queue: conn.execute("SELECT jobcap.enqueue_job(%s, %s)",
                                       (queue, json.dumps(payload))).fetchone()[0]
                   for queue, payload in QUEUES.items()}
            log = open(os.path.join(self.app, "block.log"), "w+")
            proc = subprocess.Popen(cmd, cwd=self.app, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                end = time.monotonic() + 30
                done = []
                while proc.poll() is None and time.monotonic() < end:
                    done = [q for q, i in ids.items() if conn.execute(
                        "SELECT state = 'succeeded' FROM jobcap.jobs WHERE job_id = %s",
                        (i,)).fetchone()[0]]
                    if done:
                        break
                    time.sleep(0.1)
                worker = proc.poll() is None
                if worker:
                    self.assertTrue(done, f"{what}: runs on, but completed no job in 30 s:\n"
                                    f"{self.output(log)}")
                    time.sleep(0.5)
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(20)
                else:
                    proc.wait()
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            output = self.output(log)
            log.close()
            self.assertEqual(proc.returncode, 0, f"{what} exited with {proc.returncode}:\n{output}")
            self.assertNotIn("Traceback", output, f"{what}:\n{output}")
            if worker:
                left = conn.execute("SELECT count(*) FROM jobcap.jobs WHERE state = 'running'"
                                    ).fetchone()[0]
                self.assertEqual(left, 0, f"{what}: a job still running after the worker stopped")
            return 1 if worker else 0

    @staticmethod
    def output(log):
        log.flush()
        log.seek(0)
        return log.read()


if __name__ == "__main__":
    unittest.main()
