// Type declarations of the jobcap Node client (lib/index.js).
import type { EventEmitter } from 'node:events';
import type { ClientConfig, ClientBase, Pool, QueryResult, QueryResultRow } from 'pg';
import { Client as PgClient } from 'pg';

/** Anything with node-postgres's query(): a Client, a PoolClient or a Pool. */
export type Queryable = Pick<ClientBase, 'query'> | Pool;

/** The states of a job (jobcap.job_state). */
export type JobState = 'pending' | 'running' | 'succeeded' | 'dead' | 'cancelled';

/** How an attempt ended, as the 'settled' event reports it. */
export type Outcome = 'succeeded' | 'retry' | 'dead' | 'stale' | 'released' | 'cancelled';

/** A claimed job, as the handler sees it. */
export interface Job<P = any> {
  /** Decimal digits (a bigint, as node-postgres gives one): an id can pass 2^53 on a Citus
   * cluster, beyond a Number. */
  readonly id: string;
  /** The lease generation: hand [id, fence] downstream as an idempotency key. Decimal digits
   * (a bigint, as node-postgres gives one): a fence can pass 2^53, beyond a Number. */
  readonly fence: string;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly payload: P;
  leaseExpiresAt: Date;
  /** The connection with the job's transaction open: its writes commit with complete_job. */
  readonly client: ClientBase;
  /** Aborts at the deadline (reason: JobTimeoutError; an isolated handler is killed then) and
   * when the job is cancelled while it runs (reason: JobCancelledError). */
  readonly signal: AbortSignal;
  /** True when a failure now makes the job dead. */
  readonly lastAttempt: boolean;
  /** Set by the handler (anything JSON) to keep a result with the job (jobs.output). */
  output: unknown;
  /** Runs a statement in the job's transaction. */
  query<R extends QueryResultRow = any>(text: string, values?: unknown[]): Promise<QueryResult<R>>;
  /** Throws StaleFenceError unless the lease is current; holds the job row to commit. */
  assertFence(): Promise<void>;
  /** Extends the lease (and the deadline) from now; throws StaleFenceError if it is gone. */
  heartbeat(): Promise<Date>;
}

export type Handler<P = any> = (job: Job<P>) => unknown | Promise<unknown>;

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export interface WorkerOptions<P = any> {
  /** A connection string or a node-postgres client configuration (JSON-serialisable when the
   * handler is isolated: it is passed to the handler processes). */
  connection: string | ClientConfig;
  queue: string;
  /** A module path: isolated, each running job in a child process of its own (the module
   * exports the handler: module.exports = async (job) => ..., or exports.handler). A function:
   * in-process, not isolated from the worker or its other jobs. */
  handler: string | Handler<P>;
  name?: string;
  /** Handlers running at once (default 1). */
  concurrency?: number;
  /** Jobs claimed beyond those running (default 0): at most concurrency + prefetch held. */
  prefetch?: number;
  /** Lease in ms (default 60000). */
  lease?: number;
  /** Handler deadline in ms, shorter than the lease (default 0.8 x lease). */
  timeout?: number;
  pollMin?: number;
  pollMax?: number;
  /** In-process: a watchdog thread kills the process when a handler blocks the event loop. */
  exitOnHang?: boolean;
  logger?: Logger;
  /** LISTEN for wake-ups. Default: yes, unless the connection goes through a pooler
   * (PgBouncer), where the worker polls; true under session pooling. */
  listen?: boolean;
  /** Without LISTEN: how often (ms, default 1000) the running jobs' states are read to stop the
   * handlers of cancelled jobs. */
  cancelPoll?: number;
}

export declare class Worker<P = any> extends EventEmitter {
  constructor(options: WorkerOptions<P>);
  readonly queue: string;
  readonly name: string;
  readonly concurrency: number;
  readonly prefetch: number;
  readonly isolated: boolean;
  readonly stopping: boolean;
  /** The loop; resolves once stopped. Takes SIGTERM and SIGINT as stop() unless told not to. */
  run(options?: { handleSignals?: boolean }): Promise<void>;
  /** Releases the jobs not started, lets the running ones finish; resolves when run() has. */
  stop(): Promise<void>;
  on(event: 'settled', listener: (job: Job<P>, outcome: Outcome, error: Error | null) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

export declare const STALE_FENCE: 'JC001';
export declare class JobcapError extends Error {}
export declare class StaleFenceError extends JobcapError {
  constructor(message: string, options?: { jobId?: string | number; fence?: string | number; operation?: string;
    detail?: string; cause?: unknown });
  readonly code: 'JC001';
  readonly jobId?: string | number;
  readonly fence?: string | number;
  readonly operation?: string;
  readonly detail?: string;
}
export declare class JobTimeoutError extends JobcapError {}
/** The job's attempt ended on the server while its handler ran: cancel_job ('cancelled') or
 * max_run_time ('timed_out'). The reason job.signal aborts with then. */
export declare class JobCancelledError extends JobcapError {
  constructor(message?: string, reason?: 'cancelled' | 'timed_out');
  readonly reason: 'cancelled' | 'timed_out';
}
/** A handler's process died without settling its job; recorded with jobcap.crash_job. */
export declare class HandlerCrashedError extends JobcapError {}
/** An error an isolated handler threw, as text. */
/** The pooler in front of the server pools in a mode the worker cannot work in (PgBouncer's
 * statement pooling): run() rejects with it. */
export declare class PoolModeError extends JobcapError {}
export declare const STATEMENT_POOLING: string;
export declare class HandlerError extends JobcapError {
  readonly errorName?: string;
}
export declare function isStale(err: unknown): boolean;
export declare function translate(err: unknown, operation?: string, jobId?: string | number, fence?: string | number): unknown;
export declare function isConnectionError(err: unknown): boolean;

export declare function interval(ms: number | null | undefined): string | null;
/** A queue's settings added in jobcap 0.3.0 (null or absent: the server's default). Durations in ms. */
export interface QueueSettings03 {
  maxSnoozes?: number | null; maxRunTime?: number | null; rateLimit?: number | null;
  ratePeriod?: number | null; maxRunningPerKey?: number | null;
  fairness?: 'fifo' | 'round_robin' | null;
}
export declare function createQueue(db: Queryable, queue: string, options?: {
  maxAttempts?: number | null; lease?: number; backoffBase?: number; backoffMax?: number;
  notify?: boolean; maxRunning?: number | null } & QueueSettings03): Promise<void>;
/** Changes the settings given (null or absent: unchanged); 0 removes a limit. */
export declare function alterQueue(db: Queryable, queue: string, settings?: {
  maxAttempts?: number | null; lease?: number | null; backoffBase?: number | null;
  backoffMax?: number | null; notify?: boolean | null; maxRunning?: number | null } & QueueSettings03): Promise<void>;
/** Changes a queue's cap on jobs running at once; null removes it. */
export declare function setMaxRunning(db: Queryable, queue: string, maxRunning: number | null): Promise<void>;
/** Cancels a job that has not finished; false when it had finished already. */
export declare function cancelJob(db: Queryable, jobId: string | number): Promise<boolean>;
export declare function pauseQueue(db: Queryable, queue: string): Promise<boolean>;
export declare function resumeQueue(db: Queryable, queue: string): Promise<boolean>;
/** Creates or replaces a periodic job (five-field cron, UTC); resolves to its next slot. */
export declare function scheduleJob(db: Queryable, name: string, cron: string, queue: string,
  payload?: unknown, options?: { priority?: number; maxAttempts?: number | null }): Promise<Date>;
export declare function unscheduleJob(db: Queryable, name: string): Promise<boolean>;
export declare function enqueue(db: Queryable, queue: string, payload?: unknown, options?: {
  runAt?: Date | null; priority?: number; maxAttempts?: number | null;
  dedupeKey?: string | null; concurrencyKey?: string | null;
  /** ms: dedupeKey also finds the key's succeeded or cancelled job enqueued within it. */
  dedupeWindow?: number | null;
  /** 'replace': a pending job holding dedupeKey takes this payload and runAt. */
  dedupe?: 'keep' | 'replace' }): Promise<string>;
export declare function complete(db: Queryable, jobId: string | number, fence: string | number,
  output?: unknown): Promise<JobState>;
/** What jobResult resolves to. */
export interface JobResult {
  state: JobState; attempts: number; output: unknown; error: string | null;
  finishedAt: Date | null;
}
/** Reads a job of a queue the role may work (jobcap.job_result), for the side that enqueued it. */
export declare function jobResult(db: Queryable, jobId: string | number): Promise<JobResult>;
/** Completes several jobs, each under its own fence, all or nothing (a stale fence throws). */
export declare function completeJobs(db: Queryable, jobIds: (string | number)[], fences: (string | number)[],
  outputs?: unknown[] | null): Promise<number>;
/** A claimed row, as claim_job and complete_and_claim return it. */
export interface ClaimedRow {
  job_id: string; fence: string; attempt: number; max_attempts: number; payload: unknown;
  lease_expires_at: Date;
}
/** Completes a job and claims up to batch more in one statement. */
export declare function completeAndClaim(db: Queryable, jobId: string | number, fence: string | number,
  queue: string, worker: string, options?: { batch?: number; lease?: number | null;
  output?: unknown }): Promise<ClaimedRow[]>;
export declare function fail(db: Queryable, jobId: string | number, fence: string | number, error: string,
  retryIn?: number | null): Promise<JobState>;
export declare function heartbeat(db: Queryable, jobId: string | number, fence: string | number,
  extend?: number | null): Promise<Date>;
export declare function assertFence(db: Queryable, jobId: string | number, fence: string | number): Promise<void>;
/** Gives back a job whose handler never started (only then: see README). */
export declare function release(db: Queryable, jobId: string | number, fence: string | number): Promise<JobState>;
/** Ends an attempt whose handler's process died, as a crash. */
export declare function crash(db: Queryable, jobId: string | number, fence: string | number, error: string): Promise<JobState>;

/** A pg Client that takes several hosts as libpq does (host 'a,b', port '5432,5433', and
 * target_session_attrs 'any' or 'read-write'), picking the host at each connect. */
export declare class Client extends PgClient {}
