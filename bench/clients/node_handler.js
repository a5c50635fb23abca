'use strict';
// The trivial handler of node_worker.js in its isolated mode.
module.exports = async () => {};
