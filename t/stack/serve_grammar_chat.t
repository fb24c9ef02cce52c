#!/usr/bin/perl
# Structured outputs on /v1/chat/completions through the real stack: response_format holds the
# to=user answer (content parses and validates with Python's jsonschema), tool_choice "required"
# or a named function holds the call's ATEM body (arguments validate against the function's
# parameters); the first header is self or the answer, reasoning free for up to half of
# max_tokens (the demo model takes self and then the forced answer header); temperature 1.0, several
# seeds; concurrent == solo by token_sha; a bad tool schema is a 400 naming the keyword.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use JSON::PP;
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;
system('/usr/bin/python3 -c "import jsonschema" 2>/dev/null') == 0
    or plan skip_all => 'python3-jsonschema not installed (make deps installs it)';

my $JSON = JSON::PP->new->canonical->utf8;
open my $fh, '<:raw', "$FindBin::Bin/../data/grammar_schemas.json" or die $!;
my $corpus = $JSON->decode(do { local $/; <$fh> });
close $fh;

my $n = MuseNginx->new;
$n->start_real_engine(args => ['--streams', '8', '--queue', '64', '--context', '2048']);
$n->start_nginx;

sub validate {    # [schema, text] pairs: the validator's verdict lines
    my ($pairs) = @_;
    my $tmp = "$n->{dir}/answers.json";
    open my $out, '>:raw', $tmp or die $!;
    print $out $JSON->encode([map { my $t = $_->[1]; utf8::decode($t); {schema => $_->[0], text => $t} } @$pairs]);
    close $out;
    my @v = `/usr/bin/python3 $FindBin::Bin/../tools/validate_json.py < $tmp`;
    chomp @v;
    return @v;
}

sub chat {
    my (%o) = @_;
    return $JSON->encode({messages => [{role => 'user', content => "Answer $o{seed}"}],
                          max_tokens => $o{max} // 360, temperature => 1.0, seed => $o{seed},
                          %{ $o{extra} }});
}
sub rf { {response_format => {type => 'json_schema', json_schema => {name => 't', schema => $_[0], strict => JSON::PP::true}}} }

# ---- response_format: content validates; the header goes to self or user ----
my (@meta, %sha);
my @pick = grep { $_ % 14 == 0 } 0 .. $#$corpus; # 19 of the corpus, spread over it
for my $seed (21, 22) {
    for (my $i = 0; $i < @pick; $i += 8) {
        my @idx = grep { defined } @pick[$i .. $i + 7];
        my $got = $n->together('/v1/chat/completions', [map { chat(seed => $seed, extra => rf($corpus->[$_])) } @idx]);
        for my $k (0 .. $#idx) {
            push @meta, {i => $idx[$k], seed => $seed, r => $got->[$k]};
            $sha{"$idx[$k]/$seed"} = MuseNginx::token_sha($got->[$k]);
        }
    }
}
my @failed = grep { !$_->{r}{choices} } @meta;
is(scalar @failed, 0, scalar(@meta) . ' constrained chat requests succeed')
    or diag(substr(JSON::PP->new->encode($failed[0]{r}), 0, 300));
my @answered = grep { ($_->{r}{choices}[0]{finish_reason} // '') eq 'stop' } @meta;
my @cut = grep { ($_->{r}{choices}[0]{finish_reason} // '') eq 'length' } @meta;
is(@answered + @cut, scalar @meta, 'every chat answer ends with stop or length');
ok(@answered >= 0.5 * @meta, scalar(@answered) . ' of ' . scalar(@meta) . ' go to the answer and finish');
ok(@answered == grep({ length($_->{r}{choices}[0]{message}{reasoning_content} // '') } @answered),
   'the finished answers came after reasoning (to=self, then the forced answer header)');
my @v = validate([map { [$corpus->[$_->{i}], $_->{r}{choices}[0]{message}{content} // ''] } @answered]);
my @bad = grep { $v[$_] ne 'ok' } 0 .. $#v;
is(scalar(@v), scalar(@answered), 'the validator judged every chat answer');
is(scalar @bad, 0, 'every finished chat answer (content) parses and validates');
diag("schema $answered[$_]{i}: $v[$_]: " . $JSON->encode([$answered[$_]{r}{choices}[0]{message}{content}])) for @bad[0 .. ($#bad < 3 ? $#bad : 3)];
my %distinct = map { ($_->{r}{choices}[0]{message}{content} // '') => 1 } @answered;
ok(keys(%distinct) > @answered / 3, 'the chat answers differ (the check can fail)');

my $same = 0;
my @solo = @meta[0, 3, 7];
for (@solo) {
    my $r = $n->together('/v1/chat/completions', [chat(seed => $_->{seed}, extra => rf($corpus->[$_->{i}]))])->[0];
    $same++ if MuseNginx::token_sha($r) eq $sha{"$_->{i}/$_->{seed}"};
}
is($same, scalar @solo, 'constrained chat alone equals the same among others (token_sha)');

# ---- tools: tool_choice required / named: the call's arguments validate ----
my $params = {type => 'object', properties => {city => {type => 'string', maxLength => 20},
                                               days => {type => 'integer', minimum => 1, maximum => 14},
                                               units => {enum => ['metric', 'imperial']}},
              required => ['city', 'days'], additionalProperties => JSON::PP::false};
my $p2 = {type => 'object', properties => {a => {type => 'number'}, b => {type => 'array', items => {type => 'integer'}, maxItems => 4}},
          required => ['a']};
my $tools = [{type => 'function', function => {name => 'weather.get', description => 'Get weather', parameters => $params}},
             {type => 'function', function => {name => 'math_add', description => 'Add', parameters => $p2}}];
my %schema_of = ('weather.get' => $params, math_add => $p2);
my @calls;
for my $choice ('required', {type => 'function', function => {name => 'math_add'}}) {
    my $got = $n->together('/v1/chat/completions', [map { chat(seed => $_, max => 400, extra => {tools => $tools, tool_choice => $choice}) } 1 .. 4]);
    push @calls, map { {choice => $choice, r => $_} } @$got;
}
is(scalar(grep { !$_->{r}{choices} } @calls), 0, scalar(@calls) . ' constrained tool requests succeed');
my @made = grep { ($_->{r}{choices}[0]{finish_reason} // '') eq 'tool_calls' } @calls;
is(scalar(grep { my $f = $_->{r}{choices}[0]{finish_reason} // ''; $f ne 'tool_calls' && $f ne 'length' } @calls), 0,
   'every tool answer ends with tool_calls or length');
ok(@made >= 3, scalar(@made) . ' of ' . scalar(@calls) . ' make their call within max_tokens');
my @pairs = map { my $c = $_->{r}{choices}[0]{message}{tool_calls}[0]; [$schema_of{$c->{function}{name}} // {not => {}}, $c->{function}{arguments}] } @made;
ok(!grep({ ref $_->{choice} && $_->{r}{choices}[0]{message}{tool_calls}[0]{function}{name} ne 'math_add' } @made),
   'a named tool_choice calls that function');
@v = validate(\@pairs);
@bad = grep { $v[$_] ne 'ok' } 0 .. $#v;
is(scalar @bad, 0, 'every call\'s arguments parse and validate against its function\'s parameters');
diag("call $_: $v[$_]: $pairs[$_][1]") for @bad[0 .. ($#bad < 3 ? $#bad : 3)];

# ---- a bad tool schema: 400 naming the keyword ----
my $badtool = [{type => 'function', function => {name => 'f', parameters => {type => 'object', properties => {x => {type => 'string', pattern => 'a+'}}}}}];
my $b = $n->together('/v1/chat/completions', [chat(seed => 1, extra => {tools => $badtool, tool_choice => 'required'})])->[0];
is($b->{status}, 400, 'an unsupported keyword in a required tool is a 400');
like($b->{body} // '', qr/tools\[0\]\.function\.parameters: keyword 'pattern' at '\/properties\/x\/pattern'/, 'the error names the tool, keyword and path');

$n->stop_nginx;
$n->stop_engine;
done_testing();
