"""A throwaway PostgreSQL server with jobcap, for tests: initdb, start, stop, remove.

It runs the binaries of the private install that test/run builds (build/tmp_install), or those
in $JOBCAP_PG_BINDIR. As root, the server runs as the postgres user (initdb refuses root). It
listens on a Unix socket in its own temporary directory only, so it collides with nothing.
"""
from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import tempfile
from typing import List, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def pg_bindir() -> str:
    env = os.environ.get("JOBCAP_PG_BINDIR")
    if env:
        return env
    system = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                            check=True).stdout.strip()
    private = os.path.join(ROOT, "build", "tmp_install") + system
    if not os.path.exists(os.path.join(private, "postgres")):
        raise RuntimeError(f"no private install at {private}: run test/run clients (or set "
                           "JOBCAP_PG_BINDIR to a bindir whose server has jobcap installed)")
    return private


class Server:
    def __init__(self, settings: Optional[dict] = None, port: int = 5432):
        self.bindir = pg_bindir()
        self.settings = settings or {}
        self.port = port
        self.dir = tempfile.mkdtemp(prefix="jobcap-test-")
        self.data = os.path.join(self.dir, "data")
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.running = False

    @property
    def conninfo(self) -> str:
        return f"host={self.dir} port={self.port} user=postgres dbname=postgres"

    def _run(self, args: List[str]) -> None:
        cmd = [os.path.join(self.bindir, args[0])] + args[1:]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}"
                               f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> "Server":
        self._run(["initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync",
                   "-E", "UTF8", "--locale=C"])
        conf = {"listen_addresses": "''", "unix_socket_directories": f"'{self.dir}'",
                "port": str(self.port), "fsync": "off", "max_connections": "50",
                "shared_buffers": "32MB"}
        conf.update({k: str(v) for k, v in self.settings.items()})
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            for key, value in conf.items():
                f.write(f"{key} = {value}\n")
        self._run(["pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"), "-w",
                   "start"])
        self.running = True
        atexit.register(self.stop)  # whatever happens to the test process, the server goes too
        self.psql("CREATE EXTENSION jobcap")
        return self

    def psql(self, sql: str) -> str:
        cmd = [os.path.join(self.bindir, "psql"), "-X", "-q", "-A", "-t", "-v",
               "ON_ERROR_STOP=1", "-d", self.conninfo, "-c", sql]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()

    def stop(self) -> None:
        if self.running:
            self._run(["pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"])
            self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)
