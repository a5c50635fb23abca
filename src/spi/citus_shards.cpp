// jobcap's statements retargeted to a shard (citus.hpp): the text of each statement with the
// distributed tables renamed to the routed shard and the reference tables to their shard on this
// node, prepared once per statement and shard and kept.
//
// What a shard lacks is supplied in the text: Citus creates shards without the identity of
// jobs.job_id and job_errors.seq, so an INSERT into either names the column and takes the value
// from the node's own sequence (whose range jobcap.distribute() made this node's); and a claim's
// or requeue's new fence is one whose hash falls in the routed shard (jobcap.shard_fence), so
// that Citus delegates the settles of the job, which it routes by fence, to this shard.
// A statement that writes a reference table cannot run against one node's copy: it is refused.
#include "spi/citus.hpp"

#include "spi/plans.hpp"

extern "C" {
#include "lib/stringinfo.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
}

namespace jobcap::citus {
namespace {

enum class Kind : uint8 { distributed, reference };

// The tables statements name, and where each one's rows are on a node.
struct Table {
    const char* name;
    Kind kind;
    int64 Shard::*shard;      // distributed: the routed shard's; reference: see reference_shard
    const char* id_column;    // an identity column the shard lacks, or nullptr
    const char* id_sequence;  // the sequence it takes its values from
};
constexpr Table kTables[] = {
    {"jobs", Kind::distributed, &Shard::jobs, "job_id", "jobcap.jobs_job_id_seq"},
    {"job_errors", Kind::distributed, &Shard::errors, "seq", "jobcap.job_errors_seq_seq"},
    {"stats_minutes", Kind::distributed, &Shard::minutes, nullptr, nullptr},
    {"stats_latency", Kind::distributed, &Shard::latency, nullptr, nullptr},
    {"queues", Kind::reference, nullptr, nullptr, nullptr},
    {"queue_grants", Kind::reference, nullptr, nullptr, nullptr},
    {"job_schedules", Kind::reference, nullptr, nullptr, nullptr},
};

constexpr const char kFenceCall[] = "nextval('jobcap.fences')";

bool ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Words after which a table name is followed by no alias: the retargeted name gets the table's
// own name as alias, so that columns qualified by it ("jobs.queue") still resolve.
bool ends_table_reference(const char* word, int len)
{
    static const char* const kWords[] = {
        "WHERE",   "SET",       "FOR",    "JOIN",   "LEFT",       "RIGHT",  "FULL",
        "INNER",   "CROSS",     "ON",     "USING",  "ORDER",      "GROUP",  "LIMIT",
        "OFFSET",  "RETURNING", "UNION",  "EXCEPT", "INTERSECT",  "WINDOW", "HAVING",
        "NATURAL", "DEFAULT",   "VALUES", "SELECT", "OVERRIDING", "WITH"};
    for (const char* k : kWords)
        if (static_cast<int>(strlen(k)) == len && pg_strncasecmp(word, k, len) == 0)
            return true;
    return false;
}

bool word_is(const char* word, int len, const char* expected)
{
    return static_cast<int>(strlen(expected)) == len && pg_strncasecmp(word, expected, len) == 0;
}

[[noreturn]] void cannot_retarget(const char* name, const char* why)
{
    elog(ERROR, "jobcap: cannot run statement %s on a shard: %s", name, why);
    pg_unreachable();
}

// The reference tables' shards on this node, read once per backend (they never move: every node
// holds a copy of each).
struct ReferenceShards {
    bool known;
    int64 queues, grants, schedules;
};
ReferenceShards references = {};

int64 reference_shard(const char* table)
{
    if (!references.known) {
        if (SPI_connect() != SPI_OK_CONNECT)
            elog(ERROR, "jobcap: SPI_connect failed");
        int rc = SPI_execute(
            "SELECT (SELECT s.shardid FROM pg_catalog.pg_dist_shard s"
            "         WHERE s.logicalrelid = 'jobcap.queues'::pg_catalog.regclass),"
            "       (SELECT s.shardid FROM pg_catalog.pg_dist_shard s"
            "         WHERE s.logicalrelid = 'jobcap.queue_grants'::pg_catalog.regclass),"
            "       (SELECT s.shardid FROM pg_catalog.pg_dist_shard s"
            "         WHERE s.logicalrelid = 'jobcap.job_schedules'::pg_catalog.regclass)",
            true, 1);
        if (rc != SPI_OK_SELECT || SPI_processed != 1)
            elog(ERROR, "jobcap: reading Citus's reference shards failed");
        int64 ids[3];
        for (int c = 0; c < 3; ++c) {
            bool null = false;
            Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c + 1, &null);
            if (null)
                ereport(ERROR,
                        (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                         errmsg("jobcap is only partly distributed: a reference table is missing"),
                         errhint("Run SELECT jobcap.distribute() on the coordinator again.")));
            ids[c] = DatumGetInt64(d);
        }
        SPI_finish();
        references = {true, ids[0], ids[1], ids[2]};
    }
    if (strcmp(table, "queues") == 0)
        return references.queues;
    if (strcmp(table, "queue_grants") == 0)
        return references.grants;
    return references.schedules;
}

// Statement s's text with its tables on shard `on` (see the top of this file).
char* retarget(const Statement& s, const Shard& on)
{
    StringInfoData out;
    initStringInfo(&out);
    const char* sql = s.sql;
    const char* prev_word = "";
    int prev_len = 0;
    const char* prev2_word = "";
    int prev2_len = 0;
    size_t i = 0, n = strlen(sql);
    while (i < n) {
        char c = sql[i];
        if (strncmp(sql + i, kFenceCall, sizeof kFenceCall - 1) == 0) {
            appendStringInfo(&out, "jobcap.shard_fence(%d, %d)", on.lo, on.hi);
            i += sizeof kFenceCall - 1;
            continue;
        }
        if (c == '\'') {  // a literal, copied as it is
            size_t end = i + 1;
            while (end < n && !(sql[end] == '\'' && (end + 1 >= n || sql[end + 1] != '\'')))
                end += sql[end] == '\'' ? 2 : 1;
            appendBinaryStringInfo(&out, sql + i, static_cast<int>(Min(end + 1, n) - i));
            i = end + 1;
            continue;
        }
        if (!ident_char(c) || (i > 0 && (ident_char(sql[i - 1]) || sql[i - 1] == '.'))) {
            appendStringInfoChar(&out, c);
            ++i;
            continue;
        }
        size_t end = i;
        while (end < n && ident_char(sql[end]))
            ++end;
        const char* word = sql + i;
        int len = static_cast<int>(end - i);
        const Table* table = nullptr;
        if (word_is(word, len, "jobcap") && end < n && sql[end] == '.') {
            size_t name_end = end + 1;
            while (name_end < n && ident_char(sql[name_end]))
                ++name_end;
            for (const Table& t : kTables)
                if (static_cast<size_t>(name_end - end - 1) == strlen(t.name) &&
                    strncmp(sql + end + 1, t.name, strlen(t.name)) == 0)
                    table = &t;
            if (table != nullptr)
                end = name_end;
        }
        if (table == nullptr) {
            appendBinaryStringInfo(&out, word, len);
            prev2_word = prev_word;
            prev2_len = prev_len;
            prev_word = word;
            prev_len = len;
            i = end;
            continue;
        }
        bool inserting =
            word_is(prev2_word, prev2_len, "INSERT") && word_is(prev_word, prev_len, "INTO");
        bool writing =
            inserting || word_is(prev_word, prev_len, "UPDATE") ||
            (word_is(prev2_word, prev2_len, "DELETE") && word_is(prev_word, prev_len, "FROM"));
        int64 shard =
            table->kind == Kind::distributed ? on.*(table->shard) : reference_shard(table->name);
        if (writing && table->kind == Kind::reference)
            cannot_retarget(s.name, "it writes a reference table");
        appendStringInfo(&out, "jobcap.%s_%lld", table->name, static_cast<long long>(shard));
        // An alias follows, or the table's own name becomes one.
        size_t next = end;
        while (next < n && isspace(static_cast<unsigned char>(sql[next])))
            ++next;
        size_t next_end = next;
        while (next_end < n && ident_char(sql[next_end]))
            ++next_end;
        bool aliased =
            next_end > next && !ends_table_reference(sql + next, static_cast<int>(next_end - next));
        if (next_end > next && word_is(sql + next, static_cast<int>(next_end - next), "AS"))
            aliased = true;
        if (!aliased)
            appendStringInfo(&out, " AS %s", table->name);
        i = end;
        if (!inserting || table->id_column == nullptr)
            continue;
        // INSERT INTO t (columns) SELECT ...: the identity column and its value go first.
        size_t open = next;
        if (aliased) {  // "AS alias" or "alias"
            open = next_end;
            while (open < n && isspace(static_cast<unsigned char>(sql[open])))
                ++open;
            if (word_is(sql + next, static_cast<int>(next_end - next), "AS")) {
                while (open < n && ident_char(sql[open]))
                    ++open;
                while (open < n && isspace(static_cast<unsigned char>(sql[open])))
                    ++open;
            }
        }
        if (open >= n || sql[open] != '(')
            cannot_retarget(s.name, "an INSERT without a column list");
        size_t close = open;
        while (close < n && sql[close] != ')')
            ++close;
        size_t select = close + 1;
        while (select < n && isspace(static_cast<unsigned char>(sql[select])))
            ++select;
        if (close >= n || !word_is(sql + select, Min(6, static_cast<int>(n - select)), "SELECT") ||
            (select + 6 < n && ident_char(sql[select + 6])))
            cannot_retarget(s.name, "an INSERT whose rows do not come from a SELECT");
        appendBinaryStringInfo(&out, sql + end, static_cast<int>(open + 1 - end));
        appendStringInfo(&out, "%s, ", table->id_column);
        appendBinaryStringInfo(&out, sql + open + 1, static_cast<int>(select + 6 - open - 1));
        appendStringInfo(&out, " pg_catalog.nextval('%s'::pg_catalog.regclass),",
                         table->id_sequence);
        i = select + 6;
        prev_word = prev2_word = "";
        prev_len = prev2_len = 0;
    }
    return out.data;
}

struct PlanKey {
    const Statement* statement;
    int64 shard;
};
struct PlanEntry {
    PlanKey key;
    SPIPlanPtr plan;
};
HTAB* plans = nullptr;

}  // namespace

SPIPlanPtr plan_on_shard(const Statement& s)
{
    if (plans == nullptr) {
        HASHCTL ctl = {};
        ctl.keysize = sizeof(PlanKey);
        ctl.entrysize = sizeof(PlanEntry);
        ctl.hcxt = TopMemoryContext;
        plans = hash_create("jobcap statements on shards", 256, &ctl,
                            HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    PlanKey key = {};
    key.statement = &s;
    key.shard = routed->jobs;
    bool found = false;
    PlanEntry* e = static_cast<PlanEntry*>(hash_search(plans, &key, HASH_FIND, &found));
    if (e != nullptr)
        return e->plan;
    char* sql = retarget(s, *routed);
    SPIPlanPtr plan = prepare_kept(s, sql);
    pfree(sql);
    e = static_cast<PlanEntry*>(hash_search(plans, &key, HASH_ENTER, &found));
    e->plan = plan;
    return plan;
}

}  // namespace jobcap::citus
