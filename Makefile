# jobcap: built with PGXS against the server headers of the pg_config on PATH (PostgreSQL 15).
#   make / make install        build and install into that PostgreSQL
#   make installcheck          pg_regress suites against a throwaway instance (--temp-instance)
#   make test                  everything: unit tests, regress, isolation, TAP, clients, chaos --short (test/run)
#   make demo                  a throwaway cluster with jobcap preloaded, and a demonstration
#   make bench                 jobcap beside a hand-written queue, pgbench, one table (~50 min;
#                              not part of make test); make bench-quick is a short smoke run

EXTENSION  = jobcap
EXTVERSION = 0.1.0
MODULE_big = jobcap

CORE_SRCS = src/core/backoff.cpp src/core/rules.cpp src/core/order.cpp src/core/report.cpp \
            src/core/stats.cpp
PG_SRCS   = src/jobcap.cpp src/plans.cpp src/args.cpp src/errors.cpp src/backoff.cpp \
            src/queues.cpp src/enqueue.cpp src/claim.cpp src/settle.cpp src/reap.cpp \
            src/manage.cpp src/statements.cpp src/worker.cpp src/launcher.cpp \
            src/access.cpp src/grants.cpp src/stats.cpp src/metrics.cpp src/deadletter.cpp
OBJS = $(PG_SRCS:.cpp=.o) $(CORE_SRCS:.cpp=.o)

DATA = $(wildcard sql/jobcap--*.sql)

REGRESS = lifecycle poison fencing dedupe caps history manage bad_input batch transactions plans \
          stats stats_scale no_preload privileges hijack hostile_input install hot
# pg_regress inputs are sql/<test>.sql, expected outputs expected/<test>.out.
REGRESS_OPTS = --temp-instance=build/installcheck/regress --temp-config=test/regress.conf \
               --load-extension=jobcap
ISOLATION = claim_race reap_vs_complete stale_cohort double_reap same_worker_reclaim \
            assert_fence_holds claim_by_id_race claim_recheck notify_coalesce enqueue_vs_drop \
            refresh_race stats_late_commit
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=build/installcheck/isolation \
                 --temp-instance=build/installcheck/isolation/instance \
                 --temp-config=test/regress.conf --load-extension=jobcap

PG_CONFIG ?= pg_config

# SANITIZE=undefined (or address,undefined): instrument jobcap with gcc's sanitizers; every
# finding aborts the backend. -fno-wrapv undoes PostgreSQL's -fwrapv for jobcap's own code, so
# that a signed overflow there is a finding too. `make sanitize` builds a copy that way and runs the regress and
# isolation suites and a short fuzz against it (test/run ubsan asan; see test/lib.sh).
ifdef SANITIZE
SANITIZE_FLAGS = -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer -g -fno-wrapv
endif

# C++17 with every warning an error. The server headers are system headers (-isystem) so their
# C idioms do not count against us.
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Werror -Wno-register -Wno-missing-field-initializers \
              -fno-omit-frame-pointer $(SANITIZE_FLAGS)
SHLIB_LINK += -lstdc++ $(SANITIZE_FLAGS)

# Debian's PGXS wants LLVM bitcode for JIT inlining of every object. jobcap's functions are
# called, not inlined into plans, so we build no bitcode and need no clang. (Set before the
# include: pgxs.mk decides its targets as it is read.)
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
override CPPFLAGS := -isystem $(includedir_server) $(CPPFLAGS)
else
# No server headers yet: `make test` and `make demo` install them (as root) before building.
all install installcheck:
	@echo "PostgreSQL 15 server headers not found: apt-get install postgresql-server-dev-15"; exit 1
endif

.PHONY: test demo unit bench bench-quick bench-profile sanitize
test:
	test/run
sanitize:
	test/run ubsan asan
demo:
	test/demo
bench:
	test/bench/run
bench-quick:
	test/bench/run --quick
bench-profile:
	test/bench/profile
unit:
	test/run unit

# test/run reads the suite lists from here: make -s print-REGRESS
print-%:
	@echo $($*)
