#!/usr/bin/perl
# ngx_muse_module request validation (TESTPLAN 1-7, 9, 11, 13, 14, 16, 17; 2 also at full scale): JSON errors
# with param, before the engine is touched.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;
use Time::HiRes ();

my $why = MuseNginx::missing();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
$n->start_engine;
$n->start_nginx;

my $MSG = '"messages":[{"role":"user","content":"hi"}]';

sub err_is {
    my ($body, $status, $param, $name, %h) = @_;
    my $r = $n->chat($body, %h);
    is($r->{status}, $status, "$name: status $status");
    my $e = $r->{json} && ref $r->{json} eq 'HASH' ? $r->{json}{error} : undef;
    ok($e && defined $e->{message} && defined $e->{type}, "$name: OpenAI error JSON")
        or diag(substr($r->{body}, 0, 300));
    is($e ? $e->{param} : 'no json', $param, "$name: param") if @_ >= 4;
    return $r;
}

# 1: not JSON objects
err_is('{"messages":[', 400, undef, 'truncated JSON');
err_is($_, 400, undef, "body $_") for ('[]', '"x"', 'null', '1');
err_is('', 400, undef, 'empty body');
# 2: deep nesting, many keys, huge string under the limit
err_is(('[' x 20000) . (']' x 20000), 400, undef, '20k-deep nesting');
err_is('{' . join(',', map { "\"k$_\":1" } 1 .. 5000) . ",$MSG,\"stream\":\"no\"}", 400, 'stream',
       '5000 keys, still validated');
my $r = $n->chat("{$MSG,\"user\":\"" . ('a' x 60000) . '"}');
is($r->{status}, 200, 'huge harmless string under the body limit: served');
# 3: duplicate keys
err_is("{$MSG,\"stream\":false,\"stream\":true}", 400, 'stream', 'duplicate key');
# 4: wrong types
err_is("{$MSG,\"stream\":\"true\"}", 400, 'stream', 'stream string');
err_is("{$MSG,\"max_tokens\":\"10\"}", 400, 'max_tokens', 'max_tokens string');
err_is('{"messages":{}}', 400, 'messages', 'messages object');
err_is("{$MSG,\"temperature\":null}", 400, 'temperature', 'temperature null');
err_is('{"model":"muse-spark"}', 400, 'messages', 'messages missing');
# 5: max_tokens out of range
err_is("{$MSG,\"max_tokens\":$_}", 400, 'max_tokens', "max_tokens $_")
    for ('0', '-1', '1.5', '2147483648', '9223372036854775808', '1e308', '1e999');
# issue 14.4: strict JSON (RFC 8259) at the pre-scan: 400 invalid_json naming the byte offset
for my $c (["{$MSG,\"max_tokens\":02}", 'leading zero', '02'],
           ["{$MSG,\"max_tokens\":2.}", 'trailing dot', '.}'],
           ["{$MSG,\"temperature\":.5}", 'leading dot', '.5'],
           ["{$MSG,\"temperature\":+1}", 'plus sign', '+1'],
           ["{\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}", 'raw newline in a string', "\n"],
           ["{\"messages\":[{\"role\":\"user\",\"content\":\"a\x01b\"}]}", 'raw control byte in a string', "\x01"],
           ["{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}", 'raw tab in a string', "\t"],
           ["{\"messages\":[{\"role\":\"user\",\"content\":\"a\\qb\"}]}", 'invalid escape', 'qb'],
           ["{$MSG,\"stop\":[\"a\",]}", 'trailing comma in an array', ']}'],
           ["{$MSG,}", 'trailing comma in an object', '}'],
           ["{$MSG} x", 'bytes after the value', 'x'],
           ["{$MSG,\"user\":'u'}", 'single quotes', "'u"]) {
    my ($body, $name, $at) = @$c;
    my $off = rindex($body, $at);
    $off += 1 if $name eq 'leading zero' || $name eq 'trailing dot';
    $r = err_is($body, 400, undef, "strict JSON: $name");
    my $e = $r->{json} ? $r->{json}{error} : {};
    is($e->{code}, 'invalid_json', "strict JSON: $name: code invalid_json");
    like($e->{message} // '', qr/byte offset $off\b/, "strict JSON: $name: the message names byte offset $off");
}
# issue 14.3: integers reach the engine as written (the scripted engine echoes the body)
for my $seed ('9007199254740991', '9007199254740993', '8000000000000001', '9223372036854775807',
              '18446744073709551615', '-9223372036854775808', '1e3') {
    my $body = "{\"messages\":[{\"role\":\"user\",\"content\":\"ECHO\"}],\"seed\":$seed,\"max_tokens\":16}";
    $r = $n->chat($body);
    my $echo = $r->{status} == 200 ? eval { JSON::PP::decode_json($r->{json}{choices}[0]{message}{content}) } : undef;
    is($echo ? $echo->{body} : "status $r->{status}", $body, "seed $seed: the engine gets the body byte for byte");
}
for my $seed ('18446744073709551616', '-9223372036854775809', '1.5', '1e20') {
    $r = err_is("{$MSG,\"seed\":$seed}", 400, 'seed', "seed $seed");
    like($r->{json} ? $r->{json}{error}{message} : '', qr/-9223372036854775808 to 18446744073709551615/,
         "seed $seed: the message names the range");
}
err_is("{$MSG,\"top_k\":4294967296}", 400, 'top_k', 'top_k 2^32');
err_is("{$MSG,\"n\":18446744073709551617}", 400, 'n', 'n 2^64 + 1');
# 6: n and top_logprobs
err_is("{$MSG,\"n\":$_}", 400, 'n', "n $_") for ('0', '2', '1000000000');
err_is("{$MSG,\"top_logprobs\":$_}", 400, 'top_logprobs', "top_logprobs $_") for ('-1', '21');
# 7: sampling ranges, stop lists
err_is("{$MSG,\"temperature\":$_}", 400, 'temperature', "temperature $_") for ('-0.1', '2.5', '1e300');
err_is("{$MSG,\"top_p\":$_}", 400, 'top_p', "top_p $_") for ('0', '1.01', '-1');
err_is("{$MSG,\"min_p\":$_}", 400, 'min_p', "min_p $_") for ('-0.5', '2');
err_is("{$MSG,\"top_k\":$_}", 400, 'top_k', "top_k $_") for ('-1', '0.5');
err_is("{$MSG,\"temperature\":NaN}", 400, undef, 'NaN literal is not JSON');
err_is("{$MSG,\"stop\":[" . join(',', map { '"s"' } 1 .. 1000) . ']}', 400, 'stop', '1000 stops');
err_is("{$MSG,\"stop\":\"" . ('y' x 40000) . '"}', 400, 'stop', 'huge stop string');
# 9: body too large, plain and chunked
$r = $n->chat("{$MSG,\"user\":\"" . ('a' x 70000) . '"}');
is($r->{status}, 413, '413 over client_max_body_size');
ok($r->{json} && $r->{json}{error}, '413 is JSON') or diag($r->{body});
my $big = "{$MSG,\"user\":\"" . ('a' x 70000) . '"}';
my $chunked = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    . "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
$chunked .= sprintf("%x\r\n%s\r\n", length($_), $_) for unpack('(a8000)*', $big);
$chunked .= "0\r\n\r\n";
$r = $n->raw($chunked);
is($r->{status}, 413, '413 chunked');
ok($r->{json} && $r->{json}{error}, 'chunked 413 is JSON');
# 11: encodings
err_is("{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfeb\"}]}", 400, 'messages',
       'invalid UTF-8');
err_is("{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", 400, 'messages',
       'overlong UTF-8');
err_is("{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", 400, 'messages',
       'encoded surrogate');
err_is('{"messages":[{"role":"user","content":"\ud800x"}]}', 400, undef, 'lone surrogate escape');
err_is('{"messages":[{"role":"user","content":"a\u0000b"}]}', 400, undef, 'NUL escape');
$r = $n->chat('{"messages":[{"role":"user","content":"a\\\\u0000b"}]}');
is($r->{status}, 200, 'escaped backslash before u0000 is plain text');
# 13: unknown harmless vs unsupported semantic fields
$r = $n->chat("{$MSG,\"x_harmless\":{\"a\":1},\"metadata\":{}}");
is($r->{status}, 200, 'unknown harmless field ignored');
err_is("{$MSG,\"$_\":{}}", 400, $_, "unsupported $_") for qw(logit_bias);
# response_format: its shape is checked here, its schema's keywords by the engine
err_is("{$MSG,\"response_format\":{}}", 400, 'response_format.type', 'response_format without a type');
err_is("{$MSG,\"response_format\":{\"type\":\"json_schema\"}}", 400, 'response_format.json_schema',
       'json_schema without its object');
err_is("{$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":3}}}", 400,
       'response_format.json_schema.schema', 'a schema that is no object');
err_is("{$MSG,\"logprobs\":true}", 400, 'logprobs', 'logprobs true');
err_is("{$MSG,\"frequency_penalty\":0.5}", 400, 'frequency_penalty', 'frequency_penalty');
err_is('{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}',
       400, 'messages[0].content[0]', 'image part refused');
# 14: tool schemas
err_is("{$MSG,\"tools\":{}}", 400, 'tools', 'tools not an array');
err_is("{$MSG,\"tools\":[1]}", 400, 'tools[0]', 'tool not an object');
my $deep = ('{"type":"object","properties":{"a":' x 70) . '{}' . ('}}' x 70);
err_is("{$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":$deep}}]}",
       400, 'tools[0].function.parameters', 'tool schema 70 deep');
err_is("{$MSG,\"tool_choice\":\"sometimes\"}", 400, 'tool_choice', 'bad tool_choice');
$r = $n->chat("{$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}");
is($r->{status}, 200, 'valid tools accepted');
# 16: model and key
$r = err_is("{$MSG,\"model\":\"gpt-4\"}", 404, 'model', 'unknown model');
is($r->{json}{error}{code}, 'model_not_found', 'code model_not_found');
$r = $n->chat("{$MSG,\"model\":\"muse-spark\"}");
is($r->{status}, 200, 'served model id accepted');
# 17: framing abuse
$r = $n->raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
             . "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
is($r->{status}, 400, 'CL + TE: 400');
$r = $n->raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
is($r->{status}, 400, 'bad chunk size: 400');
ok($r->{json}, 'bad chunk size: JSON error page');
$r = $n->raw("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " . ('a' x 20000) . "\r\n\r\n");
ok($r->{status} == 400 || $r->{status} == 494, "huge header: $r->{status}");
$r = $n->raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: gzip\r\n\r\nxx");
is($r->{status}, 501, 'unknown Transfer-Encoding: 501');
ok($r->{json} && $r->{json}{error}, '501: JSON error page') or diag(substr($r->{body} // '', 0, 200));
$r = $n->raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
             . "ffffffffffffffffffff\r\n");
ok($r->{status} == 400 || $r->{status} == 413, "chunk size past 2^64: $r->{status}");
$r = $n->raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n12345");
is($r->{status}, 400, 'two Content-Lengths: 400');
# the worker's memory stays flat over many rounds of the abuse above
my @abuse = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: gzip\r\n\r\nxx",
             "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " . ('a' x 20000) . "\r\n\r\n",
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
             . "8000\r\n" . ('{' x 0x8000) . "\r\n0\r\n\r\n");
my ($w17) = $n->worker_pids;
$n->raw($_) for (@abuse) x 20;    # warm the worker's pools and caches
my $rss17a = MuseNginx::proc_rss_kb($w17);
$n->raw($_) for (@abuse) x 200;
my $rss17b = MuseNginx::proc_rss_kb($w17);
ok($rss17b - $rss17a < 512, "17: worker memory flat over 1000 abusive requests (VmRSS $rss17a -> $rss17b KiB)");
# 405, models
$r = $n->request('GET', '/v1/chat/completions');
is($r->{status}, 405, 'GET on chat: 405');
ok($r->{json} && $r->{json}{error}, '405 JSON');
$r = $n->request('GET', '/v1/models');
is($r->{status}, 200, '/v1/models');
is($r->{json}{data}[0]{id}, 'muse-spark', 'model id listed');

is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
$n->stop_nginx;

# 16: API key (constant-time compare) on its own server
my $k = MuseNginx->new;
open my $fh, '>', $k->dir . '/keys' or die;
print $fh "# keys\nsk-test-one\n  sk-test-two  \n";
close $fh;
$k->start_engine;
$k->start_nginx(locations => "        location = /v1/chat/completions { muse_serve chat; "
                . "muse_api_key_file " . $k->dir . "/keys; }\n");
$r = $k->chat("{$MSG}");
is($r->{status}, 401, 'missing key: 401');
ok($r->{json} && $r->{json}{error}, '401 JSON');
is($k->chat("{$MSG}", Authorization => 'Bearer sk-test-on')->{status}, 401, 'prefix key: 401');
is($k->chat("{$MSG}", Authorization => 'Bearer sk-test-onex')->{status}, 401, 'longer key: 401');
is($k->chat("{$MSG}", Authorization => 'Bearer sk-test-one')->{status}, 200, 'key one: 200');
is($k->chat("{$MSG}", Authorization => 'Bearer sk-test-two')->{status}, 200, 'key two: 200');
is(join("\n", $k->bad_log_lines), '', 'no [alert]/[crit] in error.log');

# 2 at the plan's scale, under a 32 MB body limit: refused by counting, before the JSON parser
# allocates for it; the worker's peak memory shows it
my $big_n = MuseNginx->new;
$big_n->start_engine;
$big_n->start_nginx(locations => <<'EOF');
        client_max_body_size 32m;
        client_body_buffer_size 64k;
        location = /v1/chat/completions { muse_serve chat; }
        location = /small { muse_serve chat; muse_max_json_values 10; }
EOF
my ($worker) = $big_n->worker_pids;
sub peak_kb { MuseNginx::proc_status_kb($_[0], 'VmHWM') }
sub big_err {
    my ($body, $status, $like, $name) = @_;
    my $t0 = Time::HiRes::time();
    my $r = $big_n->chat($body);
    my $took = Time::HiRes::time() - $t0;
    is($r->{status}, $status, "$name: status $status");
    like($r->{json} && $r->{json}{error} ? $r->{json}{error}{message} : $r->{body}, $like, "$name: the message says why");
    ok($took < 3, sprintf('%s: answered in %.2f s', $name, $took));
}
$big_n->chat("{$MSG}");    # the worker's ordinary peak first
my $peak0 = peak_kb($worker);
big_err(('[' x 100000) . (']' x 100000), 400, qr/deeper than 200 levels/, '100k-deep nesting');
big_err(('{"a":' x 100000) . '1' . ('}' x 100000), 400, qr/deeper than 200 levels/, '100k-deep objects');
my $deep10k = ('{"type":"object","properties":{"a":' x 10000) . '{}' . ('}}' x 10000);
big_err("{$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":$deep10k}}]}",
        400, qr/deeper than 200 levels/, '14: 10k-deep tool schema');
my $keys = '{' . join(',', map { "\"k$_\":1" } 1 .. 1_000_000) . ",$MSG}";
big_err($keys, 400, qr/muse_max_json_values/, sprintf('1M keys (%.1f MB)', length($keys) / 1e6));
big_err('[' . join(',', (1) x 2_000_000) . ']', 400, qr/muse_max_json_values/, '2M tiny values');
my $peak1 = peak_kb($worker);
# the bodies are 4-14 MB and held once; the parser's ~64 bytes a value would add 64+ MB
ok($peak1 - $peak0 < 40 * 1024, "2: worker peak memory bounded (VmHWM $peak0 -> $peak1 KiB)");
my $huge = "{$MSG,\"user\":\"" . ('a' x (20 << 20)) . '"}';
my $r2 = $big_n->chat($huge);
is($r2->{status}, 413, 'one 20 MB string under the body limit: 413 (the test engine\'s request area is 1 MiB)');
is($r2->{json} && $r2->{json}{error}{code}, 'request_too_large', 'a 413 says request_too_large');
# the limit is the directive's: 10 items (values and keys) pass, 11 do not
my $ten = '{"messages":[{"role":"user","content":"hi"}],"stop":[]}';
is($big_n->request('POST', '/small', $ten)->{status}, 200, 'muse_max_json_values 10: 10 items pass');
(my $eleven = $ten) =~ s/\[\]/["x"]/;
my $r11 = $big_n->request('POST', '/small', $eleven);
is($r11->{status}, 400, 'muse_max_json_values 10: 11 items get 400');
like($r11->{json} ? $r11->{json}{error}{message} : '', qr/muse_max_json_values/, '... naming the directive');
is(join("\n", $big_n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
ok(kill(0, $worker), 'the worker survived');

done_testing();
