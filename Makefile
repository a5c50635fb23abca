# jobcap, built with PGXS against the server headers of the pg_config on PATH (or PG_CONFIG=...).
#   make / make install        build and install into that PostgreSQL
#   make installcheck          pg_regress, isolation and TAP suites on throwaway instances
#   make test                  everything: unit, installcheck, clients, chaos, fuzz, sanitizers
#   make matrix                regress, isolation and TAP on PostgreSQL 17 and 18 (MATRIX="15 17 18"),
#                              each in a cached Debian root (test/versions; as root)
#   make demo                  a throwaway cluster with jobcap preloaded, and a demonstration
#   make bench                 jobcap beside a hand-written queue (pgbench; ~50 min, not in test)
#   make format                clang-format every C++ source (make format-check: check only)

EXTENSION  = jobcap
MODULE_big = jobcap

# The one list of sources: every .cpp under src/. The tiers are directories:
#   src/            the front door (module magic, GUCs) and the C++/ereport boundary
#   src/functions/  SQL-callable functions, one file per family
#   src/background/ the launcher and the per-database reaper
#   src/spi/        statements prepared once, argument readers, access checks, errors
#   src/core/       pure C++ without PostgreSQL headers (CMakeLists.txt builds it for CTest)
SRCS = $(sort $(wildcard $(srcdir)/src/*.cpp $(srcdir)/src/*/*.cpp))
OBJS = $(patsubst $(srcdir)/%.cpp,%.o,$(SRCS))

DATA = $(wildcard $(srcdir)/sql/jobcap--*.sql)

# Tests live under test/, as pgvector keeps them: test/sql + test/expected (pg_regress),
# test/isolation (pg_isolation_regress), test/t (TAP). Each suite gets a throwaway instance.
REGRESS = lifecycle poison fencing dedupe caps history manage bad_input batch transactions plans \
          stats stats_scale no_preload privileges hijack hostile_input install hot
REGRESS_OPTS = --inputdir=$(srcdir)/test --temp-instance=tmp_check_regress \
               --temp-config=$(srcdir)/test/regress.conf --load-extension=jobcap
ISOLATION = claim_race reap_vs_complete stale_cohort double_reap same_worker_reclaim \
            assert_fence_holds claim_by_id_race claim_recheck notify_coalesce enqueue_vs_drop \
            refresh_race stats_late_commit
ISOLATION_OPTS = --inputdir=$(srcdir)/test/isolation --temp-instance=tmp_check_iso_instance \
                 --temp-config=$(srcdir)/test/regress.conf --load-extension=jobcap
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl
EXTRA_CLEAN = $(OBJS:.o=.d) results output_iso tmp_check tmp_check_regress tmp_check_iso_instance \
              regression.diffs regression.out build

PG_CONFIG ?= pg_config

# SANITIZE=undefined (or address,undefined): instrument jobcap with gcc's sanitizers; every
# finding aborts the backend. -fno-wrapv undoes PostgreSQL's -fwrapv for jobcap's own code, so
# that a signed overflow there is a finding too (make sanitize; see test/lib.sh).
ifdef SANITIZE
SANITIZE_FLAGS = -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer -g -fno-wrapv
endif

# C++17 with every warning an error. -MMD -MP writes each object's header dependencies beside it
# (src/x.d), included below, so a changed header rebuilds every object that includes it.
PG_CPPFLAGS = -I$(srcdir)/src
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Werror -Wno-register -Wno-missing-field-initializers \
              -fno-omit-frame-pointer -MMD -MP $(SANITIZE_FLAGS)
SHLIB_LINK += -lstdc++ $(SANITIZE_FLAGS)

# Debian's PGXS wants LLVM bitcode (built with clang) of every object for JIT inlining. jobcap's
# functions are called, never inlined into plans: no bitcode, no clang. Set before the include,
# which decides its targets as it is read.
override with_llvm = no

PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
# Server headers are system headers: their C idioms do not count against -Werror.
override CPPFLAGS := -isystem $(includedir_server) $(CPPFLAGS)
# JobcapTest.pm sits beside the TAP tests.
PG_PROVE_FLAGS += -I $(srcdir)/test/t
-include $(OBJS:.o=.d)
else
all install installcheck:
	@echo "PostgreSQL server headers not found for '$(PG_CONFIG)': apt-get install postgresql-server-dev-15"; exit 1
endif

.PHONY: test demo unit bench bench-quick bench-profile sanitize format format-check matrix
test:
	test/run
MATRIX ?= 17 18
matrix:
	test/versions/run $(MATRIX)
sanitize:
	test/run ubsan asan
unit:
	test/run unit
demo:
	test/demo
bench:
	bench/run
bench-quick:
	bench/run --quick
bench-profile:
	bench/profile

CXX_FILES = $(SRCS) $(wildcard $(srcdir)/src/*.hpp $(srcdir)/src/*/*.hpp $(srcdir)/test/unit/*.cpp)
format:
	clang-format -i $(CXX_FILES)
format-check:
	clang-format --dry-run --Werror $(CXX_FILES)

# test/run reads the suite lists from here: make -s print-REGRESS
print-%:
	@echo $($*)
