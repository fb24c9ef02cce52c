#!/usr/bin/perl
# A real sticky device error on the CUDA backend (issue 11), through nginx + ngx_muse_module +
# the hooks engine (build/t/muse-engine-test --backend cuda on the tiny pack): with
# --fault-sticky-after-tokens 3 the backend launches kernels/fault.cu (a store through an
# invalid address) in the round after the third token, so the stream synchronize in end_round
# gets a real cudaErrorIllegalAddress (file:line from the CHECK macro). The engine must mark its
# segment FATAL and exit 3 (MUSE_EXIT_DEVICE_FATAL) within a second of the fault, the stream
# must end with an error event (no [DONE]), /health must answer 503 and nothing more is served.
# Where there is no GPU (CI) or the hooks engine has no CUDA backend: a visible skip. Run by
# make test-gpu.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use JSON::PP;
use MuseNginx;
use POSIX qw(:sys_wait_h);
use Test::More;
use Time::HiRes qw(time sleep);

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;
my $HOOKS = MuseNginx::hooks_engine_path();
plan skip_all => MuseNginx::_in_ci("$HOOKS (mk/testengine.mk) not built") unless -x $HOOKS;
# the GPU probe, as t/ops/cuda_logits.t: no device or no CUDA backend in the binary is a skip
my $probe = `'$HOOKS' logits --backend cuda --model '@{[MuseNginx::tiny_pack()]}' --tokens 1 --out /dev/null 2>&1`;
if ($? && $probe =~ /no usable CUDA device|built without the CUDA backend/) {
    plan skip_all => 'no CUDA backend here: ' . (split /\n/, $probe)[0];
}
plan tests => 11;
ok(!$?, "$HOOKS logits --backend cuda runs on this GPU") or diag($probe);

my $JSON = JSON::PP->new->canonical;
my $n = MuseNginx->new;
$n->start_real_engine(engine => $HOOKS, backend => 'cuda',
                      args => ['--streams', 2, '--context', 256, '--prompt-cache-gib', 0,
                               '--fault-sticky-after-tokens', 3]);
my $pid = $n->engine_pid;
$n->start_nginx;

# One streamed request; the socket and the engine's exit watched together, with the time of
# each token event, of the engine's exit and of the end of the stream.
my $s = $n->open_post('/v1/completions', $JSON->encode({ prompt => [5, 6, 7], max_tokens => 40,
                                                         temperature => 0, stream => JSON::PP::true }));
$s->blocking(0);
my ($raw, $t_last_token, $t_exit, $status, $t_eof) = ('');
my $t0 = time;
while (time - $t0 < 15 && !(defined $t_exit && defined $t_eof)) {
    if (!defined $t_exit && waitpid($pid, WNOHANG) == $pid) { ($t_exit, $status) = (time, $?) }
    if (defined $t_eof) { sleep 0.005; next }
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    next unless select(my $rout = $rin, undef, undef, 0.005);
    my $k = sysread($s, my $buf, 65536);
    next if !defined $k;
    if (!$k) { $t_eof = time; next }
    $t_last_token = time if $buf =~ /"text":/ && $buf !~ /"error":/;
    $raw .= $buf;
}
close $s;
delete $n->{engine_pid} if defined $t_exit;
my $res = MuseNginx::parse_response([[0, $raw]]);
my @tokens = grep { $_->{text} =~ /^data: \{.*"text":/s && $_->{text} !~ /"error":/ } @{ $res->{events} };
is($res->{status}, 200, 'the stream had started');
ok(@tokens >= 1, 'tokens arrived before the fault (' . scalar(@tokens) . ' events)');
like(MuseNginx::last_event($res), qr/^data: \{"error":/, 'the stream ends with an error event, no [DONE]')
    or diag(substr($raw, -600));
ok(defined $t_exit && defined $t_last_token && $t_exit - $t_last_token < 1.0,
   sprintf('the engine exited within 1 s of the fault (%.3f s after the last token, %.3f s after the request)',
           ($t_exit // 0) - ($t_last_token // 0), ($t_exit // 0) - $t0));
is(defined $status ? $status >> 8 : -1, 3, 'exit status 3 (MUSE_EXIT_DEVICE_FATAL)');
like($n->engine_log,
     qr/sticky device error: device error on rank 0 \(cuda, GPU \d+\): \S*cuda_round\.c:\d+: (?:cudaStreamSynchronize|cudaMemcpyAsync|muse_k_fault_illegal_address)\(.*?\): an illegal memory access was encountered.*FATAL/,
     'the engine names the real CUDA error with file:line')
    or diag($n->engine_log);
my $hr = $n->health;
is($hr->{status}, 503, '/health answers 503');
is($hr->{json} && $hr->{json}{reason}, 'engine reported a fatal error', '/health names the fatal state');
my $after = $n->request('POST', '/v1/completions', $JSON->encode({ prompt => [5, 6, 7], max_tokens => 4 }));
is($after->{status}, 503, 'nothing is served after the fault (503)');
is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
