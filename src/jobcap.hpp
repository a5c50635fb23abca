// Settings shared by the files of the extension (defined in jobcap.cpp).
#pragma once

namespace jobcap {

extern int guc_error_history;         // jobcap.error_history: errors kept per job
extern int guc_max_error_bytes;       // jobcap.max_error_bytes: longest error text kept
extern int guc_max_payload_bytes;     // jobcap.max_payload_bytes: largest payload enqueued
extern int guc_max_output_bytes;      // jobcap.max_output_bytes: largest job output kept
extern int guc_default_max_attempts;  // jobcap.default_max_attempts: create_queue's default cap

// jobcap.hot_path: how claims and settles run (src/direct/direct.hpp).
enum HotPath { kHotPathSql, kHotPathDirect };
extern int guc_hot_path;

// The background worker's settings (read by src/background/).
extern char* guc_database;             // jobcap.database: the databases served, or '*'
extern int guc_reap_interval_ms;       // jobcap.reap_interval
extern int guc_report_interval_s;      // jobcap.report_interval
extern int guc_succeeded_retention_s;  // jobcap.succeeded_retention, 0 = keep forever
extern int guc_dead_retention_s;       // jobcap.dead_retention, 0 = keep forever
extern bool guc_vacuum;                // jobcap.vacuum: the worker vacuums jobcap.jobs too

}  // namespace jobcap
