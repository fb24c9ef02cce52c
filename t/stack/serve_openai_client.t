#!/usr/bin/perl
# A client nobody here wrote: the official `openai` npm package (t/node, exact version in
# package.json) against nginx + ngx_muse_module + `muse-engine serve --backend script`:
# streaming and non-streaming chat, a tool-call round trip (call, tool result sent back, answer),
# and errors raised as the SDK's own classes (BadRequestError with param, NotFoundError). Then
# against a real engine (the demo pack): structured outputs as the SDK sends them,
# response_format json_schema (strict) through chat.completions.create, its stream and
# chat.completions.parse (no zod), and json_object; each content JSON.parse()s and its fields
# fit the schema (checked in the driver, and with Python's jsonschema here).
# t/tools/openai_client_e2e.mjs drives the SDK and prints what it saw; this file asserts.
use strict;
use warnings;
use utf8;
use FindBin;
use lib "$FindBin::Bin/../lib";
use Digest::SHA qw(sha256_hex);
use Encode ();
use JSON::PP;
use MuseNginx;
use Test::More;
use Time::HiRes qw(time);

binmode(Test::More->builder->$_, ':encoding(UTF-8)') for qw(output failure_output todo_output);

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;
my $root = MuseNginx::root();
plan skip_all => MuseNginx::_in_ci('node not installed') unless system('node --version >/dev/null 2>&1') == 0;
unless (-f "$root/t/node/node_modules/openai/package.json") {
    my $npm = `npm ci --prefix '$root/t/node' --no-audit --no-fund --loglevel=error 2>&1`;
    plan skip_all => MuseNginx::_in_ci("npm ci --prefix t/node failed: $npm") if $?;
}

my %C = %MuseNginx::CTL;
sub bytes_of { my $b = Encode::encode('UTF-8', $_[0]); map { ord } split //, $b }
my $ANSWER = 'It is sunny in Paris. ☀';
my $ATEM = "<atem:function_calls>\n<atem:invoke name=\"weather.get\">\n"
    . "<atem:parameter name=\"city\">Paris</atem:parameter>\n"
    . "<atem:parameter name=\"days\">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
my @S = ([bytes_of(' to=self'), $C{message}, bytes_of('Think.'), $C{eom},
          $C{start}, bytes_of('assistant to=user'), $C{message}, bytes_of($ANSWER), $C{eot}],
         [bytes_of(' to=self'), $C{message}, bytes_of('Need weather.'), $C{eom},
          $C{start}, bytes_of('assistant to=weather.get'), $C{message}, bytes_of($ATEM), $C{eom}, $C{eot}]);

my $n = MuseNginx->new;
$n->start_real_engine(backend => 'script', script => \@S, args => ['--script-delay-ms', 1]);
$n->start_nginx;
my $t0 = time;
my $out = `node '$root/t/tools/openai_client_e2e.mjs' 'http://127.0.0.1:@{[$n->port]}/v1' 2>&1`;
my $node_s = time - $t0;
my $r = eval { JSON::PP->new->utf8->decode($out) };
ok($r, 'the node driver ran and printed its JSON') or diag($out);
$r //= {};
diag("openai $r->{sdk_version}, node driver ${\ sprintf('%.1f', $node_s)} s");

is_deeply($r->{models}, ['muse-spark'], 'models.list: the served id');

my $s = $r->{stream} // {};
is($s->{content}, $ANSWER, 'stream: content deltas joined by the SDK');
is($s->{reasoning}, 'Think.', 'stream: reasoning_content deltas');
is($s->{finish}, 'stop', 'stream: finish_reason stop');
is($s->{ids}, 1, 'stream: one id across chunks');
ok($s->{chunks} > 5, "stream: $s->{chunks} chunks");
is($s->{usage} && $s->{usage}{completion_tokens}, scalar @{ $S[0] }, 'stream: usage chunk (include_usage)');

my $ns = $r->{nonstream} // {};
is($ns->{object}, 'chat.completion', 'non-stream: chat.completion');
is($ns->{content}, $ANSWER, 'non-stream: content');
is($ns->{reasoning}, 'Think.', 'non-stream: reasoning_content');
is($ns->{finish}, 'stop', 'non-stream: finish stop');
is($ns->{token_sha}, sha256_hex(pack 'l<*', @{ $S[0] }), 'non-stream: muse.token_sha = the script ids');
is($ns->{usage} && $ns->{usage}{total_tokens}, $ns->{usage} && $ns->{usage}{prompt_tokens} + $ns->{usage}{completion_tokens},
   'non-stream: usage total');

my $t = $r->{tools} // {};
is($t->{finish1}, 'tool_calls', 'tools: first turn finish_reason tool_calls') or diag(JSON::PP->new->encode($t));
is($t->{name}, 'weather.get', 'tools: function name');
is_deeply($t->{args}, { city => 'Paris', days => 3 }, 'tools: arguments parse as JSON');
like($t->{id} // '', qr/^call_/, 'tools: call id');
is($t->{finish2}, 'stop', 'tools: second turn (tool result sent back) finishes');
is($t->{answer}, $ANSWER, 'tools: second turn answer');
ok(($t->{prompt2} // 0) > ($t->{prompt1} // 0), 'tools: the second prompt carries the call and its result');

my $ts = $r->{tools_stream} // {};
is($ts->{finish}, 'tool_calls', 'tools stream: finish_reason tool_calls');
is(scalar @{ $ts->{calls} // [] }, 1, 'tools stream: one call assembled by index');
is_deeply($ts->{calls}[0]{args}, { city => 'Paris', days => 3 }, 'tools stream: arguments');

my $e = $r->{bad_temperature} // {};
is($e->{thrown}, 'BadRequestError', 'temperature 5: the SDK raises BadRequestError');
ok($e->{is_bad_request}, 'temperature 5: instanceof OpenAI.BadRequestError');
is($e->{status}, 400, 'temperature 5: status 400');
is($e->{param}, 'temperature', 'temperature 5: param');
is($e->{type}, 'invalid_request_error', 'temperature 5: type');

$e = $r->{unknown_model} // {};
ok($e->{is_not_found}, 'unknown model: NotFoundError');
is($e->{code}, 'model_not_found', 'unknown model: model_not_found');

is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
ok($n->engine_alive, 'engine alive');

# ---- structured outputs: a real engine behind nginx (the script backend holds no masks) ----
$n->stop_nginx;
$n->start_real_engine(args => ['--streams', '4', '--context', '2048']);
$n->start_nginx;
$t0 = time;
$out = `node '$root/t/tools/openai_client_e2e.mjs' 'http://127.0.0.1:@{[$n->port]}/v1' structured 2>&1`;
$node_s = time - $t0;
my $g = eval { JSON::PP->new->utf8->decode($out) };
ok($g, 'the node driver ran its structured part') or diag($out);
$g //= {};
diag("structured part: node driver ${\ sprintf('%.1f', $node_s)} s");
my $JS = JSON::PP->new->canonical;

my $sc = ref $g->{schema_create} eq 'ARRAY' ? $g->{schema_create} : [];
is(scalar @$sc, 4, 'json_schema: four answers through chat.completions.create')
    or diag($JS->encode($g->{schema_create}));
my @done = grep { $_->{finish} eq 'stop' } @$sc;
ok(@done >= 3, scalar(@done) . ' of 4 finish within max_tokens');
is(scalar(grep { $_->{finish} ne 'stop' && $_->{finish} ne 'length' } @$sc), 0, 'the others end with length');
is_deeply([map { $_->{problems} } @done], [map { [] } @done],
          'json_schema: every finished content JSON.parse()s and its fields fit the schema')
    or diag($JS->encode(\@done));
my %texts = map { $_->{content} => 1 } @done;
ok(keys(%texts) >= 2, 'the answers differ by seed (the check can fail)');

my $ss = $g->{schema_stream} // {};
is($ss->{finish}, 'stop', 'json_schema stream: finish stop') or diag($JS->encode($ss));
is_deeply($ss->{problems}, [], 'json_schema stream: the joined deltas parse and fit the schema');
is($ss->{content}, ($sc->[0] // {})->{content}, 'json_schema stream: the same content as the same seed unstreamed');

my $sp = ref $g->{schema_parse} eq 'ARRAY' ? $g->{schema_parse} : [];
is(scalar @$sp, 2, 'chat.completions.parse: two answers (no zod: a plain json_schema)')
    or diag($JS->encode($g->{schema_parse}));
is_deeply([map { $_->{problems} } @$sp], [[], []], 'parse: message.parsed fits the schema');
is_deeply([map { $_->{parsed} } @$sp], [map { JSON::PP->new->decode($_->{content}) } @$sp],
          'parse: message.parsed is JSON.parse(content)');
is_deeply([map { $_->{content} } @$sp], [map { ($sc->[$_] // {})->{content} } 0, 1],
          'parse: the same contents as create for the same seeds');

if (system('/usr/bin/python3 -c "import jsonschema" 2>/dev/null') == 0) {
    my $schema = {type => 'object', properties => {city => {type => 'string', minLength => 1, maxLength => 12},
                  days => {type => 'integer', minimum => 1, maximum => 14}, units => {enum => ['metric', 'imperial']},
                  tags => {type => 'array', items => {type => 'string', maxLength => 6}, maxItems => 3}},
                  required => [qw(city days units tags)], additionalProperties => JSON::PP::false};
    my @texts = map { $_->{content} } @done, @$sp;
    my $tmp = "$n->{dir}/sdk_answers.json";
    open my $fh, '>:raw', $tmp or die $!;
    print $fh JSON::PP->new->utf8->encode([map { {schema => $schema, text => $_} } @texts]);
    close $fh;
    my @v = `/usr/bin/python3 $root/t/tools/validate_json.py < $tmp`;
    chomp @v;
    is_deeply(\@v, [map { 'ok' } @texts], 'Python\'s jsonschema agrees: ' . scalar(@texts) . ' contents validate');
} else {
    pass('python3-jsonschema not installed: the driver\'s field checks only');
}

my $jo = ref $g->{json_object} eq 'ARRAY' ? $g->{json_object} : [];
my @jdone = grep { $_->{finish} eq 'stop' } @$jo;
is(scalar @$jo, 3, 'json_object: three answers') or diag($JS->encode($g->{json_object}));
ok(@jdone >= 1, scalar(@jdone) . ' of 3 json_object answers finish');
is_deeply([map { $_->{kind} } @jdone], [map { 'object' } @jdone], 'json_object: each finished content is a JSON object');

is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log (real engine)');
ok($n->engine_alive, 'the real engine alive');
done_testing();
