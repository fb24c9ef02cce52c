#!/usr/bin/perl
# The README's quick start: `make run` builds what is missing, starts the engine and nginx on
# 127.0.0.1:PORT, streams one chat reply and says how to call the API; `make stop` stops both.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;
use File::Temp qw(tempdir);

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;

# a make of its own, not a sub-make of `make test` (no inherited jobserver or flags)
delete @ENV{qw(MAKEFLAGS MAKELEVEL MFLAGS)};
my $root = MuseNginx::root();
my $run = tempdir(CLEANUP => 1);
chmod 0755, $run;
my $port = MuseNginx::free_port();
my $out = `make -s -C '$root' run PORT=$port RUN_DIR='$run' 2>&1`;
is($? >> 8, 0, 'make run exits 0') or diag($out);
like($out, qr/muse is up on http:\/\/127\.0\.0\.1:$port/, 'it says where muse is up');
my @events = $out =~ /^data: (\{.*\})$/mg;
ok(@events >= 2, sprintf('it streams a chat reply as SSE events (%d)', scalar @events));
like($events[0] // '', qr/"object":"chat\.completion\.chunk"/, 'the events are chat completion chunks');
like($out, qr/^data: \[DONE\]$/m, 'the stream ends with [DONE]');
like($out, qr/make stop/, 'it says how to stop');
my $engine_pid = -s "$run/engine.pid" ? do { open my $f, '<', "$run/engine.pid"; <$f> + 0 } : 0;
my $nginx_pid = -s "$run/nginx.pid" ? do { open my $f, '<', "$run/nginx.pid"; <$f> + 0 } : 0;
ok($engine_pid && kill(0, $engine_pid), 'the engine runs in the background');
ok($nginx_pid && kill(0, $nginx_pid), 'nginx runs in the background');
my $again = `make -s -C '$root' run PORT=$port RUN_DIR='$run' 2>&1`;
isnt($? >> 8, 0, 'a second make run refuses');
like($again, qr/already running/, '... saying muse is already running');
my $stop = `make -s -C '$root' stop RUN_DIR='$run' 2>&1`;
like($stop, qr/muse stopped/, 'make stop stops it');
ok(MuseNginx::wait_until(5, sub { !kill(0, $engine_pid) && !kill(0, $nginx_pid) }), 'both processes are gone');
like(`make -s -C '$root' stop RUN_DIR='$run' 2>&1`, qr/was not running/, 'a second make stop says so');
done_testing();
