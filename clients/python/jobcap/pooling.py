"""Connections through a pooler (PgBouncer): what the client finds out when it connects.

A pooler that multiplexes server connections (PgBouncer in any pool mode) hands each client a
cancel key of its own, so the backend process the key names is not the server's: a connection
whose ``pg_backend_pid()`` differs from ``conn.info.backend_pid`` goes through one. A direct
connection, or one through a plain TCP proxy (HAProxy, an SSH tunnel, a port mapping), has the
server's own key.

Through a pooler, in transaction pooling, consecutive transactions of one client may run on
different server connections, so the client keeps no state in the session:

- no prepared statements (psycopg prepares a statement run five times; PgBouncer 1.18 does not
  carry them from one server connection to the next: "prepared statement "_pg3_0" does not
  exist"): ``prepare_threshold`` is set to None;
- no LISTEN by default (a notification reaches the server connection that listened, which
  PgBouncer then holds for no client: it drops it with a warning): the worker polls instead,
  backing off to ``poll_max``. ``listen=True`` asks for LISTEN all the same, for session
  pooling, where the client keeps its server connection.

Statement pooling runs each statement on any server connection and refuses transactions: a
worker, whose job writes and completion are one transaction, cannot work there and refuses to
start (PoolModeError).
"""
from __future__ import annotations

from typing import Any

import psycopg

from .errors import JobcapError

#: What PgBouncer answers a transaction with, in statement pooling.
STATEMENT_POOLING = "transaction blocks not allowed in statement pooling mode"


class PoolModeError(JobcapError):
    """The pooler in front of the server pools in a mode this client cannot work in.

    Not a connection error: retrying cannot help, so the worker stops with it.
    """


def pooled(conn: psycopg.Connection) -> bool:
    """True when conn goes through a pooler (its cancel key names another process than the
    server's backend). Runs one statement; a connection that is not autocommit is left idle
    (committed)."""
    pid = conn.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()[0]
    if not conn.autocommit:
        conn.commit()
    return pid != conn.info.backend_pid


def refuse_statement_pooling(error: BaseException, what: str) -> None:
    """Raises PoolModeError when error is PgBouncer's refusal of a transaction in statement
    pooling (the connection is gone then): what needs transactions says so."""
    if isinstance(error, psycopg.OperationalError) and STATEMENT_POOLING in str(error):
        raise PoolModeError(
            f"jobcap: {what} needs transactions, and the pooler in front of the server "
            "(PgBouncer in pool_mode = statement) refuses them: use pool_mode = transaction "
            "(or session) for this database") from error


def connect(conninfo: str, *, transactions: bool = False, what: str = "a jobcap worker",
            **kwargs: Any) -> psycopg.Connection:
    """psycopg.connect, then: through a pooler, no prepared statements (``conn.pooled`` says
    which). transactions: the caller (what, in the refusal) runs transactions through the
    pooler (a worker's job connection), so statement pooling is refused with PoolModeError."""
    conn = psycopg.connect(conninfo, **kwargs)
    try:
        through = pooled(conn)
        if through and transactions:
            with conn.transaction():
                conn.execute("SELECT 1")
    except psycopg.OperationalError as error:
        conn.close()
        if transactions or not conn.autocommit:
            refuse_statement_pooling(error, what)
        raise
    except BaseException:
        conn.close()
        raise
    if through:
        conn.prepare_threshold = None
    conn.pooled = through  # type: ignore[attr-defined]
    return conn
