// Reading SQL arguments: each reader applies the rules of src/core/rules.hpp and raises the
// matching error. A NULL is accepted only where the SQL signature's default is NULL.
#pragma once

#include "pg.hpp"

#include "core/rules.hpp"

namespace jobcap {

struct NameArg {
    Datum datum;       // the text, ready to bind as an SPI parameter
    const char* cstr;  // the same, NUL-terminated, for messages
};

NameArg arg_queue(FunctionCallInfo fcinfo, int n);
NameArg arg_worker(FunctionCallInfo fcinfo, int n);
NameArg arg_schedule(FunctionCallInfo fcinfo, int n);  // a schedule's name

// A required positive integer, at most max.
int32 arg_count(FunctionCallInfo fcinfo, int n, const char* what, int64 max);

// An optional positive integer, at most max: false when NULL.
bool arg_count_opt(FunctionCallInfo fcinfo, int n, const char* what, int64 max, int32* out);

// A job id: required, positive.
int64 arg_job_id(FunctionCallInfo fcinfo, int n);

// A fence: required (any value; a fence that was never issued is simply not current).
int64 arg_fence(FunctionCallInfo fcinfo, int n);

// An interval that jobcap adds to a time (a lease, a retry delay, a backoff): no months, days
// and time of one sign, positive (or >= 0 when allow_zero) and at most ten years
// (core::check_added_span). When optional, a NULL gives *is_null = true and returns 0.
Datum arg_span(FunctionCallInfo fcinfo, int n, const char* what, bool allow_zero, bool optional,
               bool* is_null);

// An interval as the pure core measures it: the one reader of PostgreSQL's Interval.
core::Span span_of(const Interval* interval);

// A required interval used only for its length (a month counts 30 days): at least zero and at
// most ten years (core::check_span).
core::Span arg_length(FunctionCallInfo fcinfo, int n, const char* what);

// Text kept in a job's history (an error, a requeue reason): at most jobcap.max_error_bytes,
// cut at a character boundary and marked.
Datum kept_text(text* value);

// A jsonb payload: at most jobcap.max_payload_bytes (54000 otherwise).
Datum arg_payload(FunctionCallInfo fcinfo, int n);

// A job's output as kept (jobs.output): the value itself when it is at most
// jobcap.max_output_bytes, else the valid jsonb {"truncated": true, "bytes": n}.
Datum kept_output(Datum output);

// A required argument with no rule beyond "not null".
Datum arg_required(FunctionCallInfo fcinfo, int n, const char* what);

}  // namespace jobcap
