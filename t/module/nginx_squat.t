#!/usr/bin/perl
# Issue 14, items 1, 2 and 6, as a local attacker would try them: an unprivileged user this test
# creates (not in the workers' group) plants segment files under the old /dev/shm names and
# shrinks and grows them in a loop, tries to reach and truncate the engine's real segment, and
# puts a listener of its own where the engine's socket was. Nothing is written to a planted
# object, no worker dies, every truncate fails, and /health says 503 with the reason at once.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;
use Digest::SHA qw(sha256_hex);
use IO::Socket::UNIX;
use POSIX ();
use Socket qw(SOCK_STREAM);
use Time::HiRes qw(time sleep);

my $why = MuseNginx::missing();
plan skip_all => $why if $why;
plan skip_all => 'needs root to create the attacker user' if $> != 0 && !$ENV{CI};
die "cannot run: CI must run this as root\n" if $> != 0;

my $USER = 'muse-squat-t';
system('useradd', '--system', '--no-create-home', '--shell', '/usr/sbin/nologin', $USER) == 0
    or getpwnam($USER) or die "useradd $USER failed";
my (undef, undef, $uid, $gid) = getpwnam($USER);
ok($uid && $uid != 0, "attacker user $USER (uid $uid)");

# Runs $code as the attacker in a child; returns its exit status (0: the code returned true).
sub as_attacker {
    my ($code) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        POSIX::setgid($gid) or POSIX::_exit(90);
        $) = "$gid $gid";
        POSIX::setuid($uid) or POSIX::_exit(91);
        POSIX::_exit($code->() ? 0 : 1);
    }
    waitpid($pid, 0);
    return $? >> 8;
}

my $n = MuseNginx->new;
my $MSG = '{"messages":[{"role":"user","content":"hi"}]}';
$n->start_nginx;
my @workers = $n->worker_pids;

# a copy of a real segment, as the attacker would forge one: header valid, state SERVING
$n->start_engine;
my $path = $n->segment_path;
ok($path, 'the engine\'s segment is a memfd in /proc/<pid>/fd');
like(readlink($path) // '', qr{^/memfd:}, 'anonymous: /memfd:..., not a file in /dev/shm');
ok(!-e "/dev/shm$n->{shm}", 'no file under the segment\'s label in /dev/shm');
open my $fh, '<:raw', $path or die $!;
my $seg = do { local $/; <$fh> };
close $fh;
is($n->chat($MSG)->{status}, 200, 'served by the real engine');

# the attacker cannot reach the real segment, and nobody can resize it
my $pid = $n->engine_pid;
is(as_attacker(sub { open(my $x, '+<', $path) ? 1 : 0 }), 1,
   'the attacker cannot open the engine\'s segment through /proc');
open my $rw, '+<:raw', $path or die $!;
ok(!truncate($rw, 4096) && $!{EPERM}, 'even root: shrinking the segment fails (EPERM, sealed)');
ok(!truncate($rw, 2 * length $seg) && $!{EPERM}, 'growing it fails (EPERM, sealed)');
close $rw;

# ---- squatting: the engine stops; the attacker plants segments under the old names ----
$n->stop_engine('TERM');
my @planted = ("/dev/shm$n->{shm}", '/dev/shm/muse-engine');
substr($seg, 92, 4) = pack('L<', 2);    # state SERVING
my $now_ns = int(Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) * 1e9);
substr($seg, 96, 8) = pack('Q<', $now_ns + 60e9);    # a heartbeat "fresh" for a minute
unlink @planted;
is(as_attacker(sub {
    for my $f (@planted) {
        open(my $o, '>:raw', $f) or return 0;
        print $o $seg;
        close $o;
        chmod 0666, $f;
    }
    1;
}), 0, 'the attacker planted SERVING segments, mode 0666');
my %before = map { $_ => sha256_hex(MuseNginx->slurp($_)) } @planted;
my $r = $n->request('GET', '/health');
is($r->{status}, 503, 'planted segment: /health 503');
like($r->{json}{reason} // '', qr/not running/, '/health names the reason: ' . ($r->{json}{reason} // ''));
for (1 .. 5) { is($n->chat($MSG)->{status}, 503, "planted segment: chat $_ gets 503") }
is(sha256_hex(MuseNginx->slurp($_)), $before{$_}, "nothing written to the planted $_") for @planted;

# ---- a listener of the attacker's own where the socket was ----
is(as_attacker(sub { IO::Socket::UNIX->new(Type => SOCK_STREAM, Local => $n->{socket}, Listen => 5) ? 1 : 0 }),
   1, 'the attacker cannot bind in the socket directory (not writable)');
chmod 0777, $n->dir;    # an operator's mistake after start
my $spy = fork // die;
if ($spy == 0) {
    POSIX::setgid($gid); $) = "$gid $gid"; POSIX::setuid($uid) or POSIX::_exit(91);
    my $l = IO::Socket::UNIX->new(Type => SOCK_STREAM, Local => $n->{socket}, Listen => 5)
        or POSIX::_exit(92);
    open my $out, '>', "/tmp/muse-squat-$$.got" or POSIX::_exit(93);
    chmod 0666, "/tmp/muse-squat-$$.got";
    $SIG{ALRM} = sub { POSIX::_exit(0) };
    alarm 20;
    while (my $c = $l->accept) {
        my $got = '';
        $c->blocking(0);
        sleep 0.2;
        sysread($c, $got, 4096);
        print $out length($got // ''), "\n";
        $out->flush;
    }
    POSIX::_exit(0);
}
MuseNginx::wait_until(3, sub { -S $n->{socket} });
chmod 0755, $n->dir;
$r = $n->chat($MSG);
is($r->{status}, 503, 'a listener held by another user: 503');
$r = $n->request('GET', '/health');
is($r->{status}, 503, 'and /health 503');
like($r->{json}{reason} // '', qr/another user/, 'naming it: ' . ($r->{json}{reason} // ''));
like($n->error_log, qr/held by uid $uid, not by the engine's user/, 'the worker logged who holds the socket');
sleep 0.3;
my $got = MuseNginx->slurp("/tmp/muse-squat-$spy.got") // '';
ok($got !~ /[1-9]/, 'the attacker\'s listener received no byte from the worker');
kill 'TERM', $spy;
waitpid($spy, 0);
unlink "/tmp/muse-squat-$spy.got", $n->{socket};

# nginx -t refuses a socket directory others can write, by name
chmod 0777, $n->dir;
my $dir = $n->dir;
my $t = `'@{[MuseNginx::nginx_bin()]}' -e stderr -t -p '$dir' -c '$dir/conf/nginx.conf' 2>&1`;
ok($? != 0 && $t =~ /socket directory "\Q$dir\E" \(mode 0777.*can be written by others/,
   'nginx -t refuses a world-writable socket directory, naming it') or diag($t);
chmod 0755, $dir;

# ---- shrinking: the attacker resizes planted objects in a loop while clients are served ----
$n->start_engine('--slots', '64');
is($n->request('GET', '/health')->{status}, 200, 'a new engine: /health 200 at once');
my $shrinker = fork // die;
if ($shrinker == 0) {
    POSIX::setgid($gid); $) = "$gid $gid"; POSIX::setuid($uid) or POSIX::_exit(91);
    my $t0 = time;
    my $fails = 0;
    while (time - $t0 < 30) {
        for my $f (@planted) {
            truncate($f, 0);
            truncate($f, length $seg);
        }
        # and the real one, were it reachable
        $fails++ unless open(my $x, '+<', $n->segment_path // '/nonexistent');
    }
    POSIX::_exit(0);
}
my $res = $n->burst(300, sub { MuseNginx::post_bytes('/v1/chat/completions', $MSG) },
                    concurrency => 20, secs => 2, timeout => 30);
kill 'TERM', $shrinker;
waitpid($shrinker, 0);
my $ok = grep { $_->{status} == 200 } @$res;
is($ok, 300, "300 requests while the attacker shrinks and grows: all 200 ($ok)");
is_deeply([$n->worker_pids], \@workers, 'no worker died (same pids)');
unlike($n->error_log, qr/exited on signal/, 'no "exited on signal" in error.log');

# ---- health at once: kill -9, no request in flight ----
$n->stop_engine('KILL');
my $t0 = time;
$r = $n->request('GET', '/health');
is($r->{status}, 503, 'kill -9: /health 503 at once');
ok(time - $t0 < 1, 'without waiting for the heartbeat to go stale');
like($r->{json}{reason} // '', qr/not running/, 'reason: ' . ($r->{json}{reason} // ''));
$n->start_engine;
is($n->request('GET', '/health')->{status}, 200, 'ok again with a live engine');

unlink @planted;
is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
system('userdel', $USER);
done_testing();
