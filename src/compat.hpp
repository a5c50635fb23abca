// What differs between the PostgreSQL majors jobcap supports (15, 17 and 18), in one place.
// Included by pg.hpp after PostgreSQL's headers; code elsewhere never tests PG_VERSION_NUM.
// Today jobcap's C++ builds unchanged (with -Werror) on all three; a difference found later
// gets a shim here (a macro or an inline function named for what it does), not an #if at the
// call site.
#pragma once

#if PG_VERSION_NUM < 150000
#error "jobcap supports PostgreSQL 15, 17 and 18"
#endif
