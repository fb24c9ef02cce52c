package MuseNginx;
# Test harness (core Perl only): runs nginx with ngx_muse_module from a temp prefix on
# 127.0.0.1 and a free port, the scripted test engine beside it, raw-socket HTTP with
# time-stamped SSE events, and error.log checks for [alert]/[crit].
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(:sys_wait_h);
use Time::HiRes qw(time sleep);

my $ROOT = abs_path(dirname(__FILE__) . '/../..');
my $BUILD = $ENV{MUSE_BUILD} // 'build';
$BUILD = "$ROOT/$BUILD" unless $BUILD =~ m{^/};

sub module_path { "$BUILD/nginx/ngx_muse_module.so" }
sub engine_path { "$BUILD/t/muse-test-engine" }
sub real_engine_path { $ENV{MUSE_ENGINE} || "$BUILD/muse-engine" }    # MUSE_ENGINE: another build
# built with -DMUSE_TEST_HOOKS; MUSE_ENGINE_ASAN=1 picks the same with ASan and UBSan
sub hooks_engine_path { $ENV{MUSE_ENGINE_ASAN} ? "$BUILD/t/muse-engine-asan" : "$BUILD/t/muse-engine-test" }
sub pack_tool_path { "$BUILD/muse-pack" }
# MUSE_NGINX: another nginx binary (Debian's, unpacked with dpkg -x where nginx is not installed)
sub nginx_bin { $ENV{MUSE_NGINX} || '/usr/sbin/nginx' }
sub root { $ROOT }

# Why the tests cannot run here, or undef.
# In CI nothing may be missing: a reason to skip is a failure there.
sub _in_ci { my ($why) = @_; die "cannot run: $why\n" if defined $why && $ENV{CI}; $why }

sub missing { _in_ci(_missing()) }
sub missing_real { _in_ci(_missing_real()) // _missing_backend() }

# MUSE_TEST_BACKEND=cuda where the engine cannot make it (no GPU, CI): a visible skip, never a
# failure, as the op harness does
sub _missing_backend {
    my $b = $ENV{MUSE_TEST_BACKEND} // 'cpu';
    return undef if $b eq 'cpu' || !-x real_engine_path();
    my $out = `'@{[real_engine_path()]}' logits --backend '$b' --model '@{[tiny_pack()]}' --tokens 1 --out /dev/null 2>&1`;
    return $? ? "no $b backend here: " . (split /\n/, $out)[0] : undef;
}

sub _missing {
    return "nginx not installed: " . nginx_bin() unless -x nginx_bin();
    return "module not built: " . module_path() unless -f module_path();
    return "test engine not built: " . engine_path() unless -x engine_path();
    return undef;
}

# Why the real-engine tests (t/serve_*.t) cannot run here, or undef.
sub _missing_real {
    return "nginx not installed: " . nginx_bin() unless -x nginx_bin();
    return "module not built: " . module_path() unless -f module_path();
    return "engine not built: " . real_engine_path() unless -x real_engine_path();
    return "muse-pack not built: " . pack_tool_path() unless -x pack_tool_path();
    return "python3 missing (t/tools/make_tiny_tokenizer.py)" unless -x '/usr/bin/python3';
    return undef;
}

my $SEQ = 0;

sub new {
    my ($class, %o) = @_;
    my $dir = tempdir('muse-nginx-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    mkdir "$dir/$_" for qw(logs tmp conf);
    chmod 0755, $dir;
    $SEQ++;
    my $self = bless {
        dir    => $dir,
        shm    => "/muse-t-$$-$SEQ",
        socket => "$dir/engine.sock",
        %o,
    }, $class;
    return $self;
}

sub dir { $_[0]{dir} }
sub port { $_[0]{port} }

sub free_port {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp',
                                  Listen => 1, ReuseAddr => 1) or die "no free port: $!";
    my $p = $s->sockport;
    close $s;
    return $p;
}

# Starts the scripted engine; waits for its "ready" line.
sub start_engine {
    my ($self, @args) = @_;
    $self->stop_engine;
    my $pid = open(my $out, '-|', engine_path(), '--shm', $self->{shm}, '--socket',
                   $self->{socket}, @args) // die "cannot start the test engine: $!";
    my $line;
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm 5;
        $line = <$out>;
        alarm 0;
    };
    die "test engine did not become ready" unless defined $line && $line =~ /ready/;
    $self->{engine_pid} = $pid;
    $self->{engine_fh} = $out;
    return $pid;
}

sub stop_engine {
    my ($self, $sig) = @_;
    my $pid = delete $self->{engine_pid} or return;
    kill 'CONT', $pid;    # a stopped engine cannot act on TERM
    kill($sig // 'TERM', $pid);
    my $t0 = time;
    while (waitpid($pid, WNOHANG) == 0) {
        if (time - $t0 > 5) { kill 'KILL', $pid; waitpid($pid, 0); last }
        sleep 0.02;
    }
    $self->{engine_status} = $?;
    my $fh = delete $self->{engine_fh};
    close $fh if $fh;
    unlink $self->{socket} if $sig && $sig eq 'KILL';
}

# ---- the real engine (muse-engine serve) ----

# A tiny random-weight pack (conf/packs/tiny.json, seed 1) with the byte-level BPE test
# tokenizer (t/tools/make_tiny_tokenizer.py, control tokens at 1000..1005); made once per
# test process in a temp dir.
my $TINY_PACK;
sub tiny_pack {
    return $TINY_PACK if $TINY_PACK;
    my $dir = tempdir('muse-pack-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $dir;
    my $out = `'@{[pack_tool_path()]}' --config '$ROOT/conf/packs/tiny.json' --out '$dir/pack' --seed 1 2>&1`;
    die "muse-pack failed: $out" if $?;
    system('/usr/bin/python3', "$ROOT/t/tools/make_tiny_tokenizer.py", "$dir/pack/tokenizer.json") == 0
        or die "make_tiny_tokenizer.py failed";
    return $TINY_PACK = "$dir/pack";
}

# The test tokenizer's control token ids (by content, see make_tiny_tokenizer.py).
our %CTL = (bot => 1000, end => 1001, eom => 1002, eot => 1003, start => 1004, message => 1005);

# Token ids of text under the pack's tokenizer (special-token parsing off), via
# `muse-engine tokenize`.
sub tokenize {
    my ($text, $tokenizer) = @_;
    $tokenizer //= tiny_pack() . '/tokenizer.json';
    my $f = File::Temp->new;
    binmode $f;
    print $f $text;
    close $f;
    my $out = `'@{[real_engine_path()]}' tokenize --tokenizer '$tokenizer' --text-file '$f'`;
    die "muse-engine tokenize failed" if $?;
    chomp $out;
    return [map { 0 + $_ } grep { length } split /,/, $out];
}

# Starts `muse-engine serve` (or, with engine => PATH, another build of it) on this harness's
# socket and segment: %o: backend cpu|script, model DIR (default tiny_pack for cpu), script
# (array ref of id arrays, written to a file), tokenizer, args (more flags). Waits for the
# "serving" line of its log (logs/engine.log).
sub start_real_engine {
    my ($self, %o) = @_;
    $self->stop_engine;
    # MUSE_TEST_BACKEND=cuda (make test-gpu): the same tests against the GPU backend
    my $backend = $o{backend} // $ENV{MUSE_TEST_BACKEND} // 'cpu';
    my @args = ('serve', '--listen', $self->{socket}, '--shm', $self->{shm}, '--backend', $backend);
    if ($backend eq 'script') {
        my $file = "$self->{dir}/script.json";
        open my $fh, '>', $file or die $!;
        print $fh JSON::PP->new->encode($o{script});
        close $fh;
        push @args, '--script', $file, '--tokenizer', $o{tokenizer} // tiny_pack() . '/tokenizer.json';
    } elsif (!$o{no_model}) {    # no_model: the args name the weights (--synthetic-weights)
        push @args, '--model', $o{model} // tiny_pack();
    }
    # a lane waiting (for KV, behind a slow sanitizer build) must beat the test's 3 s
    # muse_idle_timeout, as the engine's 5 s default beats nginx's 60 s in production
    push @args, '--keepalive-ms', '1000' unless grep { $_ eq '--keepalive-ms' } @{ $o{args} // [] };
    push @args, @{ $o{args} // [] };
    my $log = "$self->{dir}/logs/engine.log";
    my $from = -s $log // 0;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>>', $log;
        open STDERR, '>>', $log;
        exec $o{engine} // real_engine_path(), @args;
        exit 127;
    }
    $self->{engine_pid} = $pid;
    my $t0 = time;
    while (time - $t0 < 20) {
        my $text = substr($self->slurp($log), $from);
        return $pid if $text =~ /serving/;
        if (waitpid($pid, WNOHANG) == $pid) {
            delete $self->{engine_pid};
            die "muse-engine serve exited: $text";
        }
        sleep 0.02;
    }
    die "muse-engine serve did not start: " . substr($self->slurp($log), $from);
}

sub engine_pid { $_[0]{engine_pid} }

# 1 while the engine process runs (not reaped).
sub engine_alive {
    my ($self) = @_;
    my $pid = $self->{engine_pid} or return 0;
    return waitpid($pid, WNOHANG) == 0 ? 1 : 0;
}

sub engine_log { $_[0]->slurp("$_[0]{dir}/logs/engine.log") }

# Sanitizer reports (ASan, UBSan, LeakSanitizer) in the engine's log, one line each.
sub sanitizer_lines {
    my ($self) = @_;
    return grep { /ERROR: (?:Address|Leak)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer/ }
        split /\n/, $self->engine_log // '';
}

# Writes the conf: $o{locations} (server-level text), $o{http} (http-level text), $o{main}
# (main-context text, e.g. worker_shutdown_timeout), $o{events} (the events block's text,
# default worker_connections 256), $o{listen} (more listen parameters, e.g. sndbuf=16k).
sub start_nginx {
    my ($self, %o) = @_;
    my $dir = $self->{dir};
    $self->{port} = free_port();
    my $user = $> == 0 ? "user root;\n" : '';
    my $mod = module_path();
    my $locations = $o{locations} // $self->default_locations;
    my $http = $o{http} // '';
    my $main = $o{main} // '';
    my $events = $o{events} // 'worker_connections 256;';
    my $listen = defined $o{listen} ? " $o{listen}" : '';
    open my $fh, '>', "$dir/conf/nginx.conf" or die $!;
    print $fh <<"EOF";
load_module $mod;
${user}worker_processes 1;
daemon off;
error_log $dir/logs/error.log info;
pid $dir/logs/nginx.pid;
$main
events { $events }
http {
    access_log $dir/logs/access.log;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    muse_engine $self->{socket} @{[ engine_user() ]};
$http
    server {
        listen 127.0.0.1:$self->{port}$listen;
$locations
    }
}
EOF
    close $fh;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDERR, '>>', "$dir/logs/stderr.log";
        open STDOUT, '>>', "$dir/logs/stderr.log";
        exec nginx_bin(), '-e', 'stderr', '-p', $dir, '-c', "$dir/conf/nginx.conf";
        exit 127;
    }
    $self->{nginx_pid} = $pid;
    for (1 .. 250) {
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$self->{port}", Timeout => 1);
        if ($s) { close $s; return 1 }
        die "nginx exited: " . $self->slurp("$dir/logs/stderr.log") . $self->error_log
            if waitpid($pid, WNOHANG) == $pid;
        sleep 0.02;
    }
    die "nginx did not start";
}

sub nginx_pid { $_[0]{nginx_pid} }

# Pids of the nginx master's live children (workers, also old ones after a reload), sorted.
sub worker_pids {
    my ($self) = @_;
    my $master = $self->{nginx_pid} or return ();
    my @kids;
    for my $stat (glob '/proc/[0-9]*/stat') {
        open my $fh, '<', $stat or next;
        my $line = <$fh> // next;
        # pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'
        my ($pid, $rest) = $line =~ /^(\d+) \(.*\) (.*)$/s or next;
        my ($state, $ppid) = split ' ', $rest;
        push @kids, $pid + 0 if $ppid == $master && $state ne 'Z';
    }
    return sort { $a <=> $b } @kids;
}

# `nginx -s reload` on this harness's conf; returns the new workers' pids once they run and
# every old worker has stopped accepting (its title says "shutting down") or exited.
sub reload {
    my ($self) = @_;
    my @old = $self->worker_pids;
    my %old = map { $_ => 1 } @old;
    my $dir = $self->{dir};
    my $out = `'@{[nginx_bin()]}' -e stderr -p '$dir' -c '$dir/conf/nginx.conf' -s reload 2>&1`;
    die "nginx -s reload failed: $out" if $?;
    my $shutting = sub {
        my ($pid) = @_;
        open my $fh, '<', "/proc/$pid/cmdline" or return 1;
        local $/;
        return (<$fh> // '') =~ /shutting down/;
    };
    wait_until(5, sub { (grep { !$old{$_} } $self->worker_pids) && !grep { !$shutting->($_) } @old })
        or die "no new worker after reload";
    return grep { !$old{$_} } $self->worker_pids;
}

# A /proc/PID/status figure in KiB (VmRSS, VmHWM, RssAnon...; 0 when gone).
sub proc_status_kb {
    my ($pid, $field) = @_;
    open my $fh, '<', "/proc/$pid/status" or return 0;
    while (<$fh>) { return $1 + 0 if /^\Q$field\E:\s+(\d+)/ }
    return 0;
}

# Resident set size of a process in KiB (0 when gone).
sub proc_rss_kb { proc_status_kb($_[0], 'VmRSS') }

# Runs test script $test in place of this one with the engine built with ASan and UBSan
# (build/t/muse-engine-asan) as both the real and the hooks engine; skips (fails in CI) when
# it is not built.
sub exec_with_asan_engine {
    my ($test) = @_;
    my $asan = "$BUILD/t/muse-engine-asan";
    if (!-x $asan) {
        require Test::More;
        Test::More::plan(skip_all => _in_ci("$asan (mk/testengine.mk) not built"));
        exit 0;
    }
    $ENV{MUSE_ENGINE} = $asan;
    $ENV{MUSE_ENGINE_ASAN} = 1;
    # a report stops the engine; leaks are reported when it exits
    $ENV{ASAN_OPTIONS} = 'halt_on_error=1:detect_leaks=1';
    $ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
    exec $test or die "exec $test: $!";
}

# CPU seconds (user + system) a process has used so far (undef when gone).
sub proc_cpu_s {
    my ($pid) = @_;
    open my $fh, '<', "/proc/$pid/stat" or return undef;
    my ($rest) = <$fh> =~ /\) (.*)$/s or return undef;
    my @f = split ' ', $rest;    # f[0] is field 3 (state): utime is field 14, stime 15
    return ($f[11] + $f[12]) / POSIX::sysconf(POSIX::_SC_CLK_TCK());
}

# The user the engines run as (this test's user): muse_engine's second argument.
sub engine_user { scalar getpwuid($>) }

# The engine's segment as a path this process may open: its memfd in /proc/<engine pid>/fd
# (there is no name in /dev/shm; opening it needs the engine's user or root). undef if none.
sub segment_path {
    my ($self) = @_;
    my $pid = $self->{engine_pid} or return undef;
    for my $fd (glob "/proc/$pid/fd/*") {
        my $to = readlink($fd) // next;
        return $fd if $to =~ m{^/memfd:};
    }
    return undef;
}

# The engine segment's slot table as the worker sees it (read through segment_path):
# ring_bytes and, per slot, state (0 free .. 3 active), owner_pid, head and tail (ring bytes
# written by the engine and consumed by the worker). docs/abi.md / engine/abi/muse_ring.h give
# the offsets.
sub ring_slots {
    my ($self) = @_;
    my $path = $self->segment_path // return undef;
    open my $fh, '<:raw', $path or return undef;
    my $get = sub {
        my ($off, $len) = @_;
        my $buf;
        sysseek($fh, $off, 0);
        return (sysread($fh, $buf, $len) // -1) == $len ? $buf : undef;
    };
    my $hdr = $get->(0, 256) // return undef;
    my ($count) = unpack 'L<', substr($hdr, 32, 4);
    my ($stride, $table) = unpack 'Q<Q<', substr($hdr, 40, 16);
    my ($ring) = unpack 'Q<', substr($hdr, 64, 8);
    my @slots;
    for my $i (0 .. $count - 1) {
        my $sl = $get->($table + $i * $stride, 192) // last;
        my ($state, $owner) = unpack 'L<L<', $sl;
        my ($head) = unpack 'Q<', substr($sl, 64, 8);
        my ($tail) = unpack 'Q<', substr($sl, 128, 8);
        push @slots, { state => $state, owner_pid => $owner, head => $head, tail => $tail };
    }
    return { ring_bytes => $ring, slots => \@slots };
}

# The hardened-style locations most tests use.
sub default_locations {
    my ($self) = @_;
    # an ASan+UBSan engine reads a prompt ~10x slower: on a busy 2-core machine one round can
    # outlast 3 s with no event to send (keepalives go out between rounds), so it gets 10 s
    my $idle = $ENV{MUSE_ENGINE_ASAN} ? '10s' : '3s';
    return <<'EOF' =~ s/IDLE_TIMEOUT/$idle/r;
        client_max_body_size 64k;
        client_body_buffer_size 16k;
        large_client_header_buffers 4 8k;
        muse_model_id muse-spark;
        muse_queue_timeout 3s;
        muse_idle_timeout IDLE_TIMEOUT;
        error_page 400 /_muse_error_400;
        error_page 413 /_muse_error_413;
        error_page 414 /_muse_error_414;
        error_page 494 /_muse_error_494;
        error_page 501 /_muse_error_501;
        error_page 500 502 504 /_muse_error_5xx;
        location = /_muse_error_400 { internal; default_type application/json;
            return 400 '{"error":{"message":"bad request","type":"invalid_request_error","param":null,"code":null}}'; }
        location = /_muse_error_413 { internal; default_type application/json;
            return 413 '{"error":{"message":"request body too large","type":"invalid_request_error","param":null,"code":"request_too_large"}}'; }
        location = /_muse_error_414 { internal; default_type application/json;
            return 414 '{"error":{"message":"request URI too long","type":"invalid_request_error","param":null,"code":null}}'; }
        location = /_muse_error_494 { internal; default_type application/json;
            return 400 '{"error":{"message":"request headers too large","type":"invalid_request_error","param":null,"code":null}}'; }
        location = /_muse_error_501 { internal; default_type application/json;
            return 501 '{"error":{"message":"not implemented: send the body plainly or with Transfer-Encoding: chunked","type":"invalid_request_error","param":null,"code":null}}'; }
        location = /_muse_error_5xx { internal; default_type application/json;
            return 500 '{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}'; }
        location = /v1/chat/completions { muse_serve chat; muse_cache_scope $http_x_tenant; }
        location = /v1/completions { muse_serve completions; }
        location = /v1/models { muse_serve models; }
        location = /health { muse_serve health; }
        location = /metrics { muse_serve metrics; }
EOF
}

sub stop_nginx {
    my ($self) = @_;
    my $pid = delete $self->{nginx_pid} or return;
    kill 'QUIT', $pid;
    my $t0 = time;
    while (waitpid($pid, WNOHANG) == 0) {
        if (time - $t0 > 5) { kill 'TERM', $pid; }
        if (time - $t0 > 8) { kill 'KILL', $pid; waitpid($pid, 0); last }
        sleep 0.02;
    }
}

sub slurp {
    my ($self, $f) = @_;
    open my $fh, '<', $f or return '';
    local $/;
    return scalar <$fh>;
}

sub error_log { $_[0]->slurp("$_[0]{dir}/logs/error.log") }

# Lines of error.log with [alert] or [crit] (a test fails on any).
sub bad_log_lines {
    my ($self) = @_;
    return grep { /\[(alert|crit|emerg)\]/ } split /\n/, $self->error_log;
}

sub DESTROY {
    my ($self) = @_;
    local ($?, $!, $@);    # waitpid here must not become the test's exit status
    $self->stop_nginx;
    $self->stop_engine;
}

# ---- HTTP over raw sockets ----

sub connect_raw {
    my ($self) = @_;
    return IO::Socket::INET->new(PeerAddr => "127.0.0.1:$self->{port}", Timeout => 5)
        // die "connect: $!";
}

# Sends bytes exactly as given; reads to EOF with a timestamp per read.
sub raw {
    my ($self, $bytes, %o) = @_;
    my $s = $self->connect_raw;
    $s->autoflush(1);
    my $t0 = time;
    print $s $bytes;
    my (@reads, $buf);
    my $deadline = time + ($o{timeout} // 10);
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    while (time < $deadline) {
        my $n = select(my $rout = $rin, undef, undef, 0.2);
        next unless $n;
        my $got = sysread($s, $buf, 65536);
        last unless $got;
        push @reads, [time - $t0, $buf];
    }
    close $s;
    return parse_response(\@reads);
}

sub parse_response {
    my ($reads) = @_;
    my ($raw, @at) = ('');
    for my $r (@$reads) {
        push @at, [length($raw), $r->[0]];
        $raw .= $r->[1];
    }
    my %res = (raw => $raw, status => 0, headers => {}, body => '', events => []);
    my $he = index($raw, "\r\n\r\n");
    return \%res if $he < 0;
    my @hl = split /\r\n/, substr($raw, 0, $he);
    my $sl = shift @hl;
    ($res{status}) = $sl =~ m{^HTTP/1\.[01] (\d+)};
    for (@hl) { my ($k, $v) = /^([^:]+):\s*(.*)$/ or next; $res{headers}{lc $k} = $v }
    my $pos = $he + 4;
    my $time_at = sub {
        my ($off) = @_;
        my $t = 0;
        for (@at) { last if $_->[0] > $off; $t = $_->[1] }
        return $t;
    };
    my ($body, @btime) = ('');
    if (($res{headers}{'transfer-encoding'} // '') =~ /chunked/i) {
        while ($pos < length $raw) {
            my $le = index($raw, "\r\n", $pos);
            last if $le < 0;
            my $size = hex substr($raw, $pos, $le - $pos);
            last if $size == 0;
            my $start = $le + 2;
            $body .= substr($raw, $start, $size);
            push @btime, [$start + $size - 1, length($body) - 1];
            $pos = $start + $size + 2;
        }
    } else {
        $body = substr($raw, $pos);
        push @btime, [length($raw) - 1, length($body) - 1];
    }
    $res{body} = $body;
    # SSE events with the arrival time of their last byte
    my $off = 0;
    while ((my $e = index($body, "\n\n", $off)) >= 0) {
        my $text = substr($body, $off, $e - $off);
        my $rawoff = 0;
        for (@btime) { if ($_->[1] >= $e + 1) { $rawoff = $_->[0]; last } }
        push @{ $res{events} }, { text => $text, t => $time_at->($rawoff) };
        $off = $e + 2;
    }
    $res{json} = eval { JSON::PP->new->decode($body) } if $body =~ /^\s*[\{\[]/;
    return \%res;
}

sub request {
    my ($self, $method, $path, $body, %h) = @_;
    my $req = "$method $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
    $req .= "$_: $h{$_}\r\n" for grep { $_ ne 'timeout' } sort keys %h;
    if (defined $body) {
        $req .= "Content-Type: application/json\r\nContent-Length: " . length($body) . "\r\n";
    }
    $req .= "\r\n" . ($body // '');
    return $self->raw($req, timeout => $h{timeout});
}

sub chat {
    my ($self, $body, %h) = @_;
    return $self->request('POST', '/v1/chat/completions', $body, %h);
}

# The raw bytes of a POST with a JSON body.
sub post_bytes {
    my ($path, $body, %h) = @_;
    my $req = "POST $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
    $req .= "$_: $h{$_}\r\n" for sort keys %h;
    return $req . "Content-Type: application/json\r\nContent-Length: " . length($body)
        . "\r\n\r\n$body";
}

# Opens a connection and sends a POST without reading: the socket, for partial reads
# (read_some) or a disconnect (close).
sub open_post {
    my ($self, $path, $body, %h) = @_;
    my $s = $self->connect_raw;
    $s->autoflush(1);
    print $s post_bytes($path, $body, %h);
    return $s;
}

# Reads what arrives on $s within $secs (or until EOF); returns [bytes, eof].
sub read_some {
    my ($s, $secs, $until) = @_;
    my ($got, $eof) = ('', 0);
    my $deadline = time + $secs;
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    while (time < $deadline) {
        my $n = select(my $rout = $rin, undef, undef, 0.05);
        next unless $n;
        my $k = sysread($s, my $buf, 65536);
        if (!$k) { $eof = 1; last }
        $got .= $buf;
        last if $until && $got =~ $until;
    }
    return [$got, $eof];
}

# Sends every request (raw bytes) at once on its own connection and reads all of them to EOF
# (at most $timeout s); returns the parsed responses in order, each with t_end (seconds from
# the start to EOF, undef when it never came) and the reads' timestamps.
sub parallel {
    my ($self, $reqs, $timeout) = @_;
    my $t0 = time;
    my (@socks, @reads, @tend);
    for my $i (0 .. $#$reqs) {
        my $s = $self->connect_raw;
        $s->blocking(0);
        push @socks, $s;
        $reads[$i] = [];
    }
    # all connected first, then all sent, so they reach nginx together
    for my $i (0 .. $#$reqs) {
        my $bytes = $reqs->[$i];
        while (length $bytes) {
            my $n = syswrite($socks[$i], $bytes);
            if (defined $n) { substr($bytes, 0, $n, '') } else { sleep 0.001 }
        }
    }
    my %open = map { $_ => 1 } 0 .. $#socks;
    while (%open && time - $t0 < ($timeout // 20)) {
        my $rin = '';
        vec($rin, fileno($socks[$_]), 1) = 1 for keys %open;
        my $n = select(my $rout = $rin, undef, undef, 0.1);
        next unless $n && $n > 0;
        for my $i (keys %open) {
            next unless vec($rout, fileno($socks[$i]), 1);
            my $k = sysread($socks[$i], my $buf, 65536);
            next if !defined $k;    # EAGAIN
            if ($k == 0) { $tend[$i] = time - $t0; delete $open{$i}; next }
            push @{ $reads[$i] }, [time - $t0, $buf];
        }
    }
    close $_ for @socks;
    return [map { my $r = parse_response($reads[$_]); $r->{t_end} = $tend[$_]; $r } 0 .. $#socks];
}

# Sends $n requests (raw bytes from $make->($i)) with at most $conc connections open at once,
# starting them over about $secs seconds; reads each to EOF (at most $timeout s in all).
# Returns [{status, retry_after, t_end (from its start), json}] in order, undef t_end when it
# never closed.
sub burst {
    my ($self, $n, $make, %o) = @_;
    my ($conc, $secs, $timeout) = ($o{concurrency} // 100, $o{secs} // 1, $o{timeout} // 20);
    my $t0 = time;
    my (@res, %open);
    my $next = 0;
    while (($next < $n || %open) && time - $t0 < $timeout) {
        while ($next < $n && keys(%open) < $conc && time - $t0 >= $next * $secs / $n) {
            my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$self->{port}", Timeout => 5);
            if (!$s) { $res[$next++] = { status => -1, error => "$!" }; next }
            $s->blocking(0);
            my $bytes = $make->($next);
            my $w = syswrite($s, $bytes);
            die "burst: short write" unless defined $w && $w == length $bytes;
            $open{$next} = { s => $s, buf => '', t => time };
            $next++;
        }
        my $rin = '';
        vec($rin, fileno($open{$_}{s}), 1) = 1 for keys %open;
        my $k = %open ? select(my $rout = $rin, undef, undef, 0.01) : 0;
        sleep 0.001 unless %open;
        next unless $k && $k > 0;
        for my $i (keys %open) {
            my $c = $open{$i};
            next unless vec($rout, fileno($c->{s}), 1);
            my $got = sysread($c->{s}, my $buf, 65536);
            next if !defined $got;
            if ($got) { $c->{buf} .= $buf; next }
            close $c->{s};
            my $r = parse_response([[0, $c->{buf}]]);
            $res[$i] = { status => $r->{status}, retry_after => $r->{headers}{'retry-after'},
                         json => $r->{json}, t_end => time - $c->{t} };
            delete $open{$i};
        }
    }
    for my $i (keys %open) { close $open{$i}{s}; $res[$i] = { status => 0 } }
    $res[$_] //= { status => 0 } for 0 .. $n - 1;
    return \@res;
}

# The data: JSON objects of an SSE body, in order ([DONE] left out).
sub sse_chunks {
    my ($res) = @_;
    my @out;
    for (@{ $res->{events} }) {
        next unless $_->{text} =~ /^data: (\{.*\})$/s;
        my $json = $1;    # a copy: decode's own regexes would clobber $1
        push @out, JSON::PP->new->utf8->decode($json);
    }
    return \@out;
}

# Polls until cond->() or timeout seconds; returns the last value.
sub wait_until {
    my ($timeout, $cond) = @_;
    my $t0 = time;
    my $v;
    while (time - $t0 < $timeout) {
        $v = $cond->();
        return $v if $v;
        sleep 0.05;
    }
    return $v;
}

# 1 once every thread of pid is stopped (SIGSTOP taken: state T in /proc), polled up to timeout
# seconds: kill returns before a busy thread has stopped, and one still running can answer
sub wait_stopped {
    my ($pid, $timeout) = @_;
    my $t0 = time;
    while (time - $t0 < $timeout) {
        my @st;
        for my $f (glob("/proc/$pid/task/*/stat")) {
            open(my $fh, '<', $f) or next;
            my $line = <$fh> // '';
            push @st, $line =~ /\)\s+(\S)/ ? $1 : '?';
        }
        return 1 if @st && !grep { $_ ne 'T' && $_ ne 't' } @st;
        sleep 0.005;
    }
    return 0;
}

# ---- helpers the end-to-end tests share ----

# token_sha of token ids: SHA-256 of them as int32 little-endian (API.md's muse block).
sub sha_ids { require Digest::SHA; Digest::SHA::sha256_hex(pack 'l<*', @_) }

# /health as parsed by request().
sub health { $_[0]->request('GET', '/health') }

# Waits until /health shows no running or queued stream; the page, or undef.
# KV the engine can still hand out (rank 0's left_for_streams_bytes), or undef.
sub kv_left {
    my ($self) = @_;
    my $h = $self->health->{json} or return undef;
    return $h->{ranks} && $h->{ranks}[0] ? $h->{ranks}[0]{memory}{left_for_streams_bytes} : undef;
}

# Waits until kv_left is back to $base; returns the last value seen.
sub kv_back_to {
    my ($self, $base, $secs) = @_;
    my $last;
    wait_until($secs // 3, sub { $last = $self->kv_left; defined $last && $last == $base });
    return $last;
}

sub drained {
    my ($self, $secs) = @_;
    return wait_until($secs // 3, sub {
        my $h = $self->health->{json};
        $h && $h->{streams}{running} == 0 && $h->{streams}{queued} == 0 ? $h : undef;
    });
}

# POSTs every body to path at once (parallel); each reply's JSON where the status is 200, else
# {status, body}.
sub together {
    my ($self, $path, $bodies, %h) = @_;
    my $res = $self->parallel([map { post_bytes($path, $_, %h) } @$bodies], 60);
    return [map { $_->{status} == 200 ? $_->{json} : { status => $_->{status}, body => $_->{body} } } @$res];
}

# The token_sha of a non-streamed reply (together's), or 'none' where it has none.
sub token_sha { $_[0] && $_[0]{muse} ? $_[0]{muse}{token_sha} : 'none' }

# The concatenated content deltas of an SSE chat response.
sub content_of {
    my ($res) = @_;
    return join '', map { (($_->{choices}[0] // {})->{delta} // {})->{content} // '' } @{ sse_chunks($res) };
}

# The token_sha of an SSE response's finish chunk, or ''.
sub finish_sha {
    my ($res) = @_;
    my ($f) = grep { ($_->{choices}[0] // {})->{finish_reason} } @{ sse_chunks($res) };
    return $f ? $f->{muse}{token_sha} : '';
}

sub last_event { my ($res) = @_; my $e = $res->{events}; @$e ? $e->[-1]{text} : '' }

# Reads an open_post socket to EOF (at most $secs) and parses the response.
sub read_all {
    my ($s, $secs) = @_;
    my $x = read_some($s, $secs // 10);
    close $s;
    return parse_response([[0, $x->[0]]]);
}

1;
