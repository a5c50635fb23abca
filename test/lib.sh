# Shared by test/run, test/demo and .ci/run: dependencies, a private install, a non-root runner.
# shellcheck shell=bash

JOBCAP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${JOBCAP_BUILD:-$JOBCAP_ROOT/build}
PG_CONFIG=${PG_CONFIG:-pg_config}
# A script run from another (test/demo runs test/chaos/run) inherits a PATH that starts with the
# private install, whose pg_config would describe the copy, not the system: drop it.
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v "^$BUILD/tmp_install/" | paste -sd: -)

say() { printf '\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# The PostgreSQL major the build targets: from PG_CONFIG's path (/usr/lib/postgresql/NN/bin/...)
# or its --version, 15 (Debian 12's) when there is no pg_config yet.
jobcap_major() {
    local m
    m=$(printf '%s' "$PG_CONFIG" | sed -nE 's|.*/postgresql/([0-9]+)/bin/pg_config$|\1|p')
    [ -n "$m" ] || m=$($PG_CONFIG --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
    echo "${m:-15}"
}

# Debian packages the tests need. Installed when missing and we are root; otherwise named.
# "jobcap_deps pgxs" asks only for what building and the PGXS suites (regress, isolation, TAP)
# need, as in the version matrix's Debian roots (test/versions); "jobcap_deps chaos" for those
# and the chaos harness (Debian's psycopg, Node.js), which the roots also run; "jobcap_deps
# failover" for the chaos harness's and pg_auto_failover (test/failover).
jobcap_deps() {
    local major
    major=$(jobcap_major)
    local want=(postgresql-"$major" postgresql-server-dev-"$major" libipc-run-perl g++ make)
    local missing=()
    # The PGXS suites too: TAP's 190_cancel_push runs real Python and Node workers.
    if [ "${1:-}" = chaos ] || [ "${1:-}" = failover ] || [ "${1:-}" = pgxs ]; then
        want+=(python3-psycopg)
        [ "${1:-}" = failover ] && want+=(pg-auto-failover-cli postgresql-"$major"-auto-failover)
        command -v node >/dev/null && command -v npm >/dev/null || want+=(nodejs npm)
    elif [ "${1:-}" != pgxs ]; then
        want+=(cmake libgtest-dev python3-psycopg clang-format python3-venv python3-pip
               python3-setuptools python3-wheel python3-celery python3-kombu python3-django
               python3-django-q python3-psycopg2 python3-pytest python3-pytest-django chromium
               chromium-driver python3-selenium redis-server python3-redis python3-croniter pgbouncer
               pg-auto-failover-cli postgresql-"$major"-auto-failover)
        # Node.js may come from elsewhere (nodesource); Debian's packages only when there is none.
        command -v node >/dev/null && command -v npm >/dev/null || want+=(nodejs npm)
    fi
    for p in "${want[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ]; then
        say "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; } \
            || die "apt-get install ${missing[*]} failed"
    else
        die "missing packages: ${missing[*]} (sudo apt-get install ${missing[*]})"
    fi
}

# pg_config's directories, or the end of the run: an empty one would copy "/." (pg_config fails
# without a working directory, and a function called in "cmd || ..." runs without set -e).
pg_dirs_known() {
    local d
    for d in "$@"; do
        [ -n "$d" ] && [ "$d" != / ] && [ -d "$d" ] || die "pg_config gave no usable directory ('$d')"
    done
}

# pg_private_copy DEST BINDIR LIBDIR SHAREDIR: a private copy of a PostgreSQL installation under
# DEST (emptied first), as PostgreSQL's own "make check" makes one: binaries are hard links (or
# copies across file systems: PostgreSQL finds its lib and share directories relative to its own
# executable), everything else symbolic links, so that an extension installed into it with
# DESTDIR=DEST is found and nothing is installed system-wide.
pg_private_copy() {
    local dest=$1 bindir=$2 libdir=$3 sharedir=$4
    pg_dirs_known "$bindir" "$libdir" "$sharedir"
    rm -rf "$dest"
    mkdir -p "$dest$bindir" "$dest$libdir" "$dest$sharedir"
    cp -al "$bindir/." "$dest$bindir/" 2>/dev/null || cp -a "$bindir/." "$dest$bindir/"
    cp -as "$libdir/." "$dest$libdir/"
    cp -as "$sharedir/." "$dest$sharedir/"
}

# The private copy (pg_private_copy) with jobcap installed into it: two checkouts never share
# an installed jobcap.so.
jobcap_tmp_install() {
    local bindir sharedir libdir dest
    bindir=$($PG_CONFIG --bindir); sharedir=$($PG_CONFIG --sharedir); libdir=$($PG_CONFIG --pkglibdir)
    pg_dirs_known "$bindir" "$libdir" "$sharedir"
    dest=$BUILD/tmp_install
    [ -x "$dest$bindir/postgres" ] || pg_private_copy "$dest" "$bindir" "$libdir" "$sharedir"
    make -C "$JOBCAP_ROOT" -s install DESTDIR="$dest" PG_CONFIG="$PG_CONFIG" >/dev/null
    TMP_BINDIR=$dest$bindir
    export PATH="$TMP_BINDIR:$PATH"
}

# Runs a command as a user initdb accepts: ourselves, or postgres when we are root.
as_tester() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- env PATH="$PATH" "$@"
    else
        "$@"
    fi
}

# A directory the tester can write.
tester_dir() {
    rm -rf "$1"; mkdir -p "$1"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$1"
    return 0
}

# Installs a Node package's dependencies from its lock file (npm ci), only when the lock file
# changed since the last install: a warm node_modules needs no registry. When npm cannot reach
# the registry but node_modules is complete for the lock file, we carry on with it.
node_modules() {
    local dir=$1
    command -v node >/dev/null && command -v npm >/dev/null || { echo "node and npm are needed" >&2; return 1; }
    if [ -f "$dir/node_modules/.package-lock.json" ] && [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ]; then
        return 0
    fi
    (cd "$dir" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error) && return 0
    [ -f "$dir/node_modules/.package-lock.json" ] && { echo "npm ci failed; using the existing node_modules" >&2; return 0; }
    return 1
}

# A python3 that has psycopg (Debian's python3-psycopg clang-format): the system one when PATH leads elsewhere.
fuzz_python() {
    local p
    for p in python3 /usr/bin/python3; do
        as_tester "$p" -c 'import psycopg' 2>/dev/null && { echo "$p"; return 0; }
    done
    die "no python3 with psycopg (apt-get install python3-psycopg clang-format)"
}

# The system's pg_config, found before jobcap_tmp_install puts its private copy first on PATH
# (that copy reports paths inside the private install).
JOBCAP_SYSTEM_PG_CONFIG=$(command -v "$PG_CONFIG" 2>/dev/null || echo "$PG_CONFIG")

# A copy of the sources built with SANITIZE=$2 under $BUILD/$1, installed into a private install
# of its own (as jobcap_tmp_install does), so the ordinary build is left alone. Sets SAN_BINDIR.
# $3, a pg_config, builds against another PostgreSQL (the pg_upgrade test's older major).
jobcap_sanitized_install() {
    local kind=$1 flags=$2 bindir sharedir libdir pgc=${3:-$JOBCAP_SYSTEM_PG_CONFIG}
    local src=$BUILD/$kind/src dest=$BUILD/$kind/tmp_install
    bindir=$($pgc --bindir); sharedir=$($pgc --sharedir); libdir=$($pgc --pkglibdir)
    pg_dirs_known "$bindir" "$libdir" "$sharedir"
    mkdir -p "$src"
    # Sources only (their times kept, so an unchanged file is not rebuilt); never our objects.
    (cd "$JOBCAP_ROOT" && tar cf - --exclude='*.o' --exclude='*.d' --exclude='*.so' --exclude='*.bc' \
        Makefile jobcap.control sql src) | (cd "$src" && tar xf -)
    # Header dependencies are tracked (-MMD); a change of flags rebuilds everything.
    if [ "$(cat "$src/.sanitize" 2>/dev/null)" != "$flags" ]; then
        rm -f "$src"/src/*.o "$src"/src/*/*.o "$src"/*.so
        echo "$flags" > "$src/.sanitize"
    fi
    make -C "$src" -s SANITIZE="$flags" PG_CONFIG="$pgc" >/dev/null
    [ -x "$dest$bindir/postgres" ] || pg_private_copy "$dest" "$bindir" "$libdir" "$sharedir"
    make -C "$src" -s install DESTDIR="$dest" SANITIZE="$flags" PG_CONFIG="$pgc" >/dev/null
    SAN_BINDIR=$dest$bindir
}
