#!/usr/bin/perl
# muse-bench concurrent, prompt and constrained against nginx + ngx_muse_module + `muse-engine
# serve` on the tiny pack: the tables' rows and the figures that do not depend on speed (request
# counts, errors, identical-to-alone, cached tokens, skipped lengths, a held stream's length). Cached tokens are checked against
# the prompt cache's rule computed here: whole blocks of 16 positions, leaving a token to read.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use JSON::PP;
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing_real();
my $BENCH = MuseNginx::root() . '/' . ($ENV{MUSE_BUILD} // 'build') . '/muse-bench';
$BENCH = ($ENV{MUSE_BUILD} // '') . '/muse-bench' if ($ENV{MUSE_BUILD} // '') =~ m{^/};
$why //= "muse-bench not built: $BENCH" unless -x $BENCH;
plan skip_all => $why if $why;

my $CONTEXT = 200;
my $n = MuseNginx->new;
$n->start_real_engine(args => ['--streams', '4', '--queue', '8', '--context', $CONTEXT]);
$n->start_nginx;
my $url = 'http://127.0.0.1:' . $n->port;
for (1 .. 200) {    # /health says 503 until the module has seen the engine's first heartbeat
    last if ($n->request('GET', '/health')->{status} // 0) == 200;
    select(undef, undef, undef, 0.05);
}

sub bench {
    my $out = `'$BENCH' @_ --url $url --id-range 1000 --json 2>&1`;
    is($?, 0, "muse-bench @_ exits 0") or diag($out);
    my ($json) = $out =~ /^(\{.*\})\s*$/m;
    return $json ? decode_json($json) : { rows => [] };
}

# concurrent: 1 and 3 streams, distinct cold prompts, every request identical to itself alone.
my $c = bench('concurrent', '--streams', '1,3', '--tokens', '4', '--reps', '2', '--prompt-tokens', '20');
is(scalar @{ $c->{rows} }, 2, 'concurrent: one row per stream count');
for my $i (0, 1) {
    my $r = $c->{rows}[$i] // {};
    my $s = (1, 3)[$i];
    is($r->{streams}, $s, "concurrent row $i: streams $s");
    is($r->{requests}, 2 * $s, "concurrent row $i: reps x streams requests");
    is($r->{errors}, 0, "concurrent row $i: no errors");
    is($r->{'identical to alone'}, (2 * $s) . '/' . (2 * $s), "concurrent row $i: identical to alone");
    is($r->{'cached tokens'}, 0, "concurrent row $i: distinct prompts, nothing cached");
    ok(($r->{'aggregate tok/s'} // 0) > 0, "concurrent row $i: aggregate tok/s > 0");
    ok(($r->{'TTFT max ms'} // -1) >= ($r->{'TTFT p50 ms'} // 1e9), "concurrent row $i: TTFT max >= p50");
}
like($c->{server} // '', qr/context_length $CONTEXT, 4 lanes/, 'concurrent: /health read');

# prompt: 40 tokens (the cache keeps 32 and serves them to the repeat and to prompt + 1), and a
# length beyond the context, reported as skipped.
my $p = bench('prompt', '--lengths', "40,$CONTEXT", '--reps', '1');
my %row = map { ("$_->{'prompt tokens'} $_->{case}" => $_) } @{ $p->{rows} };
is(scalar @{ $p->{rows} }, 4, 'prompt: cold, same again, + 1 token, skipped');
is($row{'40 cold'}{'cached tokens'}, 0, 'prompt 40 cold: nothing cached');
is($row{'40 same prompt again'}{'cached tokens'}, int((40 - 1) / 16) * 16, 'prompt 40 again: 32 cached');
is($row{'41 prompt + 1 token'}{'cached tokens'}, int(40 / 16) * 16, 'prompt 41: 32 cached');
is($row{$_}{errors}, 0, "$_: no errors") for ('40 cold', '40 same prompt again', '41 prompt + 1 token');
like($row{"$CONTEXT skipped"}{note} // '', qr/skipped: $CONTEXT prompt \+ 1 token > context_length $CONTEXT/,
     'prompt beyond the context: skipped with the reason');
# constrained: the same request free and held to a schema (an object too long to end in 6
# tokens, so the held one runs to max_tokens), no errors.
my $schema = MuseNginx::root() . '/t/data/grammar_bench_schema.json';
my $h = bench('constrained', '--schema', $schema, '--streams', '1', '--reps', '1', '--tokens', '6',
              '--prompt-tokens', '8');
is(scalar @{ $h->{rows} }, 2, 'constrained: a free row and a held row');
is($h->{rows}[0]{constraint} // '', 'free', 'constrained: free first');
is($h->{rows}[1]{constraint} // '', 'json_schema', 'constrained: then held');
is($_->{errors}, 0, "constrained $_->{constraint}: no errors") for @{ $h->{rows} };
is($_->{requests}, 1, "constrained $_->{constraint}: one request") for @{ $h->{rows} };
is($h->{rows}[1]{'streams to max_tokens'}, 1, 'constrained: the held stream ran to max_tokens');
like($h->{'warm-up'} // '', qr/^one held request first/, 'constrained: the warm-up request held');
ok($n->engine_alive, 'engine alive');
is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
done_testing();
