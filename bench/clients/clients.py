"""The client workers side by side with SQL-level claim + complete: bench/clients/run's driver.

Every row drains the same kind of backlog (trivial jobs carrying bench/cluster.sh's payload) on
the same server in the same run, and is measured the same way: the jobs finished between two
samples of the job table taken `--duration` seconds apart, after `--warmup` seconds. Rows run
in rounds, in alternating order (a drift of the machine weighs on every row alike), and each
row's ratio to the reference row is taken within its round. A row whose backlog ran out before
the second sample is run again with a larger one; a row that still runs out is reported as
invalid, never as a number.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PAYLOAD = os.environ["BENCH_PAYLOAD"]


def cpu_busy() -> tuple:
    """(CPU time in seconds the whole machine has spent busy, and the part of it spent by this
    benchmark: this driver's descendants and the server's processes)."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    total = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    parent, used = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        parent[int(entry)] = int(rest[1])
        used[int(entry)] = int(rest[11]) + int(rest[12])
    roots = {os.getpid(), SERVER_PID}
    mine = 0
    for pid, ticks in used.items():
        p = pid
        while p > 1 and p not in roots:
            p = parent.get(p, 0)
        if p in roots:
            mine += ticks
    return total / hz, mine / hz


SERVER_PID = 0


class Row:
    """One way of draining the backlog: a command and how its finished jobs are counted."""

    def __init__(self, key: str, label: str, settings: str, command: list, kind: str = "jobcap"):
        self.key = key
        self.label = label
        self.settings = settings
        self.command = command
        self.kind = kind  # jobcap: jobcap.jobs; graphile: graphile_worker's job table
        self.rates: list = []
        self.ratios: list = []
        self.others: list = []  # CPU (cores) used by processes outside the benchmark
        self.invalid = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", required=True)
    parser.add_argument("--graphile", help="a directory with graphile-worker installed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--only", help="comma-separated row keys (the reference always runs)")
    parser.add_argument("--out", help="write the table (markdown) here too")
    parser.add_argument("--quiet", type=float, default=0.25,
                        help="a run during which processes outside the benchmark used more CPU"
                             " than this (cores) is run again, after waiting for a quieter"
                             " machine, up to --tries times")
    parser.add_argument("--tries", type=int, default=4)
    args = parser.parse_args()

    conninfo = f"host={args.host} port={args.port} dbname=bench user=postgres"
    connection = {"host": args.host, "port": int(args.port), "database": "bench",
                  "user": "postgres"}
    url = f"postgres://postgres@/bench?host={args.host}&port={args.port}"
    py = [sys.executable, os.path.join(HERE, "py_worker.py"), conninfo, "bench"]
    node = ["node", os.path.join(HERE, "node_worker.js"), json.dumps(connection), "bench"]
    pgbench = ["pgbench", "-n", "-M", "prepared", "-j", "1", "-c", "8", "-h", args.host,
               "-p", str(args.port), "-U", "postgres", "-D", "queue=bench", "-D", "worker=bench",
               "-D", "job_id=0", "-D", "fence=0", "-D", f"payload={PAYLOAD}", "bench"]
    rows = [
        Row("sql", "SQL: claim_job, then complete_job (bench/run's W1)",
            "pgbench, 8 clients, 2 commits per job",
            pgbench + ["-f", os.path.join(ROOT, "bench", "w1-jobcap.pgbench")]),
        Row("sql_cac", "SQL: complete_and_claim (W1, one commit per job)",
            "pgbench, 8 clients",
            pgbench + ["-f", os.path.join(ROOT, "bench", "w1-jobcap-cac.pgbench")]),
        Row("py_pool", "Python jobcap.Worker, default mode (isolated: process pool)",
            "concurrency=8, prefetch=8: 8 pool processes, 1 supervisor",
            py + ["isolated", "concurrency=8", "prefetch=8"]),
        Row("py_pool0", "Python jobcap.Worker, default mode, prefetch 0",
            "concurrency=8, prefetch=0: 8 pool processes, 1 supervisor",
            py + ["isolated", "concurrency=8", "prefetch=0"]),
        Row("py_inproc", "Python jobcap.Worker, in-process (isolate=False)",
            "batch=1 (the default): 1 process, 1 job at a time",
            py + ["inprocess"]),
        Row("py_inproc10", "Python jobcap.Worker, in-process, batch 10",
            "batch=10: 1 process, 1 job at a time",
            py + ["inprocess", "batch=10"]),
        Row("node_inproc", "Node Worker, in-process (function handler)",
            "concurrency=8, prefetch=0: 1 process",
            node + ["inprocess", "concurrency=8"]),
        Row("node_inproc8", "Node Worker, in-process, prefetch 8",
            "concurrency=8, prefetch=8: 1 process",
            node + ["inprocess", "concurrency=8", "prefetch=8"]),
        Row("node_isolated", "Node Worker, isolated (module handler)",
            "concurrency=8, prefetch=8: 8 child processes, 1 supervisor",
            node + ["isolated", "concurrency=8", "prefetch=8"]),
    ]
    if args.graphile:
        runner = ["node", os.path.join(HERE, "graphile_runner.js"), args.graphile, url, "8"]
        rows.append(Row("graphile", "graphile-worker runner (its defaults)",
                        "concurrency=8: 1 process", runner, "graphile"))
        rows.append(Row("graphile_batched", "graphile-worker runner, batching on",
                        "concurrency=8, localQueue.size=9, completeJobBatchDelay=0: 1 process",
                        runner + ["batched"], "graphile"))
    if args.only:
        keep = set(args.only.split(",")) | {"sql"}
        unknown = keep - {r.key for r in rows}
        if unknown:
            sys.exit(f"unknown rows: {', '.join(sorted(unknown))}")
        rows = [r for r in rows if r.key in keep]

    conn = psycopg.connect(conninfo, autocommit=True)
    global SERVER_PID
    data = conn.execute("SHOW data_directory").fetchone()[0]
    with open(os.path.join(data, "postmaster.pid")) as f:
        SERVER_PID = int(f.readline())
    if any(r.kind == "graphile" for r in rows):
        prepare_graphile(args.graphile, url, conn)
    estimate = {r.key: 8000.0 for r in rows}
    loads = []
    print(f"{len(rows)} rows, {args.rounds} rounds, warm-up {args.warmup:g}s, measured "
          f"{args.duration:g}s each; {os.cpu_count()} cores", flush=True)
    for n in range(args.rounds):
        order = rows if n % 2 == 0 else rows[::-1]
        before = os.getloadavg()
        rates = {}
        for row in order:
            rate = None
            drained = 0
            for attempt in range(args.tries):
                wait_quiet(args.quiet)
                backlog = int(max(estimate[row.key] * 1.6, 2000) * (args.warmup + args.duration
                                                                    + 2)) * (drained + 1)
                rate, others = measure(row, conn, backlog, args.warmup, args.duration)
                if rate is None:
                    drained += 1
                    if drained == 2:
                        break
                    continue
                if others <= args.quiet or attempt == args.tries - 1:
                    break
                print(f"  round {n + 1} {row.key}: {rate:,.0f} jobs/s while others used"
                      f" {others:.2f} cores: again", flush=True)
            if rate is None:
                row.invalid += 1
                print(f"  round {n + 1} {row.key}: INVALID (the backlog ran out)", flush=True)
                continue
            estimate[row.key] = max(estimate[row.key], rate)
            rates[row.key] = rate
            row.rates.append(rate)
            row.others.append(others)
            print(f"  round {n + 1} {row.key}: {rate:,.0f} jobs/s  (others used {others:.2f} of"
                  f" {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f})", flush=True)
        after = os.getloadavg()
        loads.append((before, after))
        if "sql" in rates:
            for row in rows:
                if row.key in rates:
                    row.ratios.append(rates[row.key] / rates["sql"])
    conn.close()
    table = report(rows, loads, args)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


def wait_quiet(limit: float, longest: float = 300.0) -> None:
    """Waits (at most `longest` seconds) until processes outside the benchmark used under limit
    cores over 3 s."""
    end = time.monotonic() + longest
    while time.monotonic() < end:
        busy0, mine0 = cpu_busy()
        time.sleep(3)
        busy1, mine1 = cpu_busy()
        if ((busy1 - busy0) - (mine1 - mine0)) / 3 < limit:
            return


def prepare_graphile(directory: str, url: str, conn: psycopg.Connection) -> None:
    """graphile-worker's schema, installed by its own CLI (--schema-only)."""
    cli = os.path.join(directory, "node_modules", ".bin", "graphile-worker")
    subprocess.run([cli, "-c", url, "--schema-only"], check=True, capture_output=True)
    conn.execute("SELECT 1 FROM graphile_worker._private_jobs LIMIT 0")


def load(row: Row, conn: psycopg.Connection, backlog: int) -> None:
    conn.execute("CALL bench.load('jobcap', 0)")  # both job tables of bench/setup.sql emptied
    if row.kind == "graphile":
        conn.execute("TRUNCATE graphile_worker._private_jobs CASCADE")
        conn.execute(
            "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(SELECT ROW('noop', %s::json,"
            " NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec"
            " FROM generate_series(1, %s)))", (PAYLOAD, backlog))
        conn.execute("VACUUM ANALYZE graphile_worker._private_jobs")
    else:
        if row.kind == "jobcap" and table_exists(conn, "graphile_worker._private_jobs"):
            conn.execute("TRUNCATE graphile_worker._private_jobs CASCADE")
        conn.execute("CALL bench.load('jobcap', %s)", (backlog,))
        conn.execute("VACUUM ANALYZE jobcap.jobs")
    conn.execute("CHECKPOINT")


def table_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def finished(row: Row, conn: psycopg.Connection) -> tuple:
    """(jobs finished so far as a count that only grows, jobs still to run)."""
    if row.kind == "graphile":
        left = conn.execute("SELECT count(*) FROM graphile_worker._private_jobs").fetchone()[0]
        return -left, left
    done, left = conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'succeeded'),"
        " count(*) FILTER (WHERE state = 'pending') FROM jobcap.jobs").fetchone()
    return done, left


def measure(row: Row, conn: psycopg.Connection, backlog: int, warmup: float,
            duration: float):
    """(jobs/s of one run of row, or None when its backlog ran out before the end; the CPU
    that processes outside the benchmark used meanwhile, in cores)."""
    load(row, conn, backlog)
    command = list(row.command)
    if row.key.startswith("sql"):
        command[1:1] = ["-T", str(int(warmup + duration + 2))]
    log = open(os.path.join(os.environ.get("BENCH_LOGS", "/tmp"), f"{row.key}.log"), "w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        time.sleep(warmup)
        c0, _ = finished(row, conn)
        t0 = time.monotonic()
        busy0, mine0 = cpu_busy()
        time.sleep(duration)
        c1, left = finished(row, conn)
        t1 = time.monotonic()
        busy1, mine1 = cpu_busy()
    finally:
        stop(proc)
        log.close()
    if proc.returncode not in (0, -signal.SIGTERM) and not row.key.startswith("sql"):
        raise SystemExit(f"{row.key} exited with {proc.returncode}: see its log")
    others = max((busy1 - busy0) - (mine1 - mine0), 0) / (t1 - t0)
    if left == 0 or c1 <= c0:
        return None, others
    return (c1 - c0) / (t1 - t0), others


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()


def report(rows: list, loads: list, args: argparse.Namespace) -> str:
    lines = ["| row | settings | jobs/s (mean of rounds) | rounds | x SQL claim + complete |"
             " others' CPU (cores, most) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        if not row.rates:
            lines.append(f"| {row.label} | {row.settings} | invalid | - | - | - |")
            continue
        rounds = ", ".join(f"{r:,.0f}" for r in row.rates)
        ratio = f"{statistics.mean(row.ratios):.2f}" if row.ratios else "-"
        if row.ratios and len(row.ratios) > 1:
            ratio += f" ({min(row.ratios):.2f}-{max(row.ratios):.2f})"
        extra = f", {row.invalid} invalid" if row.invalid else ""
        lines.append(f"| {row.label} | {row.settings} | {statistics.mean(row.rates):,.0f} |"
                     f" {rounds}{extra} | {ratio} | {max(row.others):.2f} |")
    load_text = "; ".join(f"round {n + 1}: {b[0]:.2f} before, {a[0]:.2f} after"
                          for n, (b, a) in enumerate(loads))
    lines.append("")
    lines.append(f"1-minute load average: {load_text}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
