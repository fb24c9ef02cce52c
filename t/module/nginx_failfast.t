#!/usr/bin/perl
# Issue 23, items 1, 2 and 4, through nginx + ngx_muse_module + the scripted test engine:
# a stopped engine (SIGSTOP under load) fails new requests and /health within
# muse_handshake_timeout, never the queue timeout; an engine killed and restarted at once, many
# times, never shows as a 200 with the dead engine's pid while streams run all along; and
# /health's reason follows the current cause as it changes.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use IO::Socket::UNIX;
use JSON::PP;
use MuseNginx;
use POSIX qw(:sys_wait_h);
use Socket qw(SOCK_STREAM);
use Test::More;
use Time::HiRes qw(time sleep);

my $why = MuseNginx::missing();
plan skip_all => $why if $why;

my $MSG = '{"messages":[{"role":"user","content":"hi"}]}';
my $STREAM = '{"messages":[{"role":"user","content":"hi"}],"stream":true}';
my $HANG = '{"messages":[{"role":"user","content":"HANG"}],"stream":true}';
my $n = MuseNginx->new;
# the hardened config's 30 s queue timeout: a hang would show as 30 s, not 1
(my $loc = $n->default_locations) =~ s/muse_queue_timeout 3s/muse_queue_timeout 30s/;
$n->start_nginx(locations => $loc);

sub after_case {
    my ($name) = @_;
    is(join("\n", $n->bad_log_lines), '', "$name: no [alert]/[crit] in error.log");
}
sub health_reason { my $r = $n->health; ($r->{status}, $r->{json} ? $r->{json}{reason} // '' : '') }

# ---- item 4: /health's reason is the current cause, and follows it ----
my ($st, $reason) = health_reason();
is($st, 503, '4 no socket: 503');
like($reason, qr/no socket/, "4 no socket: reason '$reason'");

$n->start_engine('--abi', '1');
($st, $reason) = health_reason();
is($st, 503, '4 other ABI: 503');
like($reason, qr/another ABI version/, "4 other ABI: reason now '$reason'");
$n->stop_engine('KILL');

# a listener of the engine's user that answers with something else than a hello
unlink $n->{socket};
my $liar = IO::Socket::UNIX->new(Type => SOCK_STREAM, Local => $n->{socket}, Listen => 16)
    or die "listen: $!";
my $kid = fork // die "fork: $!";
if ($kid == 0) {
    $SIG{ALRM} = sub { POSIX::_exit(0) };
    alarm 30;
    while (my $c = $liar->accept) { syswrite($c, 'x' x 64); close $c }
    POSIX::_exit(0);
}
($st, $reason) = health_reason();
is($st, 503, '4 not a muse engine: 503');
like($reason, qr/does not speak the muse protocol/, "4 not a muse engine: reason now '$reason'");
kill 'KILL', $kid;
waitpid($kid, 0);

# the same listener, nobody accepting: a stopped engine's backlog
my $t0 = time;
($st, $reason) = health_reason();
my $took = time - $t0;
is($st, 503, '4 nobody accepts: 503');
like($reason, qr/does not answer/, "4 nobody accepts: reason now '$reason'");
ok($took < 2, sprintf('4 nobody accepts: answered in %.2f s (muse_handshake_timeout 1 s)', $took));
close $liar;
unlink $n->{socket};

$n->start_engine;
($st, $reason) = health_reason();
is($st, 200, '4 engine up: 200');
is($reason, '', '4 engine up: no reason left over');
$n->stop_engine('KILL');    # the socket goes: "no socket" again
($st, $reason) = health_reason();
like($reason, qr/no socket/, "4 engine gone: reason '$reason'");
$n->start_engine('--health', 'fatal');
($st, $reason) = health_reason();
is($st, 503, '4 fatal: 503');
like($reason, qr/fatal/, "4 fatal: reason now '$reason'");
after_case('4');

# ---- item 1: SIGSTOP under load: new requests and /health fail within the handshake bound ----
$n->start_engine('--slots', 8);
is($n->chat($MSG)->{status}, 200, '1: served before the stop');
my @load = map { $n->open_post('/v1/chat/completions', $HANG) } 1 .. 3;
sleep 0.2;
kill 'STOP', $n->engine_pid;
# the chat after the stop: a thread still running could send its hello (then the queue timeout)
ok(MuseNginx::wait_stopped($n->engine_pid, 2), '1: every engine thread stopped');
my $t_stop = time;
my $r = $n->chat($MSG, timeout => 8);
my $chat_s = time - $t_stop;
is($r->{status}, 503, sprintf('1: a chat sent right after STOP: 503 in %.2f s', $chat_s));
ok($chat_s < 2, '1: within the handshake timeout (1 s), not muse_queue_timeout (30 s)');
is($r->{json} && $r->{json}{error}{code}, 'engine_unavailable', '1: JSON engine_unavailable');
like($r->{headers}{'retry-after'} // '', qr/^\d+$/, '1: Retry-After');
my $t_h = time;
$r = $n->health;
my $health_s = time - $t_stop;
is($r->{status}, 503, sprintf('1: /health 503, %.2f s after STOP (%.2f s its own)', $health_s, time - $t_h));
ok(time - $t_h < 2, '1: /health answers within the handshake bound');
like($r->{json}{reason} // '', qr/does not answer/, "1: /health says why: " . ($r->{json}{reason} // ''));
my @more = map { my $t = time; my $x = $n->chat($STREAM, timeout => 8); [$x, time - $t] } 1 .. 3;
is(scalar(grep { $_->[0]{status} == 503 && $_->[1] < 2 } @more), 3,
   sprintf('1: three more requests: 503 each within 2 s (%s s)', join(', ', map { sprintf '%.2f', $_->[1] } @more)));
kill 'CONT', $n->engine_pid;
$r = MuseNginx::wait_until(3, sub { my $x = $n->health; $x->{status} == 200 ? $x : undef });
ok($r, '1: /health 200 after CONT');
$r = MuseNginx::wait_until(3, sub { my $x = $n->chat($MSG); $x->{status} == 200 ? $x : undef });
ok($r, '1: served again after CONT');
close $_ for @load;
after_case('1');

# ---- item 2: kill -9 and restart at once, many times, /health polled and streams running ----
my $dir = $n->dir;
my $CYCLES = $ENV{MUSE_RESTART_CYCLES} // 20;
my @life;    # [pid, spawned, died, ready]
sub spawn_engine { my $t = time; my $pid = $n->start_engine('--slots', 8, '--gap-ms', 5); push @life, [$pid, $t, undef, time]; $pid }
$n->stop_engine;
spawn_engine();
# children: one polls /health, one streams, back to back, each logging what it saw
sub child {
    my ($file, $code) = @_;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;
    open my $out, '>', $file or POSIX::_exit(1);
    $out->autoflush(1);
    my $stop = 0;
    $SIG{TERM} = sub { $stop = 1 };
    $code->($out, \$stop) until $stop;
    close $out;
    POSIX::_exit(0);
}
my $poller = child("$dir/health.log", sub {
    my ($out) = @_;
    my $ts = time;
    my $x = $n->health;
    my $pid = $x->{json} && $x->{json}{engine} ? $x->{json}{engine}{pid} // 0 : 0;
    printf $out "%.6f %.6f %d %d\n", $ts, time, $x->{status}, $pid;
    sleep 0.07;    # as a load balancer polls: most restarts fall between two polls
});
my $streamer = child("$dir/streams.log", sub {
    my ($out) = @_;
    my $ts = time;
    my $x = $n->chat($STREAM, timeout => 5);
    my $last = MuseNginx::last_event($x);
    my $kind = $x->{status} == 503 && $x->{json} && $x->{json}{error} ? 'refused'
             : $x->{status} == 200 && MuseNginx::content_of($x) eq 'Hello world!' && $last eq 'data: [DONE]' ? 'done'
             : $x->{status} == 200 && $last =~ /^data: \{"error":/ ? 'cut'
             : "bad:$x->{status}";
    printf $out "%.6f %.6f %s\n", $ts, time, $kind;
    sleep 0.2;    # some kills find no stream to cut (a cut one tells the worker at once)
});
my @gaps;
for (1 .. $CYCLES) {
    sleep 0.25;
    my $pid = $n->engine_pid;
    kill 'KILL', $pid;
    waitpid($pid, 0);
    $life[-1][2] = time;
    delete $n->{engine_pid};
    close(delete $n->{engine_fh});
    spawn_engine();    # the socket file stays, as after a crash: the new engine replaces it
    push @gaps, $life[-1][3] - $life[-2][2];
}
sleep 0.5;
kill 'TERM', $poller, $streamer;
waitpid($_, 0) for $poller, $streamer;
my %died = map { $_->[0] => $_->[2] } @life;
my @polls = map { [split] } split /\n/, $n->slurp("$dir/health.log");
my ($ok200, $dead200, $unknown200) = (0, 0, 0);
for my $p (@polls) {
    my ($ts, $te, $status, $pid) = @$p;
    next unless $status == 200;
    $ok200++;
    if (!exists $died{$pid}) { $unknown200++; next }
    # sent after that engine had died: it was answered from a dead engine's segment
    if (defined $died{$pid} && $ts > $died{$pid}) { $dead200++; diag(sprintf 'dead pid %d answered %.3f s after its death', $pid, $ts - $died{$pid}) }
}
my @sorted = sort { $a <=> $b } @gaps;
diag(sprintf '2: %d restarts, kill to new engine ready: median %.3f s, max %.3f s; %d /health polls, %d of them 200',
     scalar @gaps, $sorted[@sorted / 2], $sorted[-1], scalar @polls, $ok200);
ok($sorted[@sorted / 2] < 0.1, '2: restarted within 100 ms (median)');
ok(@polls > 2 * $CYCLES, '2: /health polled all along');
ok($ok200 > 0, '2: /health 200 between the restarts');
is($dead200, 0, '2: no 200 with a dead engine\'s pid');
is($unknown200, 0, '2: no 200 with a pid no engine of this test had');
my @streams = map { [split] } split /\n/, $n->slurp("$dir/streams.log");
my %kinds;
$kinds{ $_->[2] =~ s/:.*//r }++ for @streams;
diag('2: streams: ' . join(', ', map { "$_ $kinds{$_}" } sort keys %kinds));
ok(($kinds{done} // 0) > $CYCLES / 2, '2: streams served all along');
is($kinds{bad} // 0, 0, '2: every stream ended with [DONE], an error event, or a JSON 503');
my @slow = grep { $_->[1] - $_->[0] > 2 } @streams;
is(scalar @slow, 0, '2: no stream took more than 2 s to end');
$r = $n->chat($STREAM);
ok($r->{status} == 200 && MuseNginx::last_event($r) eq 'data: [DONE]', '2: the last engine serves');
is($n->health->{json}{engine}{pid}, $n->engine_pid, '2: /health shows the live engine\'s pid');
after_case('2');

done_testing();
