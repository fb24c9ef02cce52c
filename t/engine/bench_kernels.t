#!/usr/bin/perl
# muse-bench kernels and decode on the CPU backend with synthetic tiny weights (no pack files):
# every op row is in the table, the copy bandwidth is positive, --json writes well-formed JSON,
# --baseline of that file prints a ratio a row, a bad baseline fails naming the file, and
# --backend cuda without a GPU fails with a hint to use --backend cpu. Timings are never
# checked, only that they are there.
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
my @W = ('--synthetic-weights', '1', '--config', "$ROOT/conf/packs/tiny.json", '--bits', '2');
my @FAST = ('--min-ms', '0.05', '--copy-mib', '8', '--threads', '2');

sub run {
    my $cmd = join ' ', map { "'$_'" } $BENCH, @_;
    my $out = `$cmd 2>&1`;
    return ($? >> 8, $out);
}

sub read_json {
    my ($path) = @_;
    open my $f, '<', $path or return undef;
    local $/;
    my $text = <$f>;
    return eval { decode_json($text) };
}

# kernels: the table, the header lines, the JSON file
my ($rc, $out) = run('kernels', '--backend', 'cpu', @W, @FAST, '--rows', '1,4', '--json', "$dir/k.json");
is($rc, 0, 'kernels --backend cpu exits 0') or diag($out);
like($out, qr/^  copy bandwidth: (\d+\.\d+) GB\/s \(read \+ write/m, 'kernels: the copy bandwidth in the header');
my ($bw) = $out =~ /copy bandwidth: (\d+\.\d+) GB/;
ok(($bw // 0) > 0, "kernels: copy bandwidth $bw GB/s is positive");
like($out, qr/^  empty round, 1 rows: [\d.]+ us/m, 'kernels: the empty round is printed');
my @ops = ('embed', 'norm 1+w fp16', 'add_norm', 'linear exl3 q_proj', 'linear exl3 k_proj',
           'linear exl3 o_proj', 'linear exl3 gate_proj', 'linear exl3 down_proj',
           'qk_norm_rope q layer 0', 'qk_norm_rope k layer 0', 'attention layer 0 (sliding)',
           'attention layer 2 (full)', 'swiglu width 384', 'swiglu width 128', 'moe + router',
           'head', 'sample');
for my $op (@ops) {
    for my $m (1, 4) {
        like($out, qr/^[^\n]*\Q$op\E[^\n]*\|\s*$m\s*\|\s*[\d.]+\s*\|\s*\d+\s*\|/m, "kernels: a row for $op at $m rows");
    }
}
unlike($out, qr/all_reduce/, 'kernels: no all_reduce row on one rank');

my $text_rows = () = $out =~ /^[^\n|]+\|[^\n|]+\|\s*[14]\s*\|\s*[\d.]+\s*\|/mg;
my $j = read_json("$dir/k.json");
ok($j, 'kernels --json FILE is well-formed JSON');
$j //= { rows => [] };
is($j->{bench}, 'kernels', 'JSON: bench kernels');
is($j->{backend}, 'cpu', 'JSON: backend cpu');
ok(($j->{device} // '') ne '', "JSON: device '$j->{device}'");
ok(($j->{'copy GB/s'} // 0) > 0, 'JSON: copy GB/s positive');
like($j->{command} // '', qr/^muse-bench kernels .*--rows 1,4/, 'JSON: the command line');
like($j->{date} // '', qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/, 'JSON: the date');
ok($text_rows >= 2 * @ops, "kernels: $text_rows rows of times");
is(scalar @{ $j->{rows} }, $text_rows, 'JSON: the rows of the table');
my @bad = grep { !(defined $_->{'us/call'} && $_->{'us/call'} >= 0 && ($_->{bytes} // 0) > 0 && $_->{op}) } @{ $j->{rows} };
is(scalar @bad, 0, 'JSON: every row has an op, a time and its bytes');

# --baseline: the same JSON gives a ratio on every row
($rc, $out) = run('kernels', '--backend', 'cpu', @W, @FAST, '--rows', '1,4', '--baseline', "$dir/k.json", '--json', "$dir/k2.json");
is($rc, 0, 'kernels --baseline exits 0') or diag($out);
like($out, qr/\| x baseline\s*$/m, 'baseline: an x baseline column');
my $j2 = read_json("$dir/k2.json") // { rows => [] };
my @ratios = grep { defined $_->{'x baseline'} && $_->{'x baseline'} >= 0 } @{ $j2->{rows} };
is(scalar @ratios, $text_rows, 'baseline: every row matched its baseline row and has a ratio');

# a bad baseline: the file named, exit non-zero, no table
($rc, $out) = run('kernels', @W, @FAST, '--baseline', "$dir/missing.json");
ok($rc != 0 && $out =~ /--baseline \Q$dir\E\/missing\.json: cannot read it/, 'a missing baseline: exit non-zero naming the file') or diag($out);
open my $f, '>', "$dir/not.json" or die;
print $f "this is not json\n";
close $f;
($rc, $out) = run('kernels', @W, @FAST, '--baseline', "$dir/not.json");
ok($rc != 0 && $out =~ /--baseline \Q$dir\E\/not\.json is not muse-bench JSON/, 'a non-JSON baseline: exit non-zero naming the file') or diag($out);
unlike($out, qr/\| us\/call/, 'a bad baseline: no table printed');

# decode on the same weights: backend, copy bandwidth, floor; its baseline of another bench fails
($rc, $out) = run('decode', '--backend', 'cpu', @W, '--copy-mib', '8', '--threads', '2', '--tokens', '2', '--prompt', '64', '--json', "$dir/d.json");
is($rc, 0, 'decode --backend cpu exits 0') or diag($out);
like($out, qr/^  copy bandwidth: \d+\.\d+ GB\/s/m, 'decode: the copy bandwidth line');
like($out, qr/^synthetic weights \(seed 1\)\s*\|\s*cpu\s*\|/m, 'decode: a row with the backend');
my $d = read_json("$dir/d.json") // { rows => [] };
is($d->{bench}, 'decode', 'decode --json: bench decode');
ok(($d->{rows}[0]{'step MB'} // 0) > 0, 'decode --json: the step bytes');
($rc, $out) = run('decode', @W, '--tokens', '2', '--prompt', '64', '--copy-mib', '8', '--baseline', "$dir/d.json");
is($rc, 0, 'decode --baseline exits 0') or diag($out);
like($out, qr/^synthetic weights[^\n]*\|\s*\d+\.\d+\s*$/m, 'decode --baseline: a ratio on the row');
($rc, $out) = run('decode', @W, '--tokens', '2', '--prompt', '64', '--baseline', "$dir/k.json");
ok($rc != 0 && $out =~ /--baseline \Q$dir\E\/k\.json is muse-bench kernels JSON, not decode/, 'decode: a kernels baseline is refused, naming the file') or diag($out);

# cuda without a GPU (CI) or without the CUDA backend: an error suggesting --backend cpu
($rc, $out) = run('kernels', '--backend', 'cuda', @W, @FAST, '--rows', '1');
SKIP: {
    skip 'a CUDA device is present: kernels --backend cuda ran', 2 if $rc == 0;
    ok($rc == 1, "kernels --backend cuda without a GPU: exit 1 (not a crash: $rc)");
    like($out, qr/--backend cpu/, 'kernels --backend cuda without a GPU: the error suggests --backend cpu') or diag($out);
}
($rc, $out) = run('kernels', '--rows', '1');
ok($rc == 2 && $out =~ /--model DIR/, 'kernels without weights: exit 2 naming --model') or diag($out);

done_testing;
