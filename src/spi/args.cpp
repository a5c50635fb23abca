#include "spi/args.hpp"

#include "spi/errors.hpp"
#include "jobcap.hpp"

extern "C" {
#include "access/detoast.h"
}

namespace jobcap {
namespace {

NameArg arg_name(FunctionCallInfo fcinfo, int n, const char* what, std::size_t max_bytes)
{
    bool is_null = PG_ARGISNULL(n);
    NameArg arg = {0, nullptr};
    if (!is_null) {
        text* t = PG_GETARG_TEXT_PP(n);
        arg.datum = PointerGetDatum(t);
        std::size_t len = VARSIZE_ANY_EXHDR(t);
        // Check the length before copying, so a huge name costs nothing.
        core::Problem p = core::check_name(what, VARDATA_ANY(t), len, max_bytes, false);
        if (p)
            raise_problem(p);
        arg.cstr = text_to_cstring(t);
        return arg;
    }
    raise_problem(core::check_name(what, nullptr, 0, max_bytes, true));
}

}  // namespace

NameArg arg_queue(FunctionCallInfo fcinfo, int n)
{
    return arg_name(fcinfo, n, "queue", core::kMaxQueueName);
}

NameArg arg_schedule(FunctionCallInfo fcinfo, int n)
{
    return arg_name(fcinfo, n, "name", core::kMaxQueueName);
}

NameArg arg_worker(FunctionCallInfo fcinfo, int n)
{
    return arg_name(fcinfo, n, "worker", core::kMaxWorkerName);
}

int32 arg_count(FunctionCallInfo fcinfo, int n, const char* what, int64 max)
{
    bool is_null = PG_ARGISNULL(n);
    int64 value = is_null ? 0 : PG_GETARG_INT32(n);
    core::Problem p = core::check_positive(what, value, max, is_null);
    if (p)
        raise_problem(p);
    return static_cast<int32>(value);
}

bool arg_count_opt(FunctionCallInfo fcinfo, int n, const char* what, int64 max, int32* out)
{
    if (PG_ARGISNULL(n))
        return false;
    *out = arg_count(fcinfo, n, what, max);
    return true;
}

int64 arg_job_id(FunctionCallInfo fcinfo, int n)
{
    bool is_null = PG_ARGISNULL(n);
    int64 value = is_null ? 0 : PG_GETARG_INT64(n);
    core::Problem p = core::check_positive("job_id", value, PG_INT64_MAX, is_null);
    if (p)
        raise_problem(p);
    return value;
}

int64 arg_fence(FunctionCallInfo fcinfo, int n)
{
    core::Problem p = core::check_not_null("fence", PG_ARGISNULL(n));
    if (p)
        raise_problem(p);
    return PG_GETARG_INT64(n);
}

core::Span span_of(const Interval* interval)
{
    core::Span span;
    span.months = interval->month;
    span.days = interval->day;
    span.usec = interval->time;
    return span;
}

namespace {

// Argument n's span; a NULL is an empty one (the checks report the NULL).
core::Span read_span(FunctionCallInfo fcinfo, int n)
{
    return PG_ARGISNULL(n) ? core::Span() : span_of(PG_GETARG_INTERVAL_P(n));
}

}  // namespace

Datum arg_span(FunctionCallInfo fcinfo, int n, const char* what, bool allow_zero, bool optional,
               bool* is_null)
{
    if (PG_ARGISNULL(n) && optional) {
        *is_null = true;
        return (Datum) 0;
    }
    core::Problem p =
        core::check_added_span(what, read_span(fcinfo, n), allow_zero, PG_ARGISNULL(n));
    if (p)
        raise_problem(p);
    if (is_null != nullptr)
        *is_null = false;
    return PG_GETARG_DATUM(n);
}

core::Span arg_length(FunctionCallInfo fcinfo, int n, const char* what)
{
    core::Span span = read_span(fcinfo, n);
    core::Problem p = core::check_span(what, span, true, PG_ARGISNULL(n));
    if (p)
        raise_problem(p);
    return span;
}

Datum kept_text(text* value)
{
    int len = VARSIZE_ANY_EXHDR(value);
    if (len <= guc_max_error_bytes)
        return PointerGetDatum(value);
    int cut = pg_mbcliplen(VARDATA_ANY(value), len, guc_max_error_bytes);
    StringInfoData s;
    initStringInfo(&s);
    appendBinaryStringInfo(&s, VARDATA_ANY(value), cut);
    appendStringInfo(&s, "... [truncated, %d bytes in all]", len);
    return PointerGetDatum(cstring_to_text_with_len(s.data, s.len));
}

Datum arg_payload(FunctionCallInfo fcinfo, int n)
{
    Datum payload = arg_required(fcinfo, n, "payload");
    // The size as stored before compression, read from the header: no detoasting.
    Size size = toast_raw_datum_size(payload) - VARHDRSZ;
    if (size > static_cast<Size>(guc_max_payload_bytes))
        ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                        errmsg("payload is too large (%zu bytes, at most %d)",
                               static_cast<size_t>(size), guc_max_payload_bytes),
                        errhint("Store large data elsewhere and enqueue a reference to it, or "
                                "raise jobcap.max_payload_bytes.")));
    return payload;
}

Datum kept_output(Datum output)
{
    // The size as stored before compression, read from the header: no detoasting.
    Size size = toast_raw_datum_size(output) - VARHDRSZ;
    if (size <= static_cast<Size>(guc_max_output_bytes))
        return output;
    char* marker = psprintf("{\"truncated\": true, \"bytes\": %zu}", static_cast<size_t>(size));
    return DirectFunctionCall1(jsonb_in, CStringGetDatum(marker));
}

Datum arg_required(FunctionCallInfo fcinfo, int n, const char* what)
{
    core::Problem p = core::check_not_null(what, PG_ARGISNULL(n));
    if (p)
        raise_problem(p);
    return PG_GETARG_DATUM(n);
}

}  // namespace jobcap
