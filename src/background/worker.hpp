// The background worker's entry points: what the front door (jobcap.cpp) registers and what its
// processes ask each other. The launcher is src/background/launcher.cpp, the per-database
// reaper src/background/reaper.cpp, the DDL hooks src/background/ddl.cpp.
#pragma once

#include "pg.hpp"

namespace jobcap {

// jobcap.database (launcher.cpp): its check hook, whether it says '*', and whether it selects a
// database.
bool check_database(char** newval, void** extra, GucSource source);
bool all_databases();
bool database_wanted(const char* name);

// Registers the launcher, which starts a reaper per selected database. Called from _PG_init
// while shared_preload_libraries is being processed.
void register_launcher();

// Installs the hooks of ddl.cpp (reapers out of the way of database DDL, the launcher woken by
// it). Called from _PG_init while shared_preload_libraries is being processed.
void install_ddl_hooks();

}  // namespace jobcap
