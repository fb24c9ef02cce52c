#!/usr/bin/perl
# TESTPLAN 21-32 (t/serve_faults2.t) again, against build/t/muse-engine-asan: the test engine
# built with AddressSanitizer and UBSan, so a corrupt ring or a fault path that touched memory
# it should not shows up as a sanitizer report in the engine's log (checked after every case).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use MuseNginx;
use Test::More;

$ENV{MUSE_ENGINE_ASAN} = 1;
# a report stops the engine; leaks are reported when it exits on SIGTERM
$ENV{ASAN_OPTIONS} = 'halt_on_error=1:detect_leaks=1';
$ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
plan skip_all => MuseNginx::_in_ci('build/t/muse-engine-asan (mk/testengine.mk) not built')
    unless -x MuseNginx::hooks_engine_path();
exec $^X, "$FindBin::Bin/serve_faults2.t" or die "exec: $!";
