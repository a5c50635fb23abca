// The front door: module magic, settings, and (when preloaded) the background worker.
#include "pg.hpp"

#include "jobcap.hpp"
#include "background/worker.hpp"
#include "housekeeping/rollbacks.hpp"
#include "housekeeping/stats.hpp"

extern "C" {
PG_MODULE_MAGIC;
void _PG_init(void);
}

namespace jobcap {

int guc_error_history = 10;
int guc_max_error_bytes = 2048;
int guc_default_max_attempts = 10;
int guc_max_payload_bytes = 1024 * 1024;
int guc_max_output_bytes = 64 * 1024;
int guc_hot_path = kHotPathDirect;

char* guc_database = nullptr;
int guc_reap_interval_ms = 1000;
int guc_report_interval_s = 60;
int guc_succeeded_retention_s = 86400;
int guc_dead_retention_s = 0;
bool guc_vacuum = true;

}  // namespace jobcap

#if defined(__SANITIZE_ADDRESS__)
// Built with AddressSanitizer (make sanitize): the runtime comes in with this library, after
// postgres started, because preloading it into the postmaster deadlocks PostgreSQL 15's startup
// on Debian 12 (glibc's bindtextdomain). The backend's environment is overwritten by its
// process title, so ASAN_OPTIONS cannot reach it: the options live here. Without its
// interceptors ASan checks jobcap's own stack and globals, not the heap.
extern "C" const char* __asan_default_options()
{
    return "verify_asan_link_order=0:detect_leaks=0:abort_on_error=1:halt_on_error=1";
}
#endif

extern "C" void _PG_init(void)
{
    DefineCustomIntVariable("jobcap.error_history",
                            "Sets how many failed attempts are kept in each job's error history.",
                            "Older entries are deleted when a new one is written; 0 keeps none.",
                            &jobcap::guc_error_history, 10, 0, 1000, PGC_SUSET, 0, nullptr, nullptr,
                            nullptr);
    DefineCustomIntVariable(
        "jobcap.max_error_bytes", "Sets the longest error text kept per failed attempt.",
        "Longer texts are cut at a character boundary and marked.", &jobcap::guc_max_error_bytes,
        2048, 64, 1024 * 1024, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("jobcap.default_max_attempts",
                            "Sets the attempt cap of queues created without one.", nullptr,
                            &jobcap::guc_default_max_attempts, 10, 1, 1000000, PGC_USERSET, 0,
                            nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "jobcap.max_payload_bytes",
        "Sets the largest job payload that enqueue_job and enqueue_jobs accept.",
        "Measured as the jsonb value before compression. Only superusers can change it.",
        &jobcap::guc_max_payload_bytes, 1024 * 1024, 1024, 256 * 1024 * 1024, PGC_SUSET,
        GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "jobcap.max_output_bytes", "Sets the largest job output that complete_job keeps.",
        "Measured as the jsonb value before compression. A larger output is replaced by "
        "{\"truncated\": true, \"bytes\": n}. Only superusers can change it.",
        &jobcap::guc_max_output_bytes, 64 * 1024, 64, 256 * 1024 * 1024, PGC_SUSET, GUC_UNIT_BYTE,
        nullptr, nullptr, nullptr);
    static const struct config_enum_entry hot_paths[] = {
        {"direct", jobcap::kHotPathDirect, false},
        {"sql", jobcap::kHotPathSql, false},
        {nullptr, 0, false},
    };
    DefineCustomEnumVariable(
        "jobcap.hot_path", "Sets how claims and settles change jobcap.jobs.",
        "direct: without SQL statements, through the table and its indexes (the default); "
        "sql: through jobcap's SQL statements, the reference. REPEATABLE READ and SERIALIZABLE "
        "transactions, and a jobs table with triggers or row security, always use sql.",
        &jobcap::guc_hot_path, jobcap::kHotPathDirect, hot_paths, PGC_USERSET, 0, nullptr, nullptr,
        nullptr);

    // The worker's settings exist in every backend, so SHOW and pg_settings tell the truth, but
    // only a preloaded jobcap starts the launcher and its reapers.
    DefineCustomStringVariable("jobcap.database",
                               "Sets the databases the jobcap background workers serve.",
                               "A comma-separated list of database names, one reaper each, or * "
                               "for every database that has the extension. Used only with "
                               "jobcap in shared_preload_libraries.",
                               &jobcap::guc_database, "postgres", PGC_SIGHUP, GUC_LIST_INPUT,
                               jobcap::check_database, nullptr, nullptr);
    DefineCustomIntVariable(
        "jobcap.reap_interval", "Sets how often the background worker reaps expired leases.",
        "Each cycle also prunes finished jobs past their retention.", &jobcap::guc_reap_interval_ms,
        1000, 10, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("jobcap.report_interval",
                            "Sets how often the background worker may log a line per queue.",
                            "A line is written only for a queue that got worse: new dead jobs, "
                            "attempts lost to crashes, or a growing backlog.",
                            &jobcap::guc_report_interval_s, 60, 1, 7 * 86400, PGC_SIGHUP,
                            GUC_UNIT_S, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("jobcap.succeeded_retention",
                            "Sets how long succeeded jobs are kept before the background worker "
                            "deletes them.",
                            "0 keeps them forever.", &jobcap::guc_succeeded_retention_s, 86400, 0,
                            INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("jobcap.dead_retention",
                            "Sets how long dead and cancelled jobs are kept before the background "
                            "worker deletes them.",
                            "0 (the default) keeps them forever.", &jobcap::guc_dead_retention_s, 0,
                            0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
    DefineCustomBoolVariable(
        "jobcap.vacuum",
        "Lets the background worker vacuum jobcap.jobs between autovacuum's visits.",
        "Every jobcap.reap_interval the worker applies autovacuum's threshold for jobcap.jobs and "
        "vacuums the table when it is crossed, instead of waiting for autovacuum_naptime: claims "
        "step over the index entries of every job claimed since the last vacuum. Off, or with "
        "autovacuum off for the server or the table, only autovacuum vacuums it.",
        &jobcap::guc_vacuum, true, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
    jobcap::define_stats_settings();
    MarkGUCPrefixReserved("jobcap");

    // Rolled-back claims: noted in every backend, counted when preloaded (shared memory).
    jobcap::install_rollback_tracking();

    if (process_shared_preload_libraries_in_progress) {
        jobcap::register_launcher();
        jobcap::install_ddl_hooks();
    }
}
