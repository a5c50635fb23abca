'use strict';
// Several hosts, as libpq takes them: node-postgres connects to one host only, so a worker whose
// connection names a primary and its standbys (host 'a,b', port '5432,5433', and
// target_session_attrs 'read-write') would reach whichever host it names first. Client here
// picks the host at each connect, as libpq does: the hosts in order, the first that accepts a
// connection and (with target_session_attrs = 'read-write') is not read-only. After a failover
// the old primary refuses or answers read-only, so a reconnect lands on the new one. A config
// with one host is passed through untouched.
const pg = require('pg');

/** The candidates of a config, [{ host, port }], or null when it names one host. */
function candidates(config) {
  const hosts = String(config.host == null ? '' : config.host).split(',');
  if (hosts.length < 2) return null;
  const ports = String(config.port == null ? '' : config.port).split(',');
  if (ports.length !== 1 && ports.length !== hosts.length) {
    throw new TypeError(`${hosts.length} hosts but ${ports.length} ports: give one port, or one for each host`);
  }
  return hosts.map((host, i) => ({ host: host.trim(), port: Number(ports[ports.length === 1 ? 0 : i]) || 5432 }));
}

function sessionAttrs(config) {
  const attrs = config.target_session_attrs || config.targetSessionAttrs || 'any';
  if (attrs !== 'any' && attrs !== 'read-write') {
    throw new TypeError(`target_session_attrs '${attrs}' is not supported: 'any' or 'read-write'`);
  }
  return attrs;
}

/** The first host of `hosts` that takes a connection and fits `attrs`; throws a connection
 * error (08001) when none does. */
async function pick(config, hosts, attrs) {
  const reasons = [];
  for (const { host, port } of hosts) {
    const probe = new pg.Client({ ...config, host, port, target_session_attrs: undefined,
      targetSessionAttrs: undefined });
    probe.on('error', () => {});
    try {
      await probe.connect();
      if (attrs === 'read-write') {
        const { rows } = await probe.query('SHOW transaction_read_only');
        if (rows[0].transaction_read_only !== 'off') {
          reasons.push(`${host}:${port} is read-only`);
          continue;
        }
      }
      return { host, port };
    } catch (err) {
      reasons.push(`${host}:${port}: ${err.message}`);
    } finally {
      probe.end().catch(() => {});
    }
  }
  const err = new Error(`connection failed: no host fits target_session_attrs=${attrs} (${reasons.join('; ')})`);
  err.code = '08001';
  throw err;
}

class Client extends pg.Client {
  constructor(config = {}) {
    const hosts = typeof config === 'object' ? candidates(config) : null;
    super(hosts ? { ...config, host: hosts[0].host, port: hosts[0].port } : config);
    this._candidates = hosts;
    this._attrs = hosts ? sessionAttrs(config) : 'any';
    this._rawConfig = config;
  }

  connect(callback) {
    if (!this._candidates) return super.connect(callback);
    const done = pick(this._rawConfig, this._candidates, this._attrs).then(({ host, port }) => {
      this.host = host;
      this.port = port;
      this.connectionParameters.host = host;
      this.connectionParameters.port = port;
      return super.connect();
    });
    if (callback) {
      done.then(() => callback(null, this), (err) => callback(err));
      return undefined;
    }
    return done;
  }
}

module.exports = { Client, candidates };
