// Included first by every file of the pure core. The core is plain C++ that CTest runs without a
// server: it must never see a PostgreSQL header (their macros, longjmp-based errors and memory
// contexts do not belong here), and files that include PostgreSQL must not come through here.
#pragma once

#ifdef POSTGRES_H
#error "src/core is pure C++: do not include PostgreSQL headers before a core source file"
#endif
#define JOBCAP_CORE_ONLY 1
