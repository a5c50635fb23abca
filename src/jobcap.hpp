// Settings shared by the files of the extension (defined in jobcap.cpp).
#pragma once

namespace jobcap {

extern int guc_error_history;      // jobcap.error_history: errors kept per job
extern int guc_max_error_bytes;    // jobcap.max_error_bytes: longest error text kept
extern int guc_max_payload_bytes;  // jobcap.max_payload_bytes: largest payload enqueued
extern int guc_default_max_attempts;  // jobcap.default_max_attempts: create_queue's default cap

}  // namespace jobcap
