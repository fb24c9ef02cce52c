#!/usr/bin/perl
# Streaming through ngx_muse_module and the scripted test engine (TESTPLAN 8, 10, 18, 20, 21,
# 24 in small): events flushed one by one (time-stamped), errors before and after the first
# byte, bodies spilled to temp files, cancel frees the slot, no free slot -> 503 Retry-After.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use JSON::PP;
use MuseNginx;
use Test::More;
use Digest::SHA;

my $why = MuseNginx::missing();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
$n->start_engine('--gap-ms', '150', '--slots', '2');
$n->start_nginx;

sub body {
    my ($text, %extra) = @_;
    return JSON::PP->new->canonical->encode(
        { messages => [{ role => 'user', content => $text }], %extra });
}

# 18: happy path, flushed one by one
my $r = $n->chat(body('hi', stream => JSON::PP::true, stream_options => { include_usage => JSON::PP::true }));
is($r->{status}, 200, 'stream: 200');
like($r->{headers}{'content-type'}, qr{^text/event-stream}, 'text/event-stream');
my @ev = @{ $r->{events} };
is(scalar @ev, 7, 'role, 3 deltas, finish, usage, [DONE]') or diag($r->{body});
is($ev[-1]{text}, 'data: [DONE]', 'ends with [DONE]');
my @chunks = map { $_->{text} =~ /^data: (\{.*\})$/ ? decode_json($1) : () } @ev;
is(join('', map { $_->{choices}[0]{delta}{content} // '' } @chunks), 'Hello world!', 'text');
is($chunks[4]{choices}[0]{finish_reason}, 'stop', 'finish chunk');
ok($chunks[5]{usage}, 'usage chunk');
my $gap1 = $ev[2]{t} - $ev[1]{t};
my $gap2 = $ev[3]{t} - $ev[2]{t};
ok($gap1 > 0.05 && $gap2 > 0.05, sprintf('deltas arrive one by one (gaps %.3f, %.3f s)', $gap1, $gap2));
ok($ev[0]{t} < 0.5 && $ev[0]{t} < $ev[1]{t} - 0.05, sprintf('role chunk flushed at once (%.3f s), before the first delta', $ev[0]{t}));

# non-streaming
$r = $n->chat(body('hi'));
is($r->{status}, 200, 'non-stream: 200');
is($r->{json}{choices}[0]{message}{content}, 'Hello world!', 'non-stream body');
$r = $n->request('POST', '/v1/completions', '{"prompt":"hi"}');
is($r->{json}{object}, 'text_completion', 'completions endpoint');

# 8: engine error before any byte keeps its status, no SSE byte
$r = $n->chat(body('CTX', stream => JSON::PP::true));
is($r->{status}, 400, 'context_length_exceeded: 400');
is($r->{json}{error}{code}, 'context_length_exceeded', 'code');
like($r->{headers}{'content-type'}, qr{application/json}, 'JSON, not SSE');

# 20: error after the stream started
$r = $n->chat(body('ERRMID', stream => JSON::PP::true));
is($r->{status}, 200, 'mid-stream error: 200 already sent');
like($r->{events}[-1]{text}, qr/^data: \{"error":/, 'last event is data: {"error":...}');
ok(!grep({ $_->{text} eq 'data: [DONE]' } @{ $r->{events} }), 'no [DONE] after an error');

# keepalive comment
$r = $n->chat(body('KEEPALIVE', stream => JSON::PP::true));
is($r->{events}[0]{text}, ': keepalive', 'keepalive comment line first');

# 10: body spilled to a temp file == in memory; cache scope passed along
my $pad = 'p' x 30000;   # over client_body_buffer_size 16k
my $small = body('ECHO', user => 'u');
my $spilled = body('ECHO', user => $pad);
$r = $n->chat($small, 'X-Tenant' => 'team-a');
my $echo = decode_json($r->{json}{choices}[0]{message}{content});
# the scope crosses as HMAC-SHA-256 under the engine's key, never as the value itself
is($echo->{scope}, Digest::SHA::hmac_sha256_hex('team-a', pack('H*', $echo->{scope_key})),
   'cache scope reaches the engine as its keyed digest');
unlike($echo->{scope} . $echo->{body}, qr/team-a/, 'the scope value itself is not in the record');
my $long = 'k' x 5000;    # issue 14: scopes of any length (Bearer + a 256-byte key, and more)
$r = $n->chat($small, 'X-Tenant' => $long);
is($r->{status}, 200, 'a 5000-byte scope is served');
$echo = decode_json($r->{json}{choices}[0]{message}{content});
is($echo->{scope}, Digest::SHA::hmac_sha256_hex($long, pack('H*', $echo->{scope_key})),
   'a 5000-byte scope: its digest');
$r = $n->chat($small, 'X-Tenant' => 'team-b');
isnt(decode_json($r->{json}{choices}[0]{message}{content})->{scope},
     Digest::SHA::hmac_sha256_hex('team-a', pack('H*', $echo->{scope_key})),
     'another scope, another digest');
is_deeply(decode_json($echo->{body}), decode_json($small), 'engine got the validated body');
$r = $n->chat($spilled);
$echo = eval { decode_json($r->{json}{choices}[0]{message}{content}) };
is_deeply($echo ? decode_json($echo->{body}) : undef, decode_json($spilled),
          'body spilled to a temp file arrives intact');
like($n->error_log, qr/a client request body is buffered to a temporary file/, 'it did spill');

# 21: client disconnect while queued/running -> slot freed (engine reports running 0)
for my $k (1 .. 2) {
    my $s = $n->connect_raw;
    my $b = body('HANG', stream => JSON::PP::true);
    print $s "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        . "Content-Length: " . length($b) . "\r\n\r\n$b";
    push @{ $n->{held} }, $s;
}
ok(MuseNginx::wait_until(3, sub {
    my $h = $n->request('GET', '/health');
    $h->{json} && $h->{json}{streams}{running} == 2 && $h->{json}{streams}{slots_busy} == 2;
}), 'two hanging requests hold both engine slots');
# 24 in small: both slots busy -> 503 + Retry-After, fast
$r = $n->chat(body('hi'));
is($r->{status}, 503, 'no free slot: 503');
is($r->{headers}{'retry-after'}, '1', 'Retry-After');
is($r->{json}{error}{code}, 'engine_unavailable', 'engine_unavailable');
close $_ for @{ delete $n->{held} };
my $freed = MuseNginx::wait_until(3, sub {
    my $h = $n->request('GET', '/health');
    $h->{json} && $h->{json}{streams}{running} == 0 && $h->{json}{streams}{slots_busy} == 0;
});
ok($freed, 'client disconnect cancels: streams and shared-memory slots back to 0');
$r = $n->chat(body('hi'));
is($r->{status}, 200, 'served again after the cancels');

# queue timeout path: a hung request gets 503 within muse_queue_timeout
$r = $n->chat(body('HANG'), timeout => 8);
is($r->{status}, 503, 'no engine answer within muse_queue_timeout: 503');
is($r->{json}{error}{code}, 'queue_timeout', 'queue_timeout code');

is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
done_testing();
