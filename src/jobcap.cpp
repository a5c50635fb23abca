// The front door: module magic, settings, and (when preloaded) the background worker.
#include "pg.hpp"

#include "jobcap.hpp"

extern "C" {
PG_MODULE_MAGIC;
void _PG_init(void);
}

namespace jobcap {

int guc_error_history = 10;
int guc_max_error_bytes = 2048;
int guc_default_max_attempts = 10;
int guc_max_payload_bytes = 1024 * 1024;

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
                            &jobcap::guc_error_history, 10, 0, 1000, PGC_SUSET, 0, nullptr,
                            nullptr, nullptr);
    DefineCustomIntVariable("jobcap.max_error_bytes",
                            "Sets the longest error text kept per failed attempt.",
                            "Longer texts are cut at a character boundary and marked.",
                            &jobcap::guc_max_error_bytes, 2048, 64, 1024 * 1024, PGC_SUSET,
                            GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("jobcap.default_max_attempts",
                            "Sets the attempt cap of queues created without one.",
                            nullptr, &jobcap::guc_default_max_attempts, 10, 1, 1000000,
                            PGC_USERSET, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("jobcap.max_payload_bytes",
                            "Sets the largest job payload that enqueue_job and enqueue_jobs accept.",
                            "Measured as the jsonb value before compression. Only superusers can change it.",
                            &jobcap::guc_max_payload_bytes, 1024 * 1024, 1024, 256 * 1024 * 1024,
                            PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
    MarkGUCPrefixReserved("jobcap");
}
