'use strict';
// A throwaway PostgreSQL server with jobcap, for tests: initdb, start, stop, remove. It runs
// the private install that test/run builds (build/tmp_install), or $JOBCAP_PG_BINDIR. As root
// the server runs as the postgres user. It listens on a Unix socket in its own directory only.
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..', '..');

function pgBindir() {
  if (process.env.JOBCAP_PG_BINDIR) return process.env.JOBCAP_PG_BINDIR;
  const system = execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim();
  const dir = path.join(ROOT, 'build', 'tmp_install') + system;
  if (!fs.existsSync(path.join(dir, 'postgres'))) {
    throw new Error(`no private install at ${dir}: run test/run clients (or set JOBCAP_PG_BINDIR)`);
  }
  return dir;
}

class Server {
  constructor({ settings = {}, port = 5432 } = {}) {
    this.bindir = pgBindir();
    this.settings = settings;
    this.port = port;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'jobcap-test-'));
    this.data = path.join(this.dir, 'data');
    this.asPostgres = process.getuid() === 0;
    if (this.asPostgres) {
      const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }));
      const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }));
      fs.chownSync(this.dir, uid, gid);
    }
    this.running = false;
  }

  get connection() {
    return { host: this.dir, port: this.port, user: 'postgres', database: 'postgres' };
  }

  _run(args) {
    let cmd = path.join(this.bindir, args[0]);
    let rest = args.slice(1);
    if (this.asPostgres) {
      rest = ['-u', 'postgres', '--', cmd, ...rest];
      cmd = 'runuser';
    }
    try {
      execFileSync(cmd, rest, { encoding: 'utf8', stdio: 'pipe' });
    } catch (err) {
      throw new Error(`${args.join(' ')} failed:\n${err.stdout}${err.stderr}${this.logTail()}`);
    }
  }

  logTail() {
    try {
      return fs.readFileSync(path.join(this.dir, 'log'), 'utf8').split('\n').slice(-30).join('\n');
    } catch (err) {
      return '';
    }
  }

  start() {
    this._run(['initdb', '-D', this.data, '-U', 'postgres', '-A', 'trust', '--no-sync',
      '-E', 'UTF8', '--locale=C']);
    const conf = { listen_addresses: "''", unix_socket_directories: `'${this.dir}'`,
      port: this.port, fsync: 'off', max_connections: 50, shared_buffers: '32MB', ...this.settings };
    fs.appendFileSync(path.join(this.data, 'postgresql.conf'),
      Object.entries(conf).map(([k, v]) => `${k} = ${v}\n`).join(''));
    this._run(['pg_ctl', '-D', this.data, '-l', path.join(this.dir, 'log'), '-w', 'start']);
    this.running = true;
    // Whatever happens to the test process, the server goes with it.
    this._onExit = () => this.stop();
    process.once('exit', this._onExit);
    this.psql('CREATE EXTENSION jobcap');
    return this;
  }

  psql(sqlText) {
    return execFileSync(path.join(this.bindir, 'psql'), ['-X', '-q', '-A', '-t', '-v',
      'ON_ERROR_STOP=1', '-h', this.dir, '-p', String(this.port), '-U', 'postgres', '-d',
      'postgres', '-c', sqlText], { encoding: 'utf8' }).trim();
  }

  stop() {
    if (this._onExit) process.removeListener('exit', this._onExit);
    this._onExit = null;
    if (this.running) {
      this._run(['pg_ctl', '-D', this.data, '-m', 'fast', '-w', 'stop']);
      this.running = false;
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

module.exports = { Server, pgBindir };
