#!/usr/bin/perl
# Structured outputs through the real stack: a corpus of JSON Schemas (t/data/grammar_schemas.json:
# shapes from JSON Schema's test suite and real API schemas) as response_format json_schema on
# /v1/completions, temperature 1.0: every schema with a seed of its own, every third with two
# more. Every answer that ends (finish_reason stop) parses and validates with Python's
# jsonschema; one cut by max_tokens ("length") is the start of some JSON text (and validates
# when it is already a whole object or array); sixteen streams at once equal each alone by
# token_sha; bad schemas are a 400 naming the keyword and its path. MUSE_TEST_BACKEND=cuda
# (t/tools/gpu_check.sh) on a machine without python3-jsonschema: every complete answer parsed
# with JSON::PP instead of validated; a note gives a digest of the corpus run's token_shas (the
# exact CUDA path's equals the CPU's).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use Digest::SHA qw(sha256_hex);
use JSON::PP;
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;
my $validator = system('/usr/bin/python3 -c "import jsonschema" 2>/dev/null') == 0;
plan skip_all => 'python3-jsonschema not installed (make deps installs it)'
    if !$validator && ($ENV{MUSE_TEST_BACKEND} // 'cpu') eq 'cpu';

my $JSON = JSON::PP->new->canonical->utf8;
open my $fh, '<:raw', "$FindBin::Bin/../data/grammar_schemas.json" or die $!;
my $corpus = $JSON->decode(do { local $/; <$fh> });
close $fh;
ok(@$corpus >= 200, scalar(@$corpus) . ' schemas in the corpus');

my $n = MuseNginx->new;
$n->start_real_engine(args => ['--streams', '16', '--queue', '64', '--context', '512']);
# 48 requests in flight keep the 16 streams busy: the ones queued behind wait longer than 3 s
(my $locations = $n->default_locations) =~ s/muse_queue_timeout 3s/muse_queue_timeout 60s/ or die;
$n->start_nginx(locations => $locations);

sub body {
    my ($schema, $seed, $max) = @_;
    return $JSON->encode({prompt => [1, 2, 3, 4 + $seed % 7], max_tokens => $max // 200,
                          temperature => 1.0, seed => $seed,
                          response_format => {type => 'json_schema',
                                              json_schema => {name => 't', schema => $schema, strict => JSON::PP::true}}});
}

# every schema once with its own seed, every third with two more: [index, seed]
my @runs = map { [$_, 1000 + 7 * $_] } 0 .. $#$corpus;
push @runs, map { ([$_, 11], [$_, 12]) } grep { $_ % 3 == 0 } 0 .. $#$corpus;
my (@meta, %sha);
for (my $k = 0; $k < @runs; $k += 48) {
    my @batch = grep { defined } @runs[$k .. $k + 47];
    my $got = $n->together('/v1/completions', [map { body($corpus->[$_->[0]], $_->[1]) } @batch]);
    for my $j (0 .. $#batch) {
        my ($i, $seed) = @{ $batch[$j] };
        push @meta, {i => $i, seed => $seed, r => $got->[$j]};
        $sha{"$i/$seed"} = MuseNginx::token_sha($got->[$j]);
    }
}
my @failed = grep { !$_->{r}{choices} } @meta;
is(scalar @failed, 0, scalar(@meta) . ' constrained requests succeed')
    or diag(substr(JSON::PP->new->encode($failed[0]{r}), 0, 300));
my @stopped = grep { ($_->{r}{choices}[0]{finish_reason} // '') eq 'stop' } @meta;
my @length = grep { ($_->{r}{choices}[0]{finish_reason} // '') eq 'length' } @meta;
is(@stopped + @length, scalar @meta, 'every answer ends with stop or length');
ok(@stopped >= 0.8 * @meta, scalar(@stopped) . ' of ' . scalar(@meta) . ' answers complete within max_tokens');
my %whole = map { $_->{i} => 1 } @stopped;
ok(keys(%whole) >= 0.9 * @$corpus, scalar(keys %whole) . ' of ' . scalar(@$corpus) . ' schemas have a complete answer');
note('token_sha digest of the corpus run: ' . sha256_hex(join ',', map { $sha{$_} } sort keys %sha));

if ($validator) {
    # the independent check: Python's jsonschema on every answer (a cut one as a prefix)
    # together() decodes replies without utf8: the texts are UTF-8 bytes, made characters here
    my @judged = (@stopped, @length);
    my $in = $JSON->encode([(map {
        my $t = $_->{r}{choices}[0]{text};
        utf8::decode($t);
        {schema => $corpus->[$_->{i}], text => $t,
         partial => ($_->{r}{choices}[0]{finish_reason} eq 'length' ? JSON::PP::true : JSON::PP::false)}
    } @judged), # and two that must fail: the checks can
        {schema => {type => 'integer'}, text => '"7"', partial => JSON::PP::false},
        {schema => {type => 'array'}, text => '[1,]', partial => JSON::PP::true}]);
    my $tmp = "$n->{dir}/answers.json";
    open my $out, '>:raw', $tmp or die $!;
    print $out $in;
    close $out;
    my @verdict = `/usr/bin/python3 $FindBin::Bin/../tools/validate_json.py < $tmp`;
    chomp @verdict;
    my @canary = splice @verdict, scalar @judged;
    ok(@canary == 2 && !grep({ !/^bad: / } @canary), 'the validator refuses a wrong answer and a bad prefix');
    is(scalar @verdict, scalar @judged, 'the validator judged every answer');
    my @bad = grep { $verdict[$_] ne 'ok' } 0 .. $#verdict;
    my @bad_whole = grep { $_ < @stopped } @bad;
    is(scalar @bad_whole, 0, 'every complete answer parses and validates against its schema');
    is(scalar(@bad) - scalar(@bad_whole), 0, 'every answer cut by max_tokens is the start of a JSON text');
    for (@bad[0 .. ($#bad < 4 ? $#bad : 4)]) {
        diag("schema $judged[$_]{i} seed $judged[$_]{seed}: $verdict[$_]: "
             . $JSON->encode([$judged[$_]{r}{choices}[0]{text}]));
    }
} else { # a GPU machine without Debian's packages: the answers parse, no schema validation
    my $parse = JSON::PP->new->utf8->allow_nonref; # the texts are UTF-8 bytes
    my @unparsed = grep { my $t = $_->{r}{choices}[0]{text}; !eval { $parse->decode($t); 1 } } @stopped;
    pass('python3-jsonschema missing here (backend ' . ($ENV{MUSE_TEST_BACKEND} // 'cpu') . '): answers parsed only');
    is(scalar @unparsed, 0, 'every complete answer parses as JSON')
        or diag($JSON->encode([$unparsed[0]{r}{choices}[0]{text}]));
}
my %distinct = map { $_->{r}{choices}[0]{text} => 1 } @stopped;
ok(keys(%distinct) > @stopped / 3, 'the answers differ (the check can fail)');

# exactness: a stream alone gives the tokens it gave among the others
my @solo = map { [$_, 1000 + 7 * $_] } 0, 5, 17, 33, 41, 60, 120, 200;
my $same = 0;
for (@solo) {
    my ($i, $seed) = @$_;
    my $r = $n->together('/v1/completions', [body($corpus->[$i], $seed)])->[0];
    $same++ if MuseNginx::token_sha($r) eq $sha{"$i/$seed"};
}
is($same, scalar @solo, 'constrained streams alone equal the same among others (token_sha)');

# the prompt cache keys include the constraint: the same constrained prompt again resumes and
# gives the same tokens; another schema on the same prompt does not take that entry
my @long = map { 20 + 3 * $_ } 1 .. 40;
sub lbody {
    my ($schema, $seed) = @_;
    return $JSON->encode({prompt => \@long, max_tokens => 120, temperature => 1.0, seed => $seed,
                          response_format => {type => 'json_schema', json_schema => {name => 'c', schema => $schema}}});
}
sub cached { ($_[0]{usage}{prompt_tokens_details} // {})->{cached_tokens} // 0 }
my $fresh = $n->together('/v1/completions', [lbody($corpus->[3], 7)])->[0];
my $again = $n->together('/v1/completions', [lbody($corpus->[3], 7)])->[0];
ok(cached($fresh) == 0 && cached($again) >= 32, 'the constrained prompt sent again resumes from the cache (' . cached($again) . ' tokens)');
is(MuseNginx::token_sha($again), MuseNginx::token_sha($fresh), 'constrained: resumed == fresh (token_sha)');
my $other = $n->together('/v1/completions', [lbody($corpus->[4], 7)])->[0];
is(cached($other), 0, 'another schema on the same prompt resumes nothing: the key includes the constraint');
my $free = $n->together('/v1/completions', [$JSON->encode({prompt => \@long, max_tokens => 4, seed => 7})])->[0];
is(cached($free), 0, 'an unconstrained request on the same prompt does not take the constrained entry');

# max_tokens mid-value: length, the partial text as it is
my $r = $n->together('/v1/completions', [body($corpus->[40], 5, 3)])->[0];
is($r->{choices}[0]{finish_reason}, 'length', 'max_tokens reached mid-value: finish_reason length');

# json_object: an object every time
my @objs = @{ $n->together('/v1/completions', [map {
    $JSON->encode({prompt => [5, 6], max_tokens => 200, temperature => 1.0, seed => $_,
                   response_format => {type => 'json_object'}}) } 1 .. 4]) };
my @ended = grep { $_->{choices} && $_->{choices}[0]{finish_reason} eq 'stop' } @objs;
is(scalar(grep { my $v = eval { JSON::PP->new->decode($_->{choices}[0]{text}) }; ref $v eq 'HASH' } @ended),
   scalar @ended, 'json_object answers that end are JSON objects (' . scalar(@ended) . ')');

# bad schemas: 400 naming the keyword and the path
my $bad = $n->together('/v1/completions', [$JSON->encode({prompt => [1], response_format => {type => 'json_schema',
    json_schema => {name => 'b', schema => {type => 'object', properties => {p => {type => 'string', pattern => '^a'}}}}}})])->[0];
is($bad->{status}, 400, 'an unsupported keyword is a 400');
like($bad->{body} // '', qr/keyword 'pattern' at '\/properties\/p\/pattern'/, 'the error names the keyword and its path');
like($bad->{body} // '', qr/"param":"response_format.json_schema.schema"/, 'param names the schema');

$n->stop_nginx;
$n->stop_engine;
done_testing();
