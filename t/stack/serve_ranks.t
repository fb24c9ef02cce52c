#!/usr/bin/perl
# Serving with --ranks 2 (tensor parallelism on the CPU backend) on the tiny-tp pack: N streams
# together equal each alone by token_sha (greedy and seeded 0.7), and a conversation resumed
# from the prompt cache equals the same with the cache off (the cached run on --synthetic-weights
# of the pack's seed, so that path serves too). /health reports both ranks.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use File::Temp qw(tempdir);
use JSON::PP;
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
my $JSON = JSON::PP->new->canonical;
my %C = %MuseNginx::CTL;
my $root = MuseNginx::root();
my $dir = tempdir('muse-tp-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;
my $out = `'@{[MuseNginx::pack_tool_path()]}' --config '$root/conf/packs/tiny-tp.json' --out '$dir/pack' --seed 5 2>&1`;
die "muse-pack failed: $out" if $?;
system('/usr/bin/python3', "$root/t/tools/make_tiny_tokenizer.py", "$dir/pack/tokenizer.json") == 0 or die;

sub start {
    $n->stop_nginx if $n->port;
    $n->start_real_engine(model => "$dir/pack",
                          args => ['--ranks', 2, '--streams', 4, '--queue', 16, '--context', 160, @_]);
    $n->start_nginx;
}
# the same weights from the seed alone (no pack): what a shape too large for files runs on
sub start_synthetic {
    $n->stop_nginx if $n->port;
    $n->start_real_engine(no_model => 1,
                          args => ['--ranks', 2, '--streams', 4, '--queue', 16, '--context', 160,
                                   '--synthetic-weights', 5, '--config', "$root/conf/packs/tiny-tp.json",
                                   '--tokenizer', "$dir/pack/tokenizer.json", @_]);
    $n->start_nginx;
}
sub body {
    my ($prompt, %o) = @_;
    my %b = (prompt => $prompt, max_tokens => $o{max} // 8, temperature => $o{temperature} // 0);
    $b{seed} = $o{seed} if defined $o{seed};
    return $JSON->encode(\%b);
}
sub together { $n->together('/v1/completions', @_) }
*sha = \&MuseNginx::token_sha;

my @prompts = map { my $i = $_; [map { ($i * 131 + $_ * 17) % 990 } 0 .. 9 + 7 * $i] } 0 .. 3;
start('--max-rows', 24);
for my $mode (['greedy', 0], ['seeded 0.7', 0.7]) {
    my ($name, $t) = @$mode;
    my @bodies = map { body($prompts[$_], temperature => $t, seed => 50 + $_) } 0 .. 3;
    my @solo = map { together([$_])->[0] } @bodies;
    ok(!grep({ !$_->{muse} } @solo), "--ranks 2 $name: every request alone succeeds");
    my %distinct = map { sha($_) => 1 } @solo;
    ok(keys(%distinct) >= 3, "--ranks 2 $name: the prompts give different tokens (the check can fail)");
    my $got = together(\@bodies);
    is_deeply([map { sha($_) } @$got], [map { sha($_) } @solo], "--ranks 2 $name: 4 streams at once equal each alone");
}
my $h = $n->request('GET', '/health')->{json};
is(scalar @{ $h->{ranks} // [] }, 2, '/health lists two ranks') or diag($JSON->encode($h));
# every rank: its device and arch, every term of the plan, free, left for streams, peak
chomp(my $arch = `uname -m`);
# MUSE_TEST_BACKEND=cuda (make test-gpu): both ranks on GPU 0, a discrete device
my ($DEV, $KIND) = ($ENV{MUSE_TEST_BACKEND} // 'cpu') eq 'cuda' ? ('cuda', 'discrete') : ('cpu', 'cpu');
my @terms = qw(total_bytes device_bytes planned_bytes weights_bytes kv_bytes pool_bytes sliding_bytes
               snapshots_bytes prompt_cache_bytes prompt_cache_budget_bytes workspace_bytes request_bytes
               reserve_bytes free_bytes left_for_streams_bytes peak_bytes);
for my $i (0, 1) {
    my $rk = $h->{ranks}[$i] // {};
    my $mem = $rk->{memory} // {};
    ok(($rk->{device} // '') eq $DEV && ($rk->{arch} // '') eq $arch && ($rk->{device_kind} // '') eq $KIND,
       "/health ranks[$i]: device $DEV, arch $arch (uname), device_kind $KIND");
    my @missing = grep { !defined $mem->{$_} || $mem->{$_} !~ /^\d+(\.\d+)?$/ } @terms;
    ok(!@missing, "/health ranks[$i].memory: every plan term, numeric") or diag("missing: @missing");
    ok($mem->{weights_bytes} > 0 && $mem->{pool_bytes} > 0 && $mem->{sliding_bytes} > 0
       && $mem->{planned_bytes} >= $mem->{weights_bytes} + $mem->{kv_bytes},
       "/health ranks[$i]: weights, pool, rings measured; the planned total holds them");
}
# the two shards add up to the pack: each rank holds less than the whole, together every tensor
# (the replicated ones twice: embeddings, norms, router)
my $pack_bytes = 0;
$pack_bytes += -s $_ for glob "$dir/pack/*.safetensors";
my ($w0, $w1) = map { $h->{ranks}[$_]{memory}{weights_bytes} // 0 } 0, 1;
# (cuda: the two ranks on GPU 0 share one upload, counted on rank 0)
ok(($DEV eq 'cuda' || ($w0 < $pack_bytes && $w1 < $pack_bytes)) && $w0 + $w1 > $pack_bytes * 0.99
   && $w0 + $w1 < 2 * $pack_bytes,
   "/health: each rank's weights ($w0, $w1) are a share of the pack's $pack_bytes bytes, together all of it");
my $metrics = $n->request('GET', '/metrics')->{body} // '';
for my $i (0, 1) {
    like($metrics, qr/^muse_rank_memory_weights_bytes\{rank="$i",device="$DEV",arch="\Q$arch\E"\} [1-9]\d*$/m,
         "/metrics: rank ${i}'s weights gauge");
    like($metrics, qr/^muse_rank_memory_left_for_streams_bytes\{rank="$i",/m, "/metrics: rank ${i}'s left for streams");
}

sub conversation {
    my (@shas, @cached);
    my $history = [map { ($_ * 29 + 7) % 990 } 0 .. 40];
    push @$history, $C{eot};
    for my $turn (0 .. 2) {
        my $r = together([body($history, temperature => 0.7, seed => 9 + $turn, max => 6)])->[0];
        push @shas, sha($r);
        push @cached, $r->{usage}{prompt_tokens_details}{cached_tokens} // -1;
        push @$history, (map { ($_ * 13 + $turn) % 990 } 0 .. 20), $C{eot};
    }
    return (\@shas, \@cached);
}
start('--prompt-cache-gib', '0');
my ($off) = conversation();
start_synthetic('--prompt-cache-gib', '1');
my ($on, $cached) = conversation();
is_deeply($on, $off, '--ranks 2: a conversation resumed from the prompt cache (synthetic weights, seed 5) equals one without it (the seed-5 pack)');
ok($cached->[1] > 0 && $cached->[2] > $cached->[1], "--ranks 2: later turns start from the cache (cached_tokens @$cached)");
done_testing();
