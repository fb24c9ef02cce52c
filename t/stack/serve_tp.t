#!/usr/bin/perl
# Serving from a world of two processes (--tp-world 2: rank 0 beside nginx, rank 1 following its
# rounds over TCP) on the tiny-tp pack: each request's token_sha equals the one-process
# --ranks 2 engine's, greedy and seeded, and 4 streams at once equal each alone. Rank 1 killed
# mid-stream: the stream ends with an error event, rank 0 exits 3 within seconds with a log
# line naming rank 1, /health answers 503; killed while idle, the same within a second.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use File::Temp qw(tempdir);
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
my $JSON = JSON::PP->new->canonical;
my $root = MuseNginx::root();
my $dir = tempdir('muse-tpw-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;
my $out = `'@{[MuseNginx::pack_tool_path()]}' --config '$root/conf/packs/tiny-tp.json' --out '$dir/pack' --seed 5 2>&1`;
die "muse-pack failed: $out" if $?;
system('/usr/bin/python3', "$root/t/tools/make_tiny_tokenizer.py", "$dir/pack/tokenizer.json") == 0 or die;

my @common = ('--streams', 4, '--queue', 16, '--max-rows', 24);
my $follower;
sub free_port {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1) or die $!;
    my $p = $s->sockport;
    close $s;
    return $p;
}
# rank 1 in the background (its log in $dir/rank1.log), then rank 0 as the harness's engine
sub start_world {
    my (@extra) = @_;
    $n->stop_nginx if $n->port;
    my $master = '127.0.0.1:' . free_port();
    my @tp = ('--tp-world', 2, '--tp-master', $master);
    $follower = fork // die "fork: $!";
    if ($follower == 0) {
        open STDOUT, '>', "$dir/rank1.log";
        open STDERR, '>&', \*STDOUT;
        exec MuseNginx::real_engine_path(), 'serve', '--model', "$dir/pack", @common, @extra, @tp,
            '--tp-rank', 1;
        exit 127;
    }
    $n->start_real_engine(model => "$dir/pack", args => [@common, @extra, @tp, '--tp-rank', 0]);
    $n->start_nginx;
    return $master;
}
sub start_one {
    $n->stop_nginx if $n->port;
    $n->start_real_engine(model => "$dir/pack", args => [@common, '--context', 160, '--ranks', 2]);
    $n->start_nginx;
}
sub body {
    my ($prompt, %o) = @_;
    my %b = (prompt => $prompt, max_tokens => $o{max} // 8, temperature => $o{temperature} // 0);
    $b{seed} = $o{seed} if defined $o{seed};
    $b{stream} = JSON::PP::true if $o{stream};
    return $JSON->encode(\%b);
}
sub together { $n->together('/v1/completions', @_) }
*sha = \&MuseNginx::token_sha;
sub streamed_sha {
    my ($b) = @_;
    my $res = $n->parallel([MuseNginx::post_bytes('/v1/completions', $b)], 60)->[0];
    return MuseNginx::finish_sha($res) || 'none';
}

my @prompts = map { my $i = $_; [map { ($i * 131 + $_ * 17) % 990 } 0 .. 9 + 7 * $i] } 0 .. 3;
my @modes = (['greedy', 0], ['seeded 0.7', 0.7]);
my (%one, %one_stream);
start_one();
for my $m (@modes) {
    my ($name, $t) = @$m;
    $one{$name} = [map { sha(together([body($prompts[$_], temperature => $t, seed => 50 + $_)])->[0]) } 0 .. 3];
    $one_stream{$name} = streamed_sha(body($prompts[1], temperature => $t, seed => 51, stream => 1));
}
start_world('--context', 160);
like($n->slurp("$dir/rank1.log"), qr/rank 1 of 2 following rank 0 at 127\.0\.0\.1:\d+/, 'rank 1 follows rank 0');
for my $m (@modes) {
    my ($name, $t) = @$m;
    my @bodies = map { body($prompts[$_], temperature => $t, seed => 50 + $_) } 0 .. 3;
    my @solo = map { sha(together([$_])->[0]) } @bodies;
    ok(!grep({ $_ eq 'none' } @solo), "--tp-world 2 $name: every request alone succeeds");
    is_deeply(\@solo, $one{$name}, "--tp-world 2 $name: token_sha of each equals one process --ranks 2");
    is_deeply([map { sha($_) } @{ together(\@bodies) }], \@solo, "--tp-world 2 $name: 4 streams at once equal each alone");
    is(streamed_sha(body($prompts[1], temperature => $t, seed => 51, stream => 1)), $one_stream{$name},
       "--tp-world 2 $name: a streamed completion's token_sha equals --ranks 2's");
}
# a clean stop of rank 0 stops rank 1 with exit 0
$n->stop_nginx;
$n->stop_engine;
my $exited = MuseNginx::wait_until(10, sub { waitpid($follower, WNOHANG) == $follower ? [$?] : undef });
ok($exited && $exited->[0] == 0, 'rank 0 stopped: rank 1 exits 0') or diag($n->slurp("$dir/rank1.log"));

# rank 1 killed mid-stream
start_world('--context', 4096, '--prompt-cache-gib', 0);
my $pid = $n->engine_pid;
my $s = $n->open_post('/v1/completions', body([5, 6, 7], temperature => 0.7, seed => 3, max => 4000, stream => 1));
my $first = MuseNginx::read_some($s, 10, qr/"text"/);
kill 'KILL', $follower;
my $t0 = time;
my $rest = MuseNginx::read_some($s, 10);
close $s;
my $res = MuseNginx::parse_response([[0, $first->[0] . $rest->[0]]]);
is($res->{status}, 200, 'rank 1 killed: the stream had started');
like(MuseNginx::last_event($res), qr/^data: \{"error":/, 'rank 1 killed: the stream ends with an error event, no [DONE]');
$exited = MuseNginx::wait_until(5, sub { waitpid($pid, WNOHANG) == $pid ? [$?] : undef });
my $took = time - $t0;
ok($exited && $exited->[0] >> 8 == 3, sprintf('rank 1 killed: rank 0 exits 3 within %.1f s', $took));
delete $n->{engine_pid};
waitpid($follower, 0);
like($n->engine_log, qr/rank 1 \(127\.0\.0\.1:\d+\) stopped: .*FATAL/, 'rank 1 killed: rank 0 logs a line naming rank 1')
  or diag(substr($n->engine_log, -600));
is($n->health->{status}, 503, 'rank 1 killed: /health 503');

# rank 1 killed while no round runs: rank 0's watch sees the link close
start_world('--context', 160);
$pid = $n->engine_pid;
is(sha(together([body($prompts[0])])->[0]), $one{greedy}[0], 'idle case: the world serves first');
kill 'KILL', $follower;
$t0 = time;
$exited = MuseNginx::wait_until(5, sub { waitpid($pid, WNOHANG) == $pid ? [$?] : undef });
$took = time - $t0;
ok($exited && $exited->[0] >> 8 == 3, sprintf('rank 1 killed while idle: rank 0 exits 3 within %.1f s', $took));
delete $n->{engine_pid};
waitpid($follower, 0);
like($n->engine_log, qr/rank 1 \(127\.0\.0\.1:\d+\) stopped: closed the connection; marking the segment FATAL/,
     'rank 1 killed while idle: rank 0 logs a line naming rank 1') or diag(substr($n->engine_log, -600));
my $after = together([body($prompts[0])])->[0];
ok(!$after->{muse}, 'rank 1 killed while idle: no completion from a half world');
done_testing();
