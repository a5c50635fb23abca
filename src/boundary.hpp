// The one place where C++ meets PostgreSQL's error handling. How the boundary is kept:
//
//  * ereport(ERROR) is a longjmp. It must never jump over a C++ destructor or out of a catch
//    block. So every frame between an SQL entry point and a PostgreSQL call (SPI, palloc,
//    ereport, CHECK_FOR_INTERRUPTS) holds plain data only: no std::string, no smart pointer,
//    no RAII guard. Those frames are in every file outside src/core; they use PostgreSQL's own
//    memory and containers (test/unit/source_rules.py checks that they name no owning C++ type).
//  * C++ exceptions can come only from the pure core (src/core), which never calls PostgreSQL
//    and never holds PostgreSQL memory. Its results are plain values (see core/rules.hpp).
//  * Every SQL-callable function body runs inside guard() (JOBCAP_FUNCTION puts it there), which
//    catches every C++ exception, copies its message into a fixed buffer, leaves the catch block,
//    and only then reports it with ereport. No exception can reach a PostgreSQL frame, and no
//    longjmp starts inside a catch block.
#pragma once

#include "pg.hpp"

#include <cstdint>
#include <cstdio>
#include <exception>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "spi/access.hpp"

// JOBCAP_FUNCTION(name, duty) { ... } defines the SQL-callable function jobcap.name: its C
// symbol jobcap_name, PostgreSQL's function info, the exception boundary (guard, below) and the
// caller check (admit, spi/access.hpp) for the given Duty. The body that follows sees
// `fcinfo`, `function` (the SQL name, for messages) and `access` (what admit decided):
//
//     JOBCAP_FUNCTION(cancel_job, Duty::operator_)
//     {
//         int64 job_id = arg_job_id(fcinfo, 0);
//         ...
//     }
#if !defined(__SANITIZE_ADDRESS__)
#define JOBCAP_ENTRY_ATTRIBUTES
#define JOBCAP_ENTRY_PROLOGUE
#else
// AddressSanitizer build (make sanitize): ASan's runtime comes with this library and its
// interceptors are not loaded (see jobcap.cpp), so nobody tells it when an ereport longjmps
// over instrumented frames: their redzones stay poisoned on the stack and trip the next call
// that lays its frames there. An uninstrumented entry clears the stack below it first, as ASan's
// longjmp interceptor would have, then calls enter() (instrumented, in its own frame below the
// cleared line: nothing instrumented touches the entry's own frame), whose redzones are fresh.
namespace jobcap {
__attribute__((no_sanitize_address, noinline)) inline void asan_forget_stale_frames()
{
    constexpr uintptr_t kBelow = 1024 * 1024;
    char here;
    uintptr_t sp = reinterpret_cast<uintptr_t>(&here);
    __asan_unpoison_memory_region(reinterpret_cast<void*>(sp - kBelow), kBelow);
}
}  // namespace jobcap
#define JOBCAP_ENTRY_ATTRIBUTES __attribute__((no_sanitize_address, noinline))
#define JOBCAP_ENTRY_PROLOGUE jobcap::asan_forget_stale_frames()
#endif

#define JOBCAP_FUNCTION(name, duty)                                                                \
    static Datum name##_body(FunctionCallInfo fcinfo, const char* function,                        \
                             jobcap::Access& access);                                              \
    extern "C" {                                                                                   \
    PG_FUNCTION_INFO_V1(jobcap_##name);                                                            \
    }                                                                                              \
    extern "C" JOBCAP_ENTRY_ATTRIBUTES Datum jobcap_##name(PG_FUNCTION_ARGS)                       \
    {                                                                                              \
        JOBCAP_ENTRY_PROLOGUE;                                                                     \
        return jobcap::enter(fcinfo, #name, duty, name##_body);                                    \
    }                                                                                              \
    static Datum name##_body([[maybe_unused]] FunctionCallInfo fcinfo,                             \
                             [[maybe_unused]] const char* function,                                \
                             [[maybe_unused]] jobcap::Access& access)

namespace jobcap {

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

// The body of an entry point, as JOBCAP_FUNCTION declares it.
using EntryBody = Datum (*)(FunctionCallInfo fcinfo, const char* function, Access& access);

// Runs an entry point's body inside guard(), after admit() has checked its caller for `duty`.
// Defined out of line (boundary.cpp): its frame is always its own, below the entry's.
Datum enter(FunctionCallInfo fcinfo, const char* function, Duty duty, EntryBody body);

}  // namespace jobcap
