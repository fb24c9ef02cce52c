#!/usr/bin/perl
# Issue 23, item 5: only nginx's workers get the segment. The engine (--worker-key FILE)
# challenges every connection; nginx's master reads the same key file (muse_engine's third
# argument) before it drops privileges, and its workers answer with HMAC-SHA-256 of the nonce.
# A process of the workers' own user without the key that connects to the socket gets the
# challenge only: no descriptor, no hello, closed, and the engine logs it. A wrong key, no key,
# or a key file others can read are refused with messages naming the fix.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;
use Time::HiRes qw(time sleep);

my $why = MuseNginx::missing();
plan skip_all => $why if $why;
plan skip_all => 'python3 missing (the probe reads SCM_RIGHTS)' unless -x '/usr/bin/python3';

my $MSG = '{"messages":[{"role":"user","content":"hi"}]}';
my $n = MuseNginx->new;
my $dir = $n->dir;
my $key = "$dir/worker.key";
sub write_key {
    my ($file, $text, $mode) = @_;
    open my $fh, '>', $file or die $!;
    print $fh "$text\n";
    close $fh;
    chmod $mode, $file;
}
write_key($key, 'a1b2' x 16, 0600);
write_key("$dir/other.key", 'ffee' x 16, 0600);
my $elog = "$dir/logs/engine.err";
sub engine_with {
    my (@args) = @_;
    open my $save, '>&', \*STDERR or die;
    open STDERR, '>>', $elog or die;
    my $ok = eval { $n->start_engine(@args); 1 };
    open STDERR, '>&', $save or die;
    die $@ unless $ok;
}
sub engine_log { $n->slurp($elog) }
(my $loc = $n->default_locations);
sub nginx_with_key {
    my ($file) = @_;
    $n->stop_nginx;
    my $user = MuseNginx::engine_user();
    $n->start_nginx(locations => $loc);
    # the engine line with the key: rewrite the conf and restart
    my $conf = $n->slurp("$dir/conf/nginx.conf");
    $conf =~ s{muse_engine (\S+) (\S+);}{muse_engine $1 $2@{[ $file ? " $file" : '' ]};};
    $n->stop_nginx;
    open my $fh, '>', "$dir/conf/nginx.conf" or die $!;
    print $fh $conf;
    close $fh;
    my $pid = fork // die;
    if ($pid == 0) {
        open STDERR, '>>', "$dir/logs/stderr.log";
        exec MuseNginx::nginx_bin(), '-e', 'stderr', '-p', $dir, '-c', "$dir/conf/nginx.conf";
        exit 127;
    }
    $n->{nginx_pid} = $pid;
    MuseNginx::wait_until(5, sub { IO::Socket::INET->new(PeerAddr => "127.0.0.1:$n->{port}", Timeout => 1) })
        or die 'nginx did not start: ' . $n->slurp("$dir/logs/stderr.log");
}

# ---- the keyed pair serves ----
engine_with('--worker-key', $key);
nginx_with_key($key);
my $r = $n->chat($MSG);
is($r->{status}, 200, 'worker with the key: chat served');
is($n->health->{status}, 200, 'worker with the key: /health 200');

# ---- a process of the workers' user (this test's: root) without the key ----
my $probe = <<'PY';
import json, os, socket, sys, array
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
out = {"fds": 0, "first": "", "after": "", "eof": False}
def take(n):
    data, anc, flags, _ = s.recvmsg(n, socket.CMSG_SPACE(16 * 4))
    for level, kind, blob in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i"); fds.frombytes(blob[: len(blob) - len(blob) % 4])
            out["fds"] += len(fds)
            for fd in fds: os.close(fd)
    return data
s.settimeout(3)
first = take(64)
out["first"] = first[:4].decode("latin-1")
mode = sys.argv[2]
if mode == "guess":
    s.sendall(b"MAUT" + (2).to_bytes(4, "little") + os.urandom(32) + bytes(24))
elif mode == "claim":   # a claim as a worker would send after a hello
    s.sendall(b"MCLM" + (2).to_bytes(4, "little") + bytes(24))
try:
    while True:
        d = take(4096)
        if not d:
            out["eof"] = True
            break
        out["after"] += d[:4].decode("latin-1")
except socket.timeout:
    pass
print(json.dumps(out))
PY
open my $pf, '>', "$dir/probe.py" or die;
print $pf $probe;
close $pf;
for my $mode (qw(guess claim silent)) {
    my $from = length engine_log();
    my $out = `/usr/bin/python3 '$dir/probe.py' '$n->{socket}' $mode 2>&1`;
    my $got = eval { JSON::PP->new->decode($out) } // {};
    is($got->{first}, 'MCHL', "$mode: the peer gets the challenge first") or diag($out);
    is($got->{fds}, 0, "$mode: no descriptor passed");
    is($got->{after}, '', "$mode: no hello, nothing else");
    ok($got->{eof}, "$mode: the engine closes the connection");
    my $log = MuseNginx::wait_until(3, sub { my $l = substr(engine_log(), $from); $l =~ /no segment sent/ ? $l : undef });
    like($log // '', qr/peer \(pid \d+, uid 0, gid \d+\).*no segment sent/, "$mode: the engine logs the refused peer");
}
is($n->chat($MSG)->{status}, 200, 'the workers are still served');

# ---- a worker with the wrong key, and one with none ----
nginx_with_key("$dir/other.key");
my $from = length engine_log();
$r = $n->chat($MSG);
is($r->{status}, 503, 'wrong key: 503');
is($r->{json} && $r->{json}{error}{code}, 'engine_unavailable', 'wrong key: engine_unavailable');
like($n->health->{json}{reason} // '', qr/refused this worker's key/, 'wrong key: /health names it');
like(substr(engine_log(), $from), qr/without the worker key/, 'wrong key: the engine logs it');
nginx_with_key(undef);
$r = $n->chat($MSG);
is($r->{status}, 503, 'no key: 503');
like($n->error_log, qr/asks for the worker key: give muse_engine the key file/, 'no key: error.log names the fix');
like($n->health->{json}{reason} // '', qr/worker key this nginx does not have/, 'no key: /health names it');

# ---- key files others could read: refused by nginx -t and the engine ----
write_key("$dir/loose.key", 'c3d4' x 16, 0640);
my $conf = $n->slurp("$dir/conf/nginx.conf");
$conf =~ s{muse_engine (\S+) (\S+);}{muse_engine $1 $2 $dir/loose.key;};
open my $cf, '>', "$dir/conf/t.conf" or die;
print $cf $conf;
close $cf;
my $t = `'@{[MuseNginx::nginx_bin()]}' -e stderr -t -p '$dir' -c '$dir/conf/t.conf' 2>&1`;
ok($? != 0 && $t =~ /key file \Q$dir\E\/loose.key \(mode 0640.*chmod 0600/, 'nginx -t refuses a group-readable key file, naming it and the fix') or diag($t);
my $e = `'@{[MuseNginx::engine_path()]}' --shm /muse-t-key-$$ --socket '$dir/k.sock' --worker-key '$dir/loose.key' 2>&1 </dev/null`;
ok($? != 0 && $e =~ /loose.key \(mode 0640.*chmod 0600/, 'the engine refuses it too') or diag($e);
symlink($key, "$dir/link.key");
$e = `'@{[MuseNginx::engine_path()]}' --shm /muse-t-key-$$ --socket '$dir/k.sock' --worker-key '$dir/link.key' 2>&1 </dev/null`;
ok($? != 0 && $e =~ /symbolic link/, 'a key file reached through a link: refused') or diag($e);
write_key("$dir/short.key", 'abc', 0600);
$e = `'@{[MuseNginx::engine_path()]}' --shm /muse-t-key-$$ --socket '$dir/k.sock' --worker-key '$dir/short.key' 2>&1 </dev/null`;
ok($? != 0 && $e =~ /holds 3 bytes.*openssl rand -hex 32/, 'a short key: refused with how to make one') or diag($e);

is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
done_testing();
