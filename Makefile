# jobcap, built with PGXS against the server headers of the pg_config on PATH (or PG_CONFIG=...).
#   make / make install        build and install into that PostgreSQL
#   make check                 the quick loop: format, unit, regress and isolation on both hot paths
#                              (make check TEST=caps runs one test by name; see CONTRIBUTING.md)
#   make installcheck          pg_regress, isolation and TAP suites on throwaway instances
#   make test                  everything: unit, installcheck, clients, chaos, failover, fuzz, sanitizers
#   make matrix                regress, isolation and TAP on PostgreSQL 17 and 18 (MATRIX="15 17 18"),
#                              each in a cached Debian root (test/versions; as root)
#   make demo                  a throwaway cluster with jobcap preloaded, and a demonstration
#   make bench                 jobcap beside a hand-written queue (pgbench; ~50 min, not in test)
#   make format                clang-format every C++ source (make format-check: check only)
#   make deb / make dist       build/postgresql-15-jobcap_<v>-1_amd64.deb / build/jobcap-<v>.zip

EXTENSION  = jobcap
MODULE_big = jobcap

# The one list of sources: every .cpp in src/ and its directories, the tiers that
# docs/architecture.md describes (src/core, pure C++, is also built by CMakeLists.txt for CTest).
SRCS = $(sort $(wildcard $(srcdir)/src/*.cpp $(srcdir)/src/*/*.cpp))
OBJS = $(patsubst $(srcdir)/%.cpp,%.o,$(SRCS))

# Relative to the source directory: PGXS prefixes $(srcdir) itself (a VPATH build).
DATA = $(patsubst $(srcdir)/%,%,$(wildcard $(srcdir)/sql/jobcap--*.sql))

# The test lists are the files: a new suite is picked up by its file alone, a deleted one leaves.
#   sql/<name>.sql + expected/<name>.out   pg_regress (PGXS's own rules, --inputdir=$(srcdir));
#                                          sql/jobcap--*.sql are the install scripts, not tests
#   test/isolation/specs/<name>.spec       pg_isolation_regress (expected: test/isolation/expected)
#   test/t/<name>.pl                       TAP (prove)
# Each kind runs in one throwaway instance, in alphabetical order; every suite also passes alone
# (test/run regress TEST=<name>), so none may lean on what another left behind.
REGRESS = $(filter-out jobcap--%,$(sort $(basename $(notdir $(wildcard $(srcdir)/sql/*.sql)))))
REGRESS_OPTS = --temp-instance=tmp_check_regress --temp-config=$(srcdir)/test/regress.conf \
               --load-extension=jobcap
ISOLATION = $(sort $(basename $(notdir $(wildcard $(srcdir)/test/isolation/specs/*.spec))))
ISOLATION_OPTS = --inputdir=$(srcdir)/test/isolation --temp-instance=tmp_check_iso_instance \
                 --temp-config=$(srcdir)/test/regress.conf --load-extension=jobcap
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl
EXTRA_CLEAN = $(OBJS:.o=.d) results output_iso tmp_check tmp_check_regress tmp_check_iso_instance \
              regression.diffs regression.out build

PG_CONFIG ?= pg_config

# The PostgreSQL majors jobcap supports; older ones are refused at once, before any compiling
# (src/compat.hpp refuses them again, for builds that bypass this Makefile). A newer major that
# is not listed builds, with a warning that it is untested.
JOBCAP_MAJORS = 15 17 18
jobcap_check_major = $(if $(filter-out 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14,$(1)),\
    $(if $(filter $(1),$(JOBCAP_MAJORS)),,\
        $(warning jobcap is tested on PostgreSQL $(JOBCAP_MAJORS_TEXT), not on $(1) ($(2)))),\
    $(error jobcap supports PostgreSQL $(JOBCAP_MAJORS_TEXT); $(2) is PostgreSQL $(1). \
            Install a supported server and its headers (apt-get install postgresql-server-dev-15) \
            and build with PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config))
JOBCAP_MAJORS_TEXT = 15, 17 and 18
PG_MAJOR := $(shell $(PG_CONFIG) --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
ifneq ($(PG_MAJOR),)
$(call jobcap_check_major,$(PG_MAJOR),$(PG_CONFIG))
endif

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
ifeq ($(MAKECMDGOALS),check)
# The quick loop, test/run check: format, unit, and the regress and isolation suites on both hot
# paths; make check TEST=NAME runs one test by name. test/run builds with a make of its own, so
# this one does not read PGXS, whose own check target only says that it is not supported.
.PHONY: check
check:
	test/run check $(if $(TEST),TEST="$(TEST)")
else ifneq ($(wildcard $(PGXS)),)
ifneq ($(filter check,$(MAKECMDGOALS)),)
$(error make check runs alone, and builds what it tests: make check [TEST=name])
endif
include $(PGXS)
# The same check against the headers' own Makefile.global, when it names another major.
ifneq ($(MAJORVERSION),$(PG_MAJOR))
$(call jobcap_check_major,$(MAJORVERSION),the PGXS of $(PG_CONFIG))
endif
# Server headers are system headers: their C idioms do not count against -Werror.
override CPPFLAGS := -isystem $(includedir_server) $(CPPFLAGS)
# JobcapTest.pm sits beside the TAP tests.
PG_PROVE_FLAGS += -I $(srcdir)/test/t
-include $(OBJS:.o=.d)
# A VPATH build (pg_buildext, make -f .../Makefile VPATH=...) writes objects into a tree of its
# own: make its directories first (absolute names, which make does not look up through VPATH).
OBJ_DIRS = $(patsubst %/,%,$(sort $(addprefix $(CURDIR)/,$(dir $(OBJS)))))
$(OBJS): | $(OBJ_DIRS)
$(OBJ_DIRS):
	mkdir -p $@
else
all install installcheck:
	@echo "PostgreSQL server headers not found for '$(PG_CONFIG)': apt-get install postgresql-server-dev-15"; exit 1
endif

.PHONY: test demo unit bench bench-quick bench-profile sanitize format format-check deb dist matrix
test:
	test/run
MATRIX ?= 17 18
matrix:
	test/versions/run $(MATRIX)
# Release artefacts under build/: the Debian package and the PGXN zip (packaging/build).
deb:
	packaging/build deb
dist:
	packaging/build dist
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

# test/run reads the test lists from here (make -s print-REGRESS) to find a test by name.
print-%:
	@echo $($*)
