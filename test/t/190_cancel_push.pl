# Cancellation reaches the worker: real Python and Node worker processes, running the packaged
# clients (test/run tap builds the wheel and the npm tarball and unpacks them outside the
# repository), hold a running job each; cancel_job from another session stops each handler within
# 2 s, the job ends cancelled with its one attempt, never retried, the handler's write rolled
# back, and the worker goes on. Then the server restarts (-m immediate) under the workers: they
# reconnect by themselves, LISTEN again, and a cancellation after the restart is pushed as before.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run qw(start timeout);
use Time::HiRes qw(time usleep);
use JobcapTest;

plan skip_all => 'the packaged clients come from test/run tap (JOBCAP_TAP_PYTHONPATH, JOBCAP_TAP_NODE_PATH)'
  unless $ENV{JOBCAP_TAP_PYTHONPATH} && $ENV{JOBCAP_TAP_NODE_PATH};

my $node = jobcap_node('cancel_push');
$node->safe_psql('postgres', q{
    CREATE EXTENSION jobcap;
    CREATE TABLE effects (job_id bigint, client text);
    SELECT jobcap.create_queue('py', lease => '30 seconds');
    SELECT jobcap.create_queue('node', lease => '30 seconds');
});
my $conninfo = $node->connstr('postgres');
my $node_connection = sprintf('{"host": "%s", "port": %d, "database": "postgres"}', $node->host, $node->port);
my $dir = PostgreSQL::Test::Utils::tempdir;

# Polling for cancellations is set to every 30 s: a handler stopped within 2 s was told by
# NOTIFY. Each worker prints where its client came from, "started ID" when a handler began and
# "settled ID OUTCOME" for every outcome; a handler sleeps 40 s unless the payload says quick.
open my $py, '>', "$dir/worker.py" or die;
print $py <<'EOF';
import os, sys, time
import jobcap

conninfo, queue = sys.argv[1:3]


def handle(job):
    job.execute("INSERT INTO effects VALUES (%s, 'py')", (job.id,))
    print(f"started {job.id}", flush=True)
    if not (job.payload or {}).get("quick"):
        time.sleep(40)


def settled(job, outcome, error):
    print(f"settled {job.id} {outcome}", flush=True)


print(f"client {os.path.dirname(jobcap.__file__)}", flush=True)
jobcap.Worker(conninfo, queue, handle, lease=60, timeout=45, poll_max=0.2, cancel_poll=30,
              on_settled=settled).run()
print("exited cleanly", flush=True)
EOF
close $py;
open my $js, '>', "$dir/worker.js" or die;
print $js <<'EOF';
'use strict';
const { setTimeout: wait } = require('node:timers/promises');
const { Worker } = require('jobcap');

const [connection, queue] = [JSON.parse(process.argv[2]), process.argv[3]];
console.log(`client ${require.resolve('jobcap')}`);
const worker = new Worker({
  connection, queue, pollMax: 200, lease: 60000, timeout: 45000, cancelPoll: 30000,
  logger: { info() {}, warn: (m) => console.log(m), error: (m) => console.log(m) },
  handler: async (job) => {
    await job.query("INSERT INTO effects VALUES ($1, 'node')", [job.id]);
    console.log(`started ${job.id}`);
    if (!(job.payload && job.payload.quick)) await wait(40000, null, { signal: job.signal });
  },
});
worker.on('settled', (job, outcome) => console.log(`settled ${job.id} ${outcome}`));
worker.run().then(() => console.log('exited cleanly'));
EOF
close $js;

my %workers;
for my $client ('py', 'node')
{
	my $out = '';
	my @cmd = $client eq 'py'
	  ? ('/usr/bin/python3', "$dir/worker.py", $conninfo, 'py')
	  : ('node', "$dir/worker.js", $node_connection, 'node');
	local $ENV{PYTHONPATH} = $ENV{JOBCAP_TAP_PYTHONPATH};
	local $ENV{NODE_PATH} = $ENV{JOBCAP_TAP_NODE_PATH};
	my $h = start(\@cmd, '<', \undef, '>&', \$out, timeout(300));
	$workers{$client} = { h => $h, out => \$out };
}

# Waits until the worker's output has a line matching $re; returns the seconds it took.
sub wait_output
{
	my ($client, $re, $seconds) = @_;
	my $w = $workers{$client};
	my $start = time;
	while (time - $start < $seconds)
	{
		# pump_nb dies once the process has ended: what it printed is still checked, and shown
		my $alive = eval { $w->{h}->pump_nb; 1 };
		return time - $start if ${ $w->{out} } =~ $re;
		last unless $alive;
		usleep(20_000);
	}
	diag("$client worker output:\n${ $w->{out} }");
	return undef;
}

for my $client ('py', 'node')
{
	ok(defined wait_output($client, qr/^client (.*)$/m, 30), "$client worker started");
	my ($from) = ${ $workers{$client}{out} } =~ /^client (.*)$/m;
	unlike($from, qr{/clients/(python|node)/}, "$client worker runs the packaged client ($from)");
}

# One round: a long job on each worker, cancelled while its handler runs; then a quick one.
sub cancel_round
{
	my ($label) = @_;
	for my $client ('py', 'node')
	{
		my $long = $node->safe_psql('postgres', "SELECT jobcap.enqueue_job('$client')");
		ok(defined wait_output($client, qr/^started $long$/m, 60), "$label: $client handler of $long started");
		my $sent = time;
		is($node->safe_psql('postgres', "SELECT jobcap.cancel_job($long)"), 't',
			"$label: cancel_job($long) cancels the running job");
		my $took = wait_output($client, qr/^settled $long cancelled$/m, 10);
		ok(defined $took && time - $sent < 2,
			sprintf("$label: the $client handler was stopped within 2 s (%.2f s)", time - $sent));
		is( $node->safe_psql('postgres', qq{
				SELECT state || ' ' || attempts || ' '
				       || (SELECT count(*) FROM effects WHERE job_id = $long) || ' '
				       || (SELECT string_agg(kind::text, ',' ORDER BY seq) FROM jobcap.job_errors
				            WHERE job_id = $long)
				  FROM jobcap.jobs WHERE job_id = $long}),
			'cancelled 1 0 cancelled',
			"$label: $client job cancelled, one attempt, its write rolled back, history 'cancelled' only");
		my $quick = $node->safe_psql('postgres', qq{SELECT jobcap.enqueue_job('$client', '{"quick": true}')});
		ok(defined wait_output($client, qr/^settled $quick succeeded$/m, 30),
			"$label: the $client worker goes on and completes $quick");
	}
}

cancel_round('before the restart');

$node->stop('immediate');
$node->start;
cancel_round('after an immediate restart');

# Nothing was claimed twice: each job was claimed once.
is($node->safe_psql('postgres', 'SELECT count(*) FROM jobcap.jobs WHERE attempts <> 1'), '0',
	'every job was claimed exactly once');

for my $client ('py', 'node')
{
	$workers{$client}{h}->signal('TERM');
	ok(defined wait_output($client, qr/^exited cleanly$/m, 20), "$client worker exits cleanly on SIGTERM");
	$workers{$client}{h}->finish;
}

$node->stop;
done_testing();
