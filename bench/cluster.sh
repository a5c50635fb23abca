# Sourced by the benchmarks (after test/lib.sh): the one payload every benchmark job carries, the
# throwaway cluster they start, and the reading of pgbench's report.
BENCH_PAYLOAD='{"file": "s3://media-bucket/incoming/2026/11/29/object-000042.mp4", "size": 1048576}'

# bench_cluster DIR [postgresql.conf line ...]: initdb DIR/data, listening on a unix socket in
# DIR only, started with its log in DIR/server.log; database bench with bench/setup.sql
# loaded. Exports PGHOST, PGPORT and PGDATABASE for the caller's psql and pgbench.
bench_cluster() {
    local dir=$1
    shift
    export PGHOST=$dir PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=bench
    as_tester initdb -D "$dir/data" -A trust -E UTF8 >/dev/null
    printf '%s\n' "listen_addresses = ''" "unix_socket_directories = '$dir'" "port = $PGPORT" "$@" \
        >> "$dir/data/postgresql.conf"
    as_tester pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    as_tester createdb bench
    as_tester psql -X -q -v ON_ERROR_STOP=1 -v payload="$BENCH_PAYLOAD" \
        -f "$JOBCAP_ROOT/bench/setup.sql" >/dev/null
}

# pgbench's report on stdin, one line per -f script in their order: its mean latency in ms
# (pgbench_latencies) or its transaction count (pgbench_counts). The report gives each script
# as "SQL script N: <file>", then " - N transactions (...)" and " - latency average = X ms".
pgbench_latencies() { awk '/^SQL script/ { s = 1 } s && /latency average/ { print $5; s = 0 }'; }
pgbench_counts() { awk '/^SQL script/ { s = 1 } s && / transactions \(/ { print $2 }'; }

# median_range V...: "M (LOW to HIGH)", to three decimals.
median_range() {
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.3f (%.3f to %.3f)", m, v[1], v[NR] }'
}
