#!/usr/bin/perl
# /health and engine restarts through ngx_muse_module (TESTPLAN 29 in small, 30-ish, 36):
# 200 when serving, 503 when the engine is killed, fatal, or speaks another ABI (logged),
# and recovery with a remap when a fresh engine recreates the segment.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
my $MSG = '{"messages":[{"role":"user","content":"hi"}]}';
$n->start_nginx;

my $r = $n->request('GET', '/health');
is($r->{status}, 503, 'no engine yet: 503');
is($r->{json}{status}, 'down', 'status down');
$r = $n->chat($MSG);
is($r->{status}, 503, 'chat without engine: 503');
is($r->{json}{error}{code}, 'engine_unavailable', 'engine_unavailable');
is($r->{headers}{'retry-after'}, '1', 'Retry-After');

$n->start_engine;
$r = $n->request('GET', '/health');
is($r->{status}, 200, 'engine up: 200');
is($r->{json}{status}, 'ok', 'status ok');
ok(defined $r->{json}{engine}{heartbeat_age_ms} && $r->{json}{engine}{heartbeat_age_ms} < 3000,
   'heartbeat_age_ms added by the module');
is($n->chat($MSG)->{status}, 200, 'chat served');
$r = $n->request('GET', '/metrics');
like($r->{body}, qr/^muse_up 1$/m, '/metrics muse_up 1');

# kill -9 with a live stream: the stream ends with an error event, /health 503
my $s = $n->connect_raw;
my $b = '{"messages":[{"role":"user","content":"HANG"}],"stream":true}';
print $s "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    . "Content-Type: application/json\r\nContent-Length: " . length($b) . "\r\n\r\n$b";
Time::HiRes::sleep(0.3);
$n->stop_engine('KILL');
my ($got, $buf) = ('', '');
my $t0 = Time::HiRes::time();
$s->blocking(0);
while (Time::HiRes::time() - $t0 < 3) {
    my $k = sysread($s, $buf, 4096);
    last if defined $k && $k == 0;
    $got .= $buf if $k;
    Time::HiRes::sleep(0.02);
}
like($got, qr{^HTTP/1\.1 503}, 'queued request answered 503 when the engine died');
ok(Time::HiRes::time() - $t0 < 1.5, 'within about a second');
$r = $n->request('GET', '/health');
is($r->{status}, 503, 'engine killed: 503');

# a new engine with another ABI version: refused, logged, no crash
$n->start_engine('--abi', '1');
$r = $n->request('GET', '/health');
is($r->{status}, 503, 'other ABI: /health 503');
$r = $n->chat($MSG);
is($r->{status}, 503, 'other ABI: chat 503');
like($n->error_log, qr/speaks ABI version 1, this module speaks 2/, 'ABI mismatch logged');

# fatal engine
$n->start_engine('--health', 'fatal');
is($n->request('GET', '/health')->{status}, 503, 'fatal engine: 503');
is($n->chat($MSG)->{status}, 503, 'fatal engine: chat 503');

# a fresh engine recreates the segment: the worker remaps and serves again
$n->start_engine;
$r = $n->request('GET', '/health');
is($r->{status}, 200, 'fresh engine: 200');
is($n->chat($MSG)->{status}, 200, 'fresh engine: chat served after remap');

# clean stop marks the segment down
$n->stop_engine('TERM');
is($n->request('GET', '/health')->{status}, 503, 'engine stopped: 503');

# issue 14 item 5: a wrong method on the module's own locations is JSON with Allow
for my $m (['POST', '/health'], ['DELETE', '/metrics'], ['POST', '/v1/models']) {
    my $x = $n->request($m->[0], $m->[1]);
    is($x->{status}, 405, "$m->[0] $m->[1]: 405");
    is($x->{headers}{allow}, 'GET, HEAD', "$m->[0] $m->[1]: Allow: GET, HEAD");
    is($x->{json} && $x->{json}{error}{code}, 'method_not_allowed', "$m->[0] $m->[1]: JSON body");
}
is($n->request('GET', '/v1/chat/completions')->{headers}{allow}, 'POST', 'GET chat: Allow: POST');

is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
done_testing();
