// The one place where C++ meets PostgreSQL's error handling. How the boundary is kept:
//
//  * ereport(ERROR) is a longjmp. It must never jump over a C++ destructor or out of a catch
//    block. So every frame between an SQL entry point and a PostgreSQL call (SPI, palloc,
//    ereport, CHECK_FOR_INTERRUPTS) holds plain data only: no std::string, no smart pointer,
//    no RAII guard. Those frames are the src/*.cpp files; they use PostgreSQL's own memory and
//    containers.
//  * C++ exceptions can come only from the pure core (src/core), which never calls PostgreSQL
//    and never holds PostgreSQL memory. Its results are plain values (see core/rules.hpp).
//  * Every SQL-callable function body runs inside JOBCAP_GUARD, which catches every C++
//    exception, copies its message into a fixed buffer, leaves the catch block, and only then
//    reports it with ereport. No exception can reach a PostgreSQL frame, and no longjmp starts
//    inside a catch block.
#pragma once

#include "pg.hpp"

#include <cstdint>
#include <cstdio>
#include <exception>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "core/rules.hpp"

// SQL-visible C functions: PostgreSQL finds them by their C names.
#if !defined(__SANITIZE_ADDRESS__)
#define JOBCAP_FUNCTION(name)                \
    extern "C" {                             \
    PG_FUNCTION_INFO_V1(name);               \
    }                                        \
    extern "C" Datum name(PG_FUNCTION_ARGS)
#else
// AddressSanitizer build (make sanitize): ASan's runtime comes with this library and its
// interceptors are not loaded (see jobcap.cpp), so nobody tells it when an ereport longjmps
// over instrumented frames: their redzones stay poisoned on the stack and trip the next call
// that lays its frames there. An uninstrumented entry clears the stack below it first, as ASan's
// longjmp interceptor would have, then calls the instrumented body, whose redzones are fresh.
namespace jobcap {
__attribute__((no_sanitize_address, noinline)) inline void asan_forget_stale_frames()
{
    constexpr uintptr_t kBelow = 1024 * 1024;
    char here;
    uintptr_t sp = reinterpret_cast<uintptr_t>(&here);
    __asan_unpoison_memory_region(reinterpret_cast<void*>(sp - kBelow), kBelow);
}
}  // namespace jobcap
#define JOBCAP_FUNCTION(name)                                                                  \
    extern "C" {                                                                               \
    PG_FUNCTION_INFO_V1(name);                                                                 \
    }                                                                                          \
    __attribute__((noinline)) static Datum name##_body(FunctionCallInfo fcinfo);               \
    extern "C" __attribute__((no_sanitize_address, noinline)) Datum name(PG_FUNCTION_ARGS)     \
    {                                                                                          \
        jobcap::asan_forget_stale_frames();                                                    \
        return name##_body(fcinfo);                                                            \
    }                                                                                          \
    static Datum name##_body(FunctionCallInfo fcinfo)
#endif

namespace jobcap {

// The stale-fence SQLSTATE: the caller's lease on the job is no longer current.
constexpr int kStaleFence = MAKE_SQLSTATE('J', 'C', '0', '0', '1');

// Runs body() and turns any C++ exception into an ordinary PostgreSQL error after the C++
// frames are gone. body must follow the plain-data rule above.
template <typename Body>
Datum guard(const char* function, Body&& body)
{
    char message[256];
    bool failed = false;

    try {
        return body();
    } catch (const std::exception& e) {
        snprintf(message, sizeof message, "%s", e.what());
        failed = true;
    } catch (...) {
        snprintf(message, sizeof message, "unknown C++ exception");
        failed = true;
    }
    if (failed)
        ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                        errmsg("internal error in jobcap.%s: %s", function, message)));
    pg_unreachable();
}

// Reports a rule broken by an argument, as decided by the pure core.
[[noreturn]] void raise(const core::Problem& problem);

struct Access;

// Raises the stale-fence error for job_id, explaining from the job's current row why the
// given fence is no longer current; raises "does not exist" when there is no such job, and
// 42501 when the caller may not work the job's queue (or, unprivileged, when there is no job).
[[noreturn]] void raise_not_current(const Access& access, const char* function, int64 job_id,
                                    int64 fence);

// Raises 42704 for a job that does not exist.
[[noreturn]] void raise_unknown_job(int64 job_id);

// Raises 42704 for a queue that does not exist.
[[noreturn]] void raise_unknown_queue(const char* queue);

}  // namespace jobcap
