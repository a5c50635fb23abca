// PostgreSQL's headers, seen from C++. Every file that talks to the server includes this first,
// and only this: postgres.h leads, and everything sits inside extern "C".
#pragma once

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include "compat.hpp"
