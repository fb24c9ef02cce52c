#!/usr/bin/perl
# More faults and load through nginx + ngx_muse_module + `muse-engine serve` (TESTPLAN):
# 21 (a client gone during a long prompt: cpu backend, --max-rows 16), 22 (a client reading
# 1 byte/s: the engine's ring fills and the lane pauses, send_timeout cuts and cancels),
# 23 (slowloris headers and bodies), 25 (a burst of MUSE_BURST_N requests, default 5000, in
# about 1 s: fast 503s, memory bounded, every connection closed), 27 (an engine lane that stops
# emitting: --fault-stall-after-tokens; bounded wait, no busy spin), 28 (one end-to-end
# corrupt ring position; the rest is t/unit/test_ring.c), 31 (--fault-oom-request and
# --fault-sticky-after-tokens), 32 (nginx -s reload with live streams; kill -9 a worker).
# Engine-side faults need build/t/muse-engine-test (mk/testengine.mk, -DMUSE_TEST_HOOKS).
# MUSE_CASES=22,27 runs only those cases (development).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use Digest::SHA qw(sha256_hex);
use JSON::PP;
use MuseNginx;
use POSIX qw(:sys_wait_h);
use Socket qw(AF_INET SOCK_STREAM SOL_SOCKET SO_RCVBUF inet_aton pack_sockaddr_in);
use IO::Handle;
use Test::More;
use Time::HiRes qw(time sleep);

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;
plan skip_all => MuseNginx::_in_ci('build/t/muse-engine-test (mk/testengine.mk) not built') unless -x MuseNginx::hooks_engine_path();
plan skip_all => MuseNginx::_in_ci('build/t/muse-engine-test predates --fault-stall-after-tokens/--fault-oom-request/'
    . '--fault-sticky-after-tokens: rebuild it')
    if system("'@{[MuseNginx::hooks_engine_path()]}' serve --fault-stall-after-tokens 1 --fault-oom-request 1 "
              . "--fault-sticky-after-tokens 1 --help >/dev/null 2>&1") != 0;

my %want = map { $_ => 1 } split /,/, $ENV{MUSE_CASES} // '';
sub case_on { !%want || $want{ $_[0] } }

my %C = %MuseNginx::CTL;
my $JSON = JSON::PP->new->canonical;
my $HOOKS = MuseNginx::hooks_engine_path();
my $BURST_N = $ENV{MUSE_BURST_N} // 5000;    # TESTPLAN 25: 5000 in about 1 s
sub bytes_of { map { ord } split //, $_[0] }

my $LONG_TEXT = join ' ', map { "w$_" } 1 .. 20;    # 79 bytes: about 1.6 s at 20 ms a token
my $HUGE_TEXT = 'x' x 6000;                         # about 1 MB of SSE events
my @S = ([bytes_of(' to=user'), $C{message}, bytes_of($LONG_TEXT), $C{eot}],
         [bytes_of(' to=user'), $C{message}, bytes_of('ok'), $C{eot}],
         [bytes_of(' to=user'), $C{message}, bytes_of($HUGE_TEXT), $C{eot}]);
my $n = MuseNginx->new;
my $t_start = time;
my %took;

# One nginx conf for every case: small nginx timeouts, send buffers small enough that a slow
# reader backs up into the engine's ring, a location with a 1.5 s idle/queue timeout (27, 28),
# and stub_status to count open connections (25).
my $LOCATIONS = $n->default_locations =~ s/muse_idle_timeout \S+;/muse_idle_timeout 5s;/r . <<'EOF';
        send_timeout 2s;
        client_header_timeout 1s;
        client_body_timeout 1s;
        add_header X-Worker-Pid $pid always;
        location = /short/v1/chat/completions { muse_serve chat; muse_idle_timeout 1500ms; muse_queue_timeout 1500ms; }
        location = /nginx_status { stub_status; }
EOF
my %NGINX = (locations => $LOCATIONS, listen => 'sndbuf=16k', main => 'worker_shutdown_timeout 10s;');

sub after_case {
    my ($name, %o) = @_;
    my @bad = grep { !$o{allow} || $_ !~ $o{allow} } $n->bad_log_lines;
    is(join("\n", @bad), '', "$name: no [alert]/[crit] in error.log" . ($o{allow} ? ' (but the expected one)' : ''));
    ok($n->engine_alive, "$name: engine alive") unless $o{killed};
    is(join("\n", $n->sanitizer_lines), '', "$name: no sanitizer report in the engine's log");
}
sub chat_body {
    my ($seed, %extra) = @_;
    return $JSON->encode({ messages => [{ role => 'user', content => 'hi' }], seed => $seed, %extra });
}
sub open_chat { my ($seed, %extra) = @_; $n->open_post('/v1/chat/completions', chat_body($seed, %extra)) }
sub counters { my $h = $n->health->{json}; $h ? $h->{counters} : {} }
sub parse { MuseNginx::parse_response([[0, $_[0]]]) }
sub complete_ok {
    my ($res, $seed, $name) = @_;
    my $text = ($LONG_TEXT, 'ok', $HUGE_TEXT)[$seed];
    ok($res->{status} == 200 && MuseNginx::content_of($res) eq $text && MuseNginx::finish_sha($res) eq MuseNginx::sha_ids(@{ $S[$seed] })
       && MuseNginx::last_event($res) eq 'data: [DONE]', "$name: complete, right text and token_sha, [DONE]")
        or diag(substr($res->{raw}, 0, 600));
}
sub script_engine {
    my ($delay, @more) = @_;
    $n->start_real_engine(engine => $HOOKS, backend => 'script', script => \@S,
                          args => ['--script-delay-ms', $delay, '--streams', 2, '--queue', 4, '--context', 8192, @more]);
}
sub worker { my @w = $n->worker_pids; die "expected one nginx worker, got @w" unless @w == 1; $w[0] }
sub status_kb { MuseNginx::proc_status_kb(@_) }
# A client whose receive buffer is tiny (set before connect), so the server backs up at once.
sub slow_client {
    my ($bytes) = @_;
    socket(my $s, AF_INET, SOCK_STREAM, 0) or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, pack('i', 4096)) or die "SO_RCVBUF: $!";
    connect($s, pack_sockaddr_in($n->port, inet_aton('127.0.0.1'))) or die "connect: $!";
    syswrite($s, $bytes) == length $bytes or die "short write";
    return $s;
}

# ================= the sanitizer build reports: a deliberate overflow is caught =========
if ($ENV{MUSE_ENGINE_ASAN}) {
    eval { script_engine(20, '--fault-heap-overflow'); 1 };
    my @rep = $n->sanitizer_lines;
    ok(@rep && $rep[0] =~ /heap-buffer-overflow|AddressSanitizer|runtime error/, 'asan: a read past a block is reported (the check can fail)')
        or diag($n->engine_log);
    $n->stop_engine;
    unlink $n->dir . '/logs/engine.log';    # the cases below start from a clean log
}

# ================= 21: a client gone during a long prompt (cpu backend) =================
if (case_on(21)) {
    my $t0 = time;
    $n->start_real_engine(engine => $HOOKS, args => ['--streams', 2, '--queue', 2, '--context', 2304, '--max-rows', 16,
                                   '--prompt-cache-gib', 0]);
    $n->start_nginx(%NGINX);
    my $long = $JSON->encode({ prompt => [map { ($_ * 37 + 11) % 990 } 1 .. 2000], max_tokens => 4,
                               temperature => 0, stream => JSON::PP::true });
    my $wbody = $JSON->encode({ prompt => [map { ($_ * 53 + 5) % 990 } 1 .. 12], max_tokens => 24, temperature => 0 });
    my $alone = $n->request('POST', '/v1/completions', $wbody)->{json};
    ok($alone && $alone->{muse}{token_sha}, '21 long prompt: the witness alone');
    # the page is republished every 250 ms: wait until it counts the run alone
    my $c0 = MuseNginx::wait_until(2, sub { my $c = counters(); ($c->{tokens_out} // 0) > 0 ? $c : undef });
    my $kv0 = $n->kv_left;
    my $ls = $n->open_post('/v1/completions', $long);
    my $got = MuseNginx::read_some($ls, 3, qr/"text":""/);    # the role chunk: admitted, prompt being read
    ok($got->[0] =~ /^HTTP\/1\.1 200/, '21 long prompt: admitted (stream headers sent)');
    my $ws = $n->open_post('/v1/completions', $wbody);
    $got->[0] .= MuseNginx::read_some($ls, 0.6)->[0];
    unlike($got->[0], qr/"text":"[^"]/, '21 long prompt: still reading the prompt (2000 tokens, 16 a round) when it goes');
    close $ls;
    my $t_close = time;
    my $c1 = MuseNginx::wait_until(3, sub { my $c = counters(); ($c->{cancelled} // 0) > $c0->{cancelled} ? $c : undef });
    my $dt = time - $t_close;
    ok($c1, sprintf('21 long prompt: cancelled %.2f s after the close (a round is ~40 ms; /health every 250 ms)', $dt));
    ok($dt < 1.0, '21 long prompt: within a round or two (< 1 s including the health period)');
    my $w = MuseNginx::read_all($ws, 20)->{json};
    is($w && $w->{muse}{token_sha}, $alone->{muse}{token_sha}, '21 long prompt: the witness served meanwhile equals alone (token_sha)');
    my $h = $n->drained(3);
    ok($h, '21 long prompt: running back to 0');
    is($h && $h->{counters}{tokens_out} - $c0->{tokens_out}, $alone->{usage}{completion_tokens},
       '21 long prompt: tokens_out counts only the witness (none for the cancelled one)');
    is($n->kv_back_to($kv0), $kv0, '21 long prompt: KV back to baseline (the cancelled prompt\'s blocks returned)');
    after_case('21 long prompt');
    $took{21} = time - $t0;
}

$n->start_nginx(%NGINX) unless $n->port;

# ================= 22: a client that reads 1 byte/s =================
if (case_on(22)) {
    my $t0 = time;
    script_engine(0);
    my $wpid = worker();
    complete_ok($n->chat(chat_body(1, stream => JSON::PP::true)), 1, '22 warm-up');
    my ($rss0, $anon0) = (status_kb($wpid, 'VmRSS'), status_kb($wpid, 'RssAnon'));
    my $c0 = counters();
    my $s = slow_client(MuseNginx::post_bytes('/v1/chat/completions', chat_body(2, stream => JSON::PP::true)));
    my $received = '';
    sysread($s, $received, 1);
    $s->blocking(0);
    my $last_byte = time;
    my $one_byte_a_second = sub {
        return if time - $last_byte < 1;
        $last_byte = time;
        my $b;
        $received .= $b if sysread($s, $b, 1);
    };
    my $t_fill = time;
    my $full = MuseNginx::wait_until(4, sub {
        my $r = $n->ring_slots or return undef;
        my ($busy) = grep { $_->{state} == 3 } @{ $r->{slots} };
        $busy && $busy->{head} - $busy->{tail} > $r->{ring_bytes} - 4096 ? [$r, $busy] : undef;
    });
    ok($full, sprintf('22: the engine\'s ring for the slow client filled (%.2f s)', time - $t_fill));
    my ($ring, $slot) = $full ? @$full : ({ ring_bytes => 0 }, { head => 0, tail => 0 });
    ok($slot->{head} - $slot->{tail} <= $ring->{ring_bytes}, '22: never more than the ring in flight (no overwrite)');
    # the lane settles into its pause once nginx's own buffers are full too: a window of 0.5 s
    # in which the head does not move, within four windows (a busy machine fills the ring first)
    my ($same, $eng_cpu0, $head) = (undef, 0, $slot->{head});
    for my $try (1 .. 4) {
        $eng_cpu0 = MuseNginx::proc_cpu_s($n->engine_pid);
        sleep 0.5;
        $one_byte_a_second->();
        my $again = $n->ring_slots or last;
        my ($busy) = grep { $_->{state} == 3 } @{ $again->{slots} };
        last unless $busy;
        if ($busy->{head} == $head) { $same = $try; last }
        $head = $busy->{head};
    }
    ok($same, "22: the lane paused (the ring head did not move in 0.5 s: back-pressure; window " . ($same // 'none') . ")");
    my $eng_cpu = MuseNginx::proc_cpu_s($n->engine_pid) - $eng_cpu0;
    ok($eng_cpu < 0.25, sprintf('22: the paused engine does not spin (%.2f CPU s in 0.5 s)', $eng_cpu));
    my ($rss1, $anon1) = (status_kb($wpid, 'VmRSS'), status_kb($wpid, 'RssAnon'));
    ok($anon1 - $anon0 < 2048, "22: nginx worker buffers a bounded amount (RssAnon $anon0 -> $anon1 KiB, VmRSS $rss0 -> $rss1 KiB)");
    complete_ok($n->chat(chat_body(1, stream => JSON::PP::true)), 1, '22: another client served meanwhile');
    # send_timeout 2s: nginx gives up on the slow client and closes; the engine cancels the lane
    my $c1 = MuseNginx::wait_until(6, sub {
        $one_byte_a_second->();
        my $c = counters();
        ($c->{cancelled} // 0) > $c0->{cancelled} ? $c : undef;
    });
    my $dt = time - $t_fill;
    ok($c1, sprintf('22: send_timeout closed it and the engine cancelled the lane (%.1f s after it backed up)', $dt));
    ok($dt < 5, '22: within send_timeout (2 s) + slack');
    my $rest = MuseNginx::read_some($s, 3);
    close $s;
    ok($rest->[1], '22: the slow client sees the connection closed');
    my $res = parse($received . $rest->[0]);
    my $text = MuseNginx::content_of($res);
    ok($res->{status} == 200 && length($text) > 0 && $text eq substr($HUGE_TEXT, 0, length $text)
       && length($text) < length($HUGE_TEXT), sprintf('22: it got a clean prefix (%d of %d chars), no [DONE]', length $text, length $HUGE_TEXT));
    like($n->error_log, qr/timed out/, '22: error.log names the timeout');
    ok($n->drained(3), '22: running back to 0');
    after_case('22');

    # a reader that is slow but keeps reading: backed up longer than muse_idle_timeout (1.5 s
    # on /short), each write within send_timeout: the stream goes on (the engine is not idle)
    my $log_at = length $n->error_log;
    $s = slow_client(MuseNginx::post_bytes('/short/v1/chat/completions', chat_body(2, stream => JSON::PP::true)));
    $s->blocking(0);
    $received = '';
    my $t_read = time;
    # 3 s at least (twice the idle timeout); up to 8 s for the 100 chars on a slow (ASan) engine
    my $got = sub { length MuseNginx::content_of(parse($received)) };
    while (time - $t_read < 3 || ($got->() <= 100 && time - $t_read < 8)) {
        my $buf;
        $received .= $buf if sysread($s, $buf, 2048);
        sleep 0.25;
    }
    my $read_s = time - $t_read;
    close $s;
    my $part = parse($received);
    $text = MuseNginx::content_of($part);
    ok($part->{status} == 200 && length($text) > 100 && $text eq substr($HUGE_TEXT, 0, length $text) && $received !~ /"error"/,
       sprintf('22 steady slow reader: %d chars in %.1f s, no error', length $text, $read_s));
    unlike(substr($n->error_log, $log_at), qr/idle past muse_idle_timeout/, '22 steady slow reader: not taken for an idle engine');
    ok($n->drained(3), '22 steady slow reader: cancelled on close');
    after_case('22 steady slow reader');
    $took{22} = time - $t0;
}

# ================= 23: slowloris headers and bodies =================
if (case_on(23)) {
    my $t0 = time;
    script_engine(5) unless $n->engine_alive;
    my $c0 = counters();
    my (@heads, @bodies);
    for (1 .. 20) {
        my $s = $n->connect_raw;
        $s->autoflush(1);
        print $s "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n";
        push @heads, $s;
        $s = $n->connect_raw;
        $s->autoflush(1);
        print $s "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            . "Content-Length: 1000\r\n\r\n{\"messages\":";
        push @bodies, $s;
    }
    my $t_open = time;
    my $real = $n->chat(chat_body(1, stream => JSON::PP::true));
    complete_ok($real, 1, '23: a real client served among 40 slowloris connections');
    # headers dribbled every 0.3 s: client_header_timeout (1 s) is not reset by them
    my (%closed, %got_bytes);
    while (time - $t_open < 3.5 && keys(%closed) < 40) {
        for my $i (0 .. 19) {
            next if $closed{"h$i"};
            my $s = $heads[$i];
            local $SIG{PIPE} = 'IGNORE';
            syswrite($s, "X-Slow-$i: y\r\n");
        }
        my %sock = ((map { ("h$_" => $heads[$_]) } 0 .. 19), (map { ("b$_" => $bodies[$_]) } 0 .. 19));
        my $until = time + 0.3;
        while (time < $until) {
            my $rin = '';
            vec($rin, fileno($sock{$_}), 1) = 1 for grep { !$closed{$_} } keys %sock;
            next unless select(my $rout = $rin, undef, undef, 0.02);
            for my $k (grep { !$closed{$_} && vec($rout, fileno($sock{$_}), 1) } keys %sock) {
                my $got = sysread($sock{$k}, my $buf, 4096);
                $got_bytes{$k} .= $buf if $got;
                $closed{$k} = [time - $t_open, $got_bytes{$k} // ''] if defined $got && !$got;
            }
        }
    }
    my @h = grep { $closed{"h$_"} } 0 .. 19;
    my @b = grep { $closed{"b$_"} } 0 .. 19;
    is(scalar @h, 20, '23: every slowloris header connection closed');
    is(scalar @b, 20, '23: every slowloris body connection closed');
    my ($hmin, $hmax) = (sort { $a <=> $b } map { $closed{"h$_"}[0] } @h)[0, -1];
    my ($bmin, $bmax) = (sort { $a <=> $b } map { $closed{"b$_"}[0] } @b)[0, -1];
    ok(defined $hmax && $hmin > 0.7 && $hmax < 2.5, sprintf('23: headers closed at client_header_timeout (1 s), though still sending: %.2f .. %.2f s', $hmin // -1, $hmax // -1));
    ok(defined $bmax && $bmin > 0.7 && $bmax < 2.5, sprintf('23: bodies closed at client_body_timeout (1 s): %.2f .. %.2f s', $bmin // -1, $bmax // -1));
    my @answers = grep { length $_->[1] } values %closed;
    ok(!grep({ $_->[1] !~ /^HTTP\/1\.1 (408|400)/ } @answers), '23: nothing but a close (or 408) for them');
    close $_ for @heads, @bodies;
    is(counters()->{requests} - $c0->{requests}, 1, '23: none of them reached the engine');
    after_case('23');
    $took{23} = time - $t0;
}

# ================= 25: a burst of requests in about 1 s =================
if (case_on(25)) {
    my $t0 = time;
    script_engine(20);
    my $wpid = worker();
    complete_ok($n->chat(chat_body(1, stream => JSON::PP::true)), 1, '25 warm-up');
    # every slot taken (2 lanes + 4 queued, until muse_queue_timeout 3 s) by long streams
    my @hold = map { open_chat(2, stream => JSON::PP::true) } 1 .. 6;
    MuseNginx::wait_until(2, sub { my $h = $n->health->{json}; $h && $h->{streams}{running} == 2 && $h->{streams}{queued} == 4 });
    # after every slot was used once: the engine copies each slot's request area on first use
    my ($wrss0, $erss0) = (status_kb($wpid, 'VmRSS'), status_kb($n->engine_pid, 'VmRSS'));
    my $tb = time;
    my $res = $n->burst($BURST_N, sub { MuseNginx::post_bytes('/v1/chat/completions', chat_body(1)) },
                        concurrency => 100, secs => 1, timeout => 15);
    my $elapsed = time - $tb;
    my (%by, $bad_refusal, $hung, @t);
    for my $r (@$res) {
        $by{ $r->{status} }++;
        $hung++ unless defined $r->{t_end};
        push @t, $r->{t_end} if defined $r->{t_end};
        $bad_refusal++ if ($r->{status} == 503 || $r->{status} == 429)
            && !(($r->{retry_after} // '') =~ /^\d+$/ && $r->{json} && $r->{json}{error});
    }
    @t = sort { $a <=> $b } @t;
    my $summary = join ', ', map { "$_: $by{$_}" } sort keys %by;
    # the bounds are the shipped build's; under ASan+UBSan each reject's trip through the
    # engine's socket costs several times more, so that run checks the same at 4x
    my $slow = $ENV{MUSE_ENGINE_ASAN} ? 4 : 1;
    ok($elapsed < 5 * $slow, sprintf('25: %d requests sent and answered in %.2f s (%s)', $BURST_N, $elapsed, $summary));
    is(($by{503} // 0) + ($by{429} // 0) + ($by{200} // 0), $BURST_N, '25: each one 503/429 or served');
    ok(($by{503} // 0) + ($by{429} // 0) >= $BURST_N * 0.9, '25: the slots were full: rejected');
    is($bad_refusal // 0, 0, '25: every rejection is JSON with Retry-After');
    is($hung // 0, 0, '25: none hangs');
    # "fast" means answered at admission, not queued until muse_queue_timeout (3 s) frees a slot;
    # (CI's busy 2-core machine once went past the old 50 ms median / 1 s max; 3 busy loops here: 27 ms)
    my ($med_max, $max_max) = (0.25 * $slow, 2.5);
    ok(@t && $t[int(@t / 2)] < $med_max && $t[-1] < $max_max,
       sprintf('25: fast rejects, before the queue timeout (median %.1f ms < %d, max %.1f ms < %d)',
               1e3 * ($t[int(@t / 2)] // 0), 1e3 * $med_max, 1e3 * ($t[-1] // 0), 1e3 * $max_max));
    close $_ for @hold;
    my ($wrss1, $erss1) = (status_kb($wpid, 'VmRSS'), status_kb($n->engine_pid, 'VmRSS'));
    ok($wrss1 - $wrss0 < 4096, "25: nginx worker memory bounded (VmRSS $wrss0 -> $wrss1 KiB)");
    ok($erss1 - $erss0 < 4096, "25: engine memory bounded (VmRSS $erss0 -> $erss1 KiB)");
    my $active = MuseNginx::wait_until(3, sub { my $b = $n->request('GET', '/nginx_status')->{body}; $b =~ /Active connections: 1\b/ ? $b : undef });
    ok($active, '25: every connection closed (stub_status: 1 active, this one)');
    ok($n->drained(3), '25: slots back to baseline');
    complete_ok($n->chat(chat_body(1, stream => JSON::PP::true)), 1, '25: served normally afterwards');
    after_case('25');
    $took{25} = time - $t0;
}

# ================= 27: the engine stops emitting (ring never refilled) =================
if (case_on(27)) {
    my $t0 = time;
    script_engine(5, '--fault-stall-after-tokens', 12);
    my $wpid = worker();
    my $c0 = counters();
    my $s = $n->open_post('/short/v1/chat/completions', chat_body(0, stream => JSON::PP::true));
    my $pre = MuseNginx::read_some($s, 1, qr/"content":" "/);
    is(MuseNginx::content_of(parse($pre->[0])), 'w1 ', '27: the stream started (12 tokens, then the lane stalls)');
    my ($cpu0, $ecpu0, $ts) = (MuseNginx::proc_cpu_s($wpid), MuseNginx::proc_cpu_s($n->engine_pid), time);
    my $rest = MuseNginx::read_some($s, 4);
    my $waited = time - $ts;
    my ($cpu, $ecpu) = (MuseNginx::proc_cpu_s($wpid) - $cpu0, MuseNginx::proc_cpu_s($n->engine_pid) - $ecpu0);
    close $s;
    my $res = parse($pre->[0] . $rest->[0]);
    like(MuseNginx::last_event($res), qr/^data: \{"error":/, sprintf('27: an error event after the idle timeout (%.2f s, muse_idle_timeout 1.5 s)', $waited));
    ok($rest->[1] && $waited > 1.2 && $waited < 2.5, '27: the wait is bounded by muse_idle_timeout');
    is(MuseNginx::content_of($res), 'w1 ', '27: what came before is intact');
    ok($cpu < 0.05, sprintf('27: the worker does not spin while waiting (%.3f CPU s)', $cpu));
    ok($ecpu < 0.2, sprintf('27: nor does the engine (%.3f CPU s)', $ecpu));
    my $t1 = time;
    my $r = $n->request('POST', '/short/v1/chat/completions', chat_body(0));
    # admitted (the engine's first keepalive), then silent: the idle timer ends it
    is($r->{status}, 503, sprintf('27: non-streaming: 503 after %.2f s (muse_idle_timeout 1.5 s)', time - $t1));
    is($r->{json} && $r->{json}{error}{code}, 'engine_unavailable', '27: non-streaming: code engine_unavailable');
    my $h = $n->drained(3);
    ok($h && $h->{counters}{cancelled} - $c0->{cancelled} == 2, '27: both cancelled in the engine, lanes free');
    after_case('27');
    $took{27} = time - $t0;
}

# ================= 28: a corrupt ring position end to end (the rest: t/unit/test_ring.c) ======
if (case_on(28)) {
    my $t0 = time;
    script_engine(20);
    my $s = $n->open_post('/short/v1/chat/completions', chat_body(0, stream => JSON::PP::true));
    my $pre = MuseNginx::read_some($s, 2, qr/"content":"1"/);
    my $ring = $n->ring_slots;
    my ($i) = grep { $ring->{slots}[$_]{state} == 3 } 0 .. $#{ $ring->{slots} };
    ok(defined $i, '28: the stream\'s slot is active');
    # a tail far past the head, as a buggy or hostile worker would write it
    open my $fh, '+<:raw', $n->segment_path or die "the engine's segment: $!";
    sysseek($fh, 0, 0);
    sysread($fh, my $hdr, 256);
    my ($stride, $table) = unpack 'Q<Q<', substr($hdr, 40, 16);
    sysseek($fh, $table + $i * $stride + 128, 0);
    syswrite($fh, pack('Q<', $ring->{slots}[$i]{head} + 3 * $ring->{ring_bytes}));
    close $fh;
    my $t_bad = time;
    my $rest = MuseNginx::read_some($s, 4);
    my $dt = time - $t_bad;
    close $s;
    my $res = parse($pre->[0] . $rest->[0]);
    # the engine cancels the slot and shuts its doorbell: the worker learns at once, long
    # before muse_idle_timeout (1.5 s on /short)
    like(MuseNginx::last_event($res), qr/^data: \{"error":/, sprintf('28: the request ends with an error event (%.2f s later)', $dt));
    ok($dt < 0.75, '28: at once, not at the idle timeout');
    ok($rest->[1], '28: and closes');
    ok(MuseNginx::wait_until(2, sub { $n->engine_log =~ /corrupt tail/ }), '28: the engine logs the corrupt tail');
    ok($n->drained(3), '28: lanes free');
    complete_ok($n->chat(chat_body(1, stream => JSON::PP::true)), 1, '28: the next request is served');
    after_case('28');
    $took{28} = time - $t0;
}

# ================= 31: device out of memory for one request; a sticky device error ==========
if (case_on(31)) {
    my $t0 = time;
    script_engine(5, '--fault-oom-request', 2);
    my $c0 = counters();
    my @r = map { $n->chat(chat_body(1)) } 1 .. 3;
    is($r[0]{status}, 200, '31 oom: request 1 served');
    is($r[1]{status}, 503, '31 oom: request 2 (the injected OOM) gets 503');
    is($r[1]{json} && $r[1]{json}{error}{code}, 'out_of_memory', '31 oom: code out_of_memory');
    like($r[1]{json} && $r[1]{json}{error}{message}, qr/out of memory/, '31 oom: a clear message');
    is($r[2]{status}, 200, '31 oom: the engine keeps serving (request 3)');
    my $h = MuseNginx::wait_until(2, sub { my $c = counters(); $c->{errors} - $c0->{errors} == 1 ? $c : undef });
    ok($h, '31 oom: counted as one error');
    after_case('31 oom');

    script_engine(20, '--fault-sticky-after-tokens', 12);
    my $pid = $n->engine_pid;
    my $s = open_chat(0, stream => JSON::PP::true);
    my $x = MuseNginx::read_some($s, 3);
    my $t_end = time;
    close $s;
    my $res = parse($x->[0]);
    is($res->{status}, 200, '31 sticky: the stream had started');
    is(MuseNginx::content_of($res), 'w1 ', '31 sticky: the tokens before the fault arrived');
    like(MuseNginx::last_event($res), qr/^data: \{"error":/, '31 sticky: then an error event, no [DONE]');
    my $exited = MuseNginx::wait_until(2, sub { waitpid($pid, WNOHANG) == $pid ? [$?] : undef });
    ok($exited, '31 sticky: the engine exited at once');
    is($exited && $exited->[0] >> 8, 3, '31 sticky: exit status 3 (MUSE_EXIT_DEVICE_FATAL)');
    delete $n->{engine_pid};
    like($n->engine_log, qr/sticky device error.*FATAL/, '31 sticky: the engine says why');
    my $hr = $n->health;
    is($hr->{status}, 503, '31 sticky: /health 503');
    is($hr->{json} && $hr->{json}{reason}, 'engine reported a fatal error', '31 sticky: /health names the fatal state');
    my $after = $n->chat(chat_body(1));
    is($after->{status}, 503, '31 sticky: no 200 after the fault (503)');
    is($after->{json} && $after->{json}{error}{code}, 'engine_unavailable', '31 sticky: engine_unavailable');
    after_case('31 sticky', killed => 1);

    # the model backend: the hook only forces the backend's own failure path (end_round)
    $n->start_real_engine(engine => $HOOKS, args => ['--streams', 2, '--context', 256,
                                                    '--fault-sticky-after-tokens', 3]);
    $pid = $n->engine_pid;
    my $m = $n->parallel([MuseNginx::post_bytes('/v1/completions',
        $JSON->encode({ prompt => [5, 6, 7], max_tokens => 20, temperature => 0 }))], 10)->[0];
    isnt($m->{status}, 200, '31 sticky (cpu backend): the request does not complete as if nothing happened')
      or diag($m->{body});
    $exited = MuseNginx::wait_until(2, sub { waitpid($pid, WNOHANG) == $pid ? [$?] : undef });
    is($exited && $exited->[0] >> 8, 3, '31 sticky (cpu backend): exit status 3 within 2 s');
    delete $n->{engine_pid};
    like($n->engine_log, qr/sticky device error: device error on rank 0 \(cpu\).*FATAL/,
         '31 sticky (cpu backend): the failure comes back from the backend\'s end_round');
    $hr = $n->health;
    is($hr->{status}, 503, '31 sticky (cpu backend): /health 503');
    after_case('31 sticky cpu', killed => 1);
    $took{31} = time - $t0;
}

# ================= 32: nginx -s reload with live streams; kill -9 a worker =================
if (case_on(32)) {
    my $t0 = time;
    script_engine(20);
    my $old = worker();
    my @live = map { open_chat(0, stream => JSON::PP::true) } 1 .. 2;
    my @pre = map { MuseNginx::read_some($_, 2, qr/"content":"1"/)->[0] } @live;
    ok(!grep({ !/"content":"1"/ } @pre), '32 reload: two streams running');
    my @new = $n->reload;
    ok(@new == 1 && $new[0] != $old, "32 reload: a new worker ($old -> @new)");
    ok(kill(0, $old), '32 reload: the old worker stays while its streams run');
    my $r = $n->chat(chat_body(1, stream => JSON::PP::true));
    complete_ok($r, 1, '32 reload: a new request served');
    is($r->{headers}{'x-worker-pid'}, $new[0], '32 reload: by the new worker');
    my @res = map { my $x = MuseNginx::read_all($live[$_], 5); parse($pre[$_] . $x->{raw}) } 0 .. 1;
    complete_ok($res[$_], 0, "32 reload: live stream $_ finished") for 0 .. 1;
    ok(!grep({ ($_->{headers}{'x-worker-pid'} // '') ne $old } @res), '32 reload: on the old worker');
    ok(MuseNginx::wait_until(3, sub { !kill(0, $old) }), '32 reload: the old worker exits after them');
    after_case('32 reload');

    my $victim = worker();
    my $c0 = counters();
    my $s = open_chat(0, stream => JSON::PP::true);
    my $pre = MuseNginx::read_some($s, 2, qr/"content":"1"/);
    ok($pre->[0] =~ /"content":"1"/, '32 kill: a stream running on worker ' . $victim);
    kill 'KILL', $victim;
    my $t_kill = time;
    my $gone = MuseNginx::read_some($s, 2);
    close $s;
    ok($gone->[1], '32 kill: the client sees the connection end');
    my $h = MuseNginx::wait_until(3, sub {
        my $x = $n->health->{json};
        $x && $x->{streams}{running} == 0 && $x->{streams}{queued} == 0 && $x->{counters}{cancelled} > $c0->{cancelled} ? $x : undef;
    });
    ok($h, sprintf('32 kill: the engine cancelled the dead worker\'s stream (%.2f s)', time - $t_kill));
    my $ring = $n->ring_slots;
    ok($ring && !grep({ $_->{state} != 0 } @{ $ring->{slots} }), '32 kill: every slot free again (its doorbell closed)');
    my ($respawned) = MuseNginx::wait_until(3, sub { my @w = grep { $_ != $victim } $n->worker_pids; @w ? \@w : undef });
    ok($respawned, '32 kill: nginx started another worker');
    complete_ok($n->chat(chat_body(1, stream => JSON::PP::true)), 1, '32 kill: new requests served');
    # the master logs the killed worker as [alert]: exactly that line is expected
    my $expected = qr/\[alert\] \d+#\d+: worker process $victim exited on signal 9/;
    like($n->error_log, $expected, '32 kill: the master logged the killed worker');
    after_case('32 kill', allow => $expected);
    $took{32} = time - $t0;
}

# the last engine exits on SIGTERM: under ASan its leak check runs now
if ($n->engine_pid) {
    $n->stop_engine;
    is(join("\n", $n->sanitizer_lines), '', 'no sanitizer report after the engine exits (leaks included)');
    is($n->{engine_status}, 0, 'the engine exits 0 on SIGTERM');
}
diag(sprintf('serve_faults2: %.1f s (%s)', time - $t_start, join ', ', map { sprintf '%s: %.1f s', $_, $took{$_} } sort keys %took));
done_testing();
