'use strict';
// jobcap for Node.js: a worker loop over PostgreSQL's jobcap extension (node-postgres).
const errors = require('./errors');
const sql = require('./sql');
const { Worker, Job } = require('./worker');
const { Client } = require('./multihost');

module.exports = { Worker, Job, Client, ...errors, ...sql };
