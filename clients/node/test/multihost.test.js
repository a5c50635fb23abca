'use strict';
// Several hosts, as libpq takes them (lib/multihost.js): the first host that takes a connection
// and fits target_session_attrs, a connection error (08001) when none does.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const os = require('node:os');
const path = require('node:path');
const pg = require('pg');
const jobcap = require('../lib');
const { candidates } = require('../lib/multihost');
const { Server } = require('../test-support/pgserver');

describe('several hosts', () => {
  let server;
  const nowhere = path.join(os.tmpdir(), `jobcap-no-server-${process.pid}`);  // no socket there
  before(async () => {
    server = new Server().start();
    const db = new pg.Client(server.connection);
    await db.connect();
    await db.query("CREATE ROLE reader LOGIN SUPERUSER");
    await db.query("ALTER ROLE reader SET default_transaction_read_only = on");
    await db.end();
  });
  after(() => { if (server) server.stop(); });

  it('reads host and port lists as libpq does', () => {
    assert.equal(candidates({ host: 'db1' }), null);
    assert.deepEqual(candidates({ host: 'a,b', port: '5433' }), [{ host: 'a', port: 5433 }, { host: 'b', port: 5433 }]);
    assert.deepEqual(candidates({ host: 'a, b', port: '1,2' }), [{ host: 'a', port: 1 }, { host: 'b', port: 2 }]);
    assert.throws(() => candidates({ host: 'a,b,c', port: '1,2' }), /3 hosts but 2 ports/);
    assert.throws(() => new jobcap.Client({ host: 'a,b', target_session_attrs: 'standby' }), /not supported/);
  });

  it('skips a host that is down and connects to the next', async () => {
    const c = new jobcap.Client({ ...server.connection, host: `${nowhere},${server.dir}`,
      port: `${server.port},${server.port}`, target_session_attrs: 'read-write' });
    await c.connect();
    assert.equal(c.host, server.dir);
    const { rows } = await c.query('SELECT 1 AS one');
    assert.equal(rows[0].one, 1);
    await c.end();
  });

  it('refuses read-only hosts under read-write, with a connection error', async () => {
    const config = { ...server.connection, user: 'reader', host: `${nowhere},${server.dir}`,
      port: String(server.port), target_session_attrs: 'read-write' };
    const c = new jobcap.Client(config);
    await assert.rejects(c.connect(), (err) => err.code === '08001' && /is read-only/.test(err.message)
      && jobcap.isConnectionError(err));
    const any = new jobcap.Client({ ...config, target_session_attrs: 'any' });
    await any.connect();
    await any.end();
  });

  it('connects a pool through it (callback style)', async () => {
    const pool = new pg.Pool({ ...server.connection, host: `${nowhere},${server.dir}`,
      port: `${server.port},${server.port}`, Client: jobcap.Client, max: 2 });
    const { rows } = await pool.query('SELECT 2 AS two');
    assert.equal(rows[0].two, 2);
    await pool.end();
  });
});
