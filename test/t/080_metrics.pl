# jobcap.metrics() against real statistics kept by the background worker: every line must be a
# valid sample or comment of the Prometheus text exposition format 0.0.4 (checked by the strict
# parser below: names, label syntax and escapes, values, TYPE before samples, families not
# split, no series twice), queue names that need escaping must come back unchanged, and the
# numbers must be those of queue_stats and of the worker's report line: four poison jobs are
# four failing jobs.
use strict;
use warnings;

use FindBin;
use MIME::Base64;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JobcapTest;

# Reports every 30 s while the jobs run, so their failures fall in one window; lowered later.
my $node = jobcap_node('metrics', 'jobcap.report_interval' => "'30s'");
my $offset = -s $node->logfile;

# Queue names that a label value must escape: a double quote, a backslash (followed by n, which
# a careless escaper would turn into a line feed), non-ASCII text.
my @queues = ('media', 'we"ird \\n queue', "\xc3\xbcber-\xc3\xa9t\xc3\xa9 {x=\"1\"}");    # UTF-8 bytes, as psql returns them
my %sql_name = map { $_ => sql_literal($_) } @queues;
$node->safe_psql('postgres', 'CREATE EXTENSION jobcap');
# The report window starts when the worker finds the extension.
$node->wait_for_log(qr/jobcap reaper is serving database "postgres"/, $offset);
for my $q (@queues)
{
	$node->safe_psql('postgres',
		"SELECT jobcap.create_queue($sql_name{$q}, max_attempts => 3, backoff_base => '0', backoff_max => '0')");
}

# media: 20 jobs that succeed and 4 poison jobs that fail on each of their 3 attempts.
$node->safe_psql('postgres', q{
    SELECT jobcap.enqueue_jobs('media', array_agg(jsonb_build_object('n', i))) FROM generate_series(1, 20) i;
    SELECT jobcap.enqueue_jobs('media', array_agg(jsonb_build_object('poison', i))) FROM generate_series(1, 4) i;
    DO $$
    DECLARE c record; n int;
    BEGIN
        LOOP
            n := 0;
            FOR c IN SELECT * FROM jobcap.claim_job('media', 'w', 10) LOOP
                n := n + 1;
                IF c.payload ? 'poison' THEN
                    PERFORM jobcap.fail_job(c.job_id, c.fence, E'cannot decode "frame"\nat 0x00');
                ELSE
                    PERFORM jobcap.complete_job(c.job_id, c.fence);
                END IF;
            END LOOP;
            EXIT WHEN n = 0;
        END LOOP;
    END $$;
});
# The oddly named queue: one job whose worker is lost (the lease expires; the worker reaps it),
# then done; one job left waiting.
my $odd = $sql_name{ $queues[1] };
my $crash = $node->safe_psql('postgres', "SELECT jobcap.enqueue_job($odd)");
$node->safe_psql('postgres', "SELECT count(*) FROM jobcap.claim_job($odd, 'killed-worker')");
$node->safe_psql('postgres',
	"UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = $crash");
ok(defined wait_until($node, "SELECT state = 'pending' FROM jobcap.jobs WHERE job_id = $crash"),
	'the worker reaped the lost lease');
$node->safe_psql('postgres',
	"SELECT jobcap.complete_job(job_id, fence) FROM jobcap.claim_job($odd, 'w')");
$node->safe_psql('postgres', "SELECT jobcap.enqueue_job($odd, run_at => now() - interval '5 seconds')");

# The worker counts finished jobs about once a second.
ok(defined wait_until($node,
		"SELECT succeeded = 20 FROM jobcap.queue_stats WHERE queue = 'media'"),
	'the worker counted the 20 completions');
is($node->safe_psql('postgres',
		"SELECT succeeded || ' ' || failed_attempts || ' ' || failing_jobs || ' ' || new_dead || ' ' || dead
		   FROM jobcap.queue_stats WHERE queue = 'media'"),
	'20 12 4 4 4', 'queue_stats: 20 succeeded, 12 failed attempts by 4 jobs, 4 went dead');

# Byte for byte (psql would trim the last line feed).
my $text = decode_base64($node->safe_psql('postgres',
		"SELECT translate(encode(convert_to(jobcap.metrics(), 'UTF8'), 'base64'), E'\\n', '')"));
my ($families, $samples, @problems) = parse_exposition($text);
is_deeply(\@problems, [], 'every line is a valid sample or comment')
	or diag($text);
ok(scalar(keys %$families) >= 10, scalar(keys %$families) . ' metric families');

my %by = map { (series_key($_->{name}, $_->{labels}) => $_->{value}) } @$samples;
sub value_of
{
	my ($name, %labels) = @_;
	return $by{ series_key($name, \%labels) };
}
is(value_of('jobcap_window_failing_jobs', queue => 'media'), 4, 'four failing jobs');
is(value_of('jobcap_window_failed_attempts', queue => 'media'), 12, 'beside 12 failed attempts');
is(value_of('jobcap_window_new_dead_jobs', queue => 'media'), 4, 'four went dead');
is(value_of('jobcap_jobs', queue => 'media', state => 'dead'), 4, 'four dead now');
is(value_of('jobcap_window_succeeded_jobs', queue => 'media'), 20, '20 succeeded');
is(value_of('jobcap_window_lost_leases', queue => $queues[1]), 1,
	'one lost lease, under the name that needs escaping');
is(value_of('jobcap_window_crashed_jobs', queue => $queues[1]), 1, 'one crashed job');
is(value_of('jobcap_window_failed_attempts', queue => $queues[1]), 0, 'a crash is not an error');
is(value_of('jobcap_jobs', queue => $queues[1], state => 'pending'), 1, 'one job waiting');
ok(value_of('jobcap_oldest_pending_age_seconds', queue => $queues[1]) >= 5, 'waiting 5 s or more');
is(value_of('jobcap_jobs', queue => $queues[2], state => 'pending'), 0,
	'the non-ASCII queue name comes back unchanged');
is(value_of('jobcap_window_seconds'), 3600, 'the window is jobcap.stats_window');
ok(defined value_of('jobcap_window_claim_latency_p95_seconds', queue => 'media'), 'a claim latency');
ok(value_of('jobcap_counts_lag_seconds') < 10, 'the counts are fresh');
my %queues_seen = map { ($_->{labels}{queue} // '') => 1 } @$samples;
is_deeply([ sort grep { $_ ne '' } keys %queues_seen ], [ sort @queues ], 'every queue, named exactly');

# The postgres_exporter queries file runs, and names one metric per column.
my $yml = slurp_file("$FindBin::RealBin/../../docs/postgres_exporter.yml");
my ($query) = $yml =~ /^  query: \|\n((?:    .*\n)+)/m;
my @columns = $yml =~ /^    - (\w+):$/mg;
ok(defined $query, 'docs/postgres_exporter.yml has a query');
my $header = $node->safe_psql('postgres', "COPY ($query) TO STDOUT WITH (FORMAT csv, HEADER)");
is((split /\n/, $header)[0], join(',', @columns), 'its columns are the metrics it declares');

# The same numbers in the worker's report line.
$node->safe_psql('postgres', "ALTER SYSTEM SET jobcap.report_interval = '1s'; SELECT pg_reload_conf()");
$node->wait_for_log(qr/jobcap queue "media"/, $offset);
like(slurp_file($node->logfile, $offset),
	qr/LOG:  jobcap queue "media" in database "postgres": 4 jobs went dead \(4 dead in all\); 4 jobs failed 12 attempts$/m,
	'the report line says four jobs, beside their attempts');

# The parser fails what it should (so that the checks above can fail).
my @bad = (
	"jobcap_x 1",                                  # no final line feed
	"jobcap-x 1\n",                                # bad metric name
	"x{queue=\"a\"b\"} 1\n",                       # unescaped quote
	"x{queue=\"a\\tb\"} 1\n",                      # unknown escape
	"x{__q=\"a\"} 1\n",                            # reserved label name
	"x{q=\"a\",q=\"b\"} 1\n",                      # label twice
	"x 1.2.3\n",                                   # bad value
	"x 1\ny 2\nx 3\n",                             # family split
	"x 1\nx 2\n",                                  # series twice
	"x 1\n# TYPE x gauge\n",                       # TYPE after samples
	"# TYPE x widget\nx 1\n",                      # unknown type
	"\n",                                          # empty line
);
for my $b (@bad)
{
	my (undef, undef, @p) = parse_exposition($b);
	ok(@p > 0, 'the parser refuses ' . ($b =~ s/\n/\\n/gr));
}

$node->stop;
done_testing();

sub sql_literal
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "E'" . ($s =~ s/\\/\\\\/gr) . "'";
}

sub series_key
{
	my ($name, $labels) = @_;
	return join("\0", $name, map { "$_=$labels->{$_}" } sort keys %$labels);
}

# A strict reader of the text format, version 0.0.4. Returns the families (name => type), the
# samples ({name, labels, value}) and a list of problems, one per bad line.
sub parse_exposition
{
	my ($text) = @_;
	my (%type, %help, %seen_family, %series, @samples, @problems);
	my $current = '';
	my $name_re = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
	my $value_re = qr/(?:[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|NaN|[+-]Inf)/;
	push @problems, 'the text does not end with a line feed' unless $text =~ /\n\z/;
	my @lines = split /\n/, $text, -1;
	pop @lines if @lines && $lines[-1] eq '';
	my $n = 0;
	for my $line (@lines)
	{
		$n++;
		if ($line eq '')
		{
			push @problems, "line $n: empty";
		}
		elsif ($line =~ /^# HELP ($name_re) (.*)$/)
		{
			my ($name, $doc) = ($1, $2);
			push @problems, "line $n: second HELP for $name" if $help{$name}++;
			push @problems, "line $n: bad escape in HELP" if $doc =~ /\\(?![\\n])/;
		}
		elsif ($line =~ /^# TYPE ($name_re) (\S+)$/)
		{
			my ($name, $t) = ($1, $2);
			push @problems, "line $n: unknown type $t"
			  unless $t =~ /^(?:counter|gauge|histogram|summary|untyped)$/;
			push @problems, "line $n: second TYPE for $name" if exists $type{$name};
			push @problems, "line $n: TYPE after samples of $name" if $seen_family{$name};
			$type{$name} = $t;
		}
		elsif ($line =~ /^#/)
		{
			push @problems, "line $n: HELP or TYPE line that does not parse" if $line =~ /^# (?:HELP|TYPE)\b/;
		}
		elsif ($line =~ /^($name_re)(.*)$/)
		{
			my ($name, $rest) = ($1, $2);
			my %labels;
			if ($rest =~ s/^\{//)
			{
				my $ok = 0;
				while (1)
				{
					if ($rest =~ s/^\}//) { $ok = 1; last; }
					unless ($rest =~ s/^([a-zA-Z_][a-zA-Z0-9_]*)="//)
					{
						last;
					}
					my $label = $1;
					push @problems, "line $n: reserved label name $label" if $label =~ /^__/;
					push @problems, "line $n: label $label twice" if exists $labels{$label};
					my $value = '';
					my $closed = 0;
					while (length $rest)
					{
						my $c = substr($rest, 0, 1, '');
						if ($c eq '"') { $closed = 1; last; }
						if ($c eq '\\')
						{
							my $e = substr($rest, 0, 1, '');
							if ($e eq '\\') { $value .= '\\'; }
							elsif ($e eq '"') { $value .= '"'; }
							elsif ($e eq 'n') { $value .= "\n"; }
							else { push @problems, "line $n: bad escape \\$e"; }
							next;
						}
						$value .= $c;
					}
					last unless $closed;
					$labels{$label} = $value;
					next if $rest =~ s/^,(?=[a-zA-Z_])//;
					if ($rest =~ s/^\}//) { $ok = 1; last; }
					last;
				}
				unless ($ok)
				{
					push @problems, "line $n: labels do not parse: $line";
					next;
				}
			}
			unless ($rest =~ /^ ($value_re)(?: (-?\d+))?$/)
			{
				push @problems, "line $n: value does not parse: $line";
				next;
			}
			my $value = $1;
			if ($name ne $current)
			{
				push @problems, "line $n: samples of $name are split" if $seen_family{$name};
				$seen_family{$name} = 1;
				$current = $name;
			}
			my $key = series_key($name, \%labels);
			push @problems, "line $n: $name with the same labels twice" if $series{$key}++;
			push @samples, { name => $name, labels => \%labels, value => $value };
		}
		else
		{
			push @problems, "line $n: neither a sample nor a comment: $line";
		}
	}
	return (\%type, \@samples, @problems);
}
