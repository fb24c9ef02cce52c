#!/usr/bin/perl
# muse-bench decode at several stream counts, prompt at several lengths on a backend, and the
# stages of a decode round, on the CPU backend with synthetic tiny weights: each table has its
# columns and a row a stream count / length / stage, the JSON files hold the same rows,
# aggregate tok/s is streams x per stream, the stages' shares add up to the round, and
# t/tools/plots.sh makes its SVG and PNG files from that JSON (skipped without gnuplot).
# Timings are never checked against a speed, only that they are there and consistent.
use strict;
use warnings;
use File::Temp qw(tempdir);
use FindBin;
use JSON::PP;
use Test::More;

my $ROOT  = "$FindBin::Bin/../..";
my $BUILD = $ENV{MUSE_BUILD} // 'build';
$BUILD = "$ROOT/$BUILD" unless $BUILD =~ m{^/};
my $BENCH = "$BUILD/muse-bench";
plan skip_all => "muse-bench not built: $BENCH (make)" unless -x $BENCH;

my $dir = tempdir(CLEANUP => 1);
my @W = ('--synthetic-weights', '1', '--config', "$ROOT/conf/packs/tiny.json", '--bits', '2',
         '--threads', '2', '--copy-mib', '8');

sub run {
    my $cmd = join ' ', map { "'$_'" } @_;
    my $out = `$cmd 2>&1`;
    return ($? >> 8, $out);
}

sub read_json {
    my ($path) = @_;
    open my $f, '<', $path or return { rows => [] };
    local $/;
    my $text = <$f>;
    return eval { decode_json($text) } // { rows => [] };
}

sub header_has {
    my ($out, $what, @cols) = @_;
    my ($head) = $out =~ /^(\Q$cols[0]\E\s*\|[^\n]*)$/m;
    ok($head, "$what: the table header") or diag($out);
    $head //= '';
    my @got = map { s/^\s+|\s+$//gr } split /\|/, $head;
    is_deeply(\@got, \@cols, "$what: the columns");
}

# decode at 1, 2 and 4 streams
my ($rc, $out) = run($BENCH, 'decode', @W, '--streams', '1,2,4', '--tokens', '3', '--prompt', '64',
                     '--json', "$dir/decode.json");
is($rc, 0, 'decode --streams 1,2,4 exits 0') or diag($out);
header_has($out, 'decode', 'model', 'backend', 'streams', 'vocab', 'threads', 'prompt tok/s (64-row)',
           'decode tok/s', 'tok/s per stream', 'decode p50 ms', 'decode p99 ms', 'first round ms', 'step MB',
           'floor ms', '% of floor (p50)');
my $d = read_json("$dir/decode.json");
is($d->{bench}, 'decode', 'decode JSON: bench decode');
is_deeply([map { $_->{streams} } @{ $d->{rows} }], [1, 2, 4], 'decode JSON: a row a stream count');
for my $r (@{ $d->{rows} }) {
    my ($s, $agg, $per) = ($r->{streams}, $r->{'decode tok/s'} // 0, $r->{'tok/s per stream'} // 0);
    ok($agg > 0 && abs($agg - $s * $per) <= 0.02 * $agg + 0.05 * $s,
       "decode $s streams: aggregate $agg = streams x per stream $per");
    ok(($r->{'decode p99 ms'} // 0) >= ($r->{'decode p50 ms'} // 1e9), "decode $s streams: p99 >= p50");
    ok(($r->{'first round ms'} // 0) > 0, "decode $s streams: the first round timed apart");
}
my @mb = map { $_->{'step MB'} // 0 } @{ $d->{rows} };
ok($mb[0] > 0 && $mb[1] > $mb[0] && $mb[2] > $mb[1], "decode: a round's bytes grow with the streams (@mb)");
($rc, $out) = run($BENCH, 'decode', @W, '--streams', '1,2', '--tokens', '2', '--prompt', '64',
                  '--baseline', "$dir/decode.json");
is($rc, 0, 'decode --baseline exits 0') or diag($out);
like($out, qr/^synthetic weights[^\n]*\|\s*2\s*\|[^\n]*\|\s*\d+\.\d+\s*$/m, 'decode --baseline: the 2-stream row has its ratio');
($rc, $out) = run($BENCH, 'decode', @W, '--streams', '1,0');
ok($rc == 2 && $out =~ /--streams/, 'decode --streams 1,0: a usage error naming --streams') or diag($out);

# prompt on the backend: two lengths and one beyond the pack's context (4096)
($rc, $out) = run($BENCH, 'prompt', @W, '--lengths', '64,200,8192', '--rows', '64', '--reps', '2',
                  '--json', "$dir/prompt.json");
is($rc, 0, 'prompt on a backend exits 0') or diag($out);
header_has($out, 'prompt', 'model', 'backend', 'prompt tokens', 'rows a round', 'reps', 'TTFT p50 ms',
           'TTFT max ms', 'prompt tok/s', 'note');
my $p = read_json("$dir/prompt.json");
is($p->{bench}, 'prompt', 'prompt JSON: bench prompt');
is_deeply([map { $_->{'prompt tokens'} } @{ $p->{rows} }], [64, 200, 8192], 'prompt JSON: a row a length');
for my $r (@{ $p->{rows} }[0, 1]) {
    my ($n, $ttft, $rate) = ($r->{'prompt tokens'}, $r->{'TTFT p50 ms'} // 0, $r->{'prompt tok/s'} // 0);
    ok($ttft > 0 && abs($rate - $n * 1e3 / $ttft) <= 0.01 * $rate + 0.1, "prompt $n: tok/s $rate = tokens / TTFT $ttft ms");
    ok(($r->{'TTFT max ms'} // 0) >= $ttft, "prompt $n: TTFT max >= p50");
}
like($p->{rows}[2]{note} // '', qr/skipped: 8192 prompt \+ 1 token > the pack's max_position_embeddings 4096/,
     'prompt 8192: skipped, naming the limit');
($rc, $out) = run($BENCH, 'prompt', @W, '--lengths', '64', '--rows', '64', '--baseline', "$dir/decode.json");
ok($rc != 0 && $out =~ /is muse-bench decode JSON, not prompt/, 'prompt: a decode baseline refused') or diag($out);

# stages of a decode round
($rc, $out) = run($BENCH, 'stages', @W, '--tokens', '4', '--context', '70', '--json', "$dir/stages.json");
is($rc, 0, 'stages exits 0') or diag($out);
header_has($out, 'stages', 'stage', 'what', 'ms a step', '% of step', 'MB a step', 'floor ms', '% of floor',
           'calls a step');
my $s = read_json("$dir/stages.json");
is($s->{bench}, 'stages', 'stages JSON: bench stages');
my %st = map { ($_->{stage} => $_) } @{ $s->{rows} };
# the tiny pack: 6 layers, 2 dense and 4 moe; the cpu backend times the moe whole
for my $name ('embed', 'norms', 'attention', 'dense mlp', 'moe (unsplit)', 'head', 'sampler') {
    ok(($st{$name}{'ms a step'} // -1) =~ /^[\d.]+$/ && $st{$name}{'ms a step'} > 0, "stages: $name timed");
}
# the cpu backend's begin and end of a round can take under 0.5 us: 0.000 at three decimals
ok(($st{'host time'}{'ms a step'} // -1) =~ /^[\d.]+$/, 'stages: host time timed');
is($st{'host time'}{'calls a step'}, 2, 'stages: host time is begin_round and end_round');
is($st{attention}{'calls a step'}, 18, 'stages: attention 3 ops a layer x 6 layers (q, k rope in the attention)');
is($st{'dense mlp'}{'calls a step'}, 4, 'stages: dense mlp 2 ops x 2 dense layers (nested calls counted once)');
is($st{'moe (unsplit)'}{'calls a step'}, 4, 'stages: one moe call a moe layer');
is($st{head}{'calls a step'}, 1, 'stages: one head call');
ok(exists $st{'launch gaps'}, 'stages: a launch gaps row');
for my $name ('router', 'routed experts', 'shared experts') {
    is($st{$name}{'ms a step'} // '', '-', "stages: $name not split by the cpu backend ('-')");
    ok(($st{$name}{'MB a step'} // 0) > 0, "stages: $name has its bytes");
}
my $share = 0;
$share += $_->{'% of step'} for grep { $_->{'% of step'} =~ /^-?[\d.]+$/ } @{ $s->{rows} };
ok(abs($share - 100) < 1, "stages: the shares add up to the round ($share%)");
my $mb = $st{'moe (unsplit)'}{'MB a step'} // 0;
my $parts = 0;
$parts += $st{$_}{'MB a step'} // 0 for ('router', 'routed experts', 'shared experts');
ok(abs($mb - $parts) <= 0.002, "stages: moe (unsplit) bytes $mb = its parts' $parts");
ok(($s->{'round ms'} // 0) > 0, 'stages JSON: round ms');
($rc, $out) = run($BENCH, 'stages', @W, '--tokens', '2', '--context', '64', '--baseline', "$dir/stages.json");
is($rc, 0, 'stages --baseline exits 0') or diag($out);
like($out, qr/^attention\s*\|[^\n]*\|\s*\d+\.\d+\s*$/m, 'stages --baseline: a ratio on the attention row');

# the plots
SKIP: {
    skip 'gnuplot not installed (Debian: gnuplot-nox)', 4 unless grep { -x "$_/gnuplot" } split /:/, $ENV{PATH};
    ($rc, $out) = run("$ROOT/t/tools/plots.sh", '--decode', "$dir/decode.json", '--prompt', "$dir/prompt.json",
                      '--stages', "$dir/stages.json", '--out', "$dir/plots");
    is($rc, 0, 'plots.sh exits 0') or diag($out);
    my @missing = grep { !-s "$dir/plots/$_" }
        map { ("$_.svg", "$_.png") } qw(bench-decode bench-prompt bench-stages);
    is("@missing", '', 'plots.sh: every SVG and PNG written');
    open my $f, '<', "$dir/plots/bench-decode.svg" or die;
    local $/;
    my $svg = <$f>;
    like($svg, qr/<svg/, 'plots.sh: an SVG');
    ($rc, $out) = run("$ROOT/t/tools/plots.sh", '--stages', "$dir/decode.json", '--out', "$dir/plots2");
    ok($rc != 0 && $out =~ /decode\.json is muse-bench decode JSON, not stages/, 'plots.sh: the wrong JSON named') or diag($out);
}

done_testing;
