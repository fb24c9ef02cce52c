#!/usr/bin/perl
# t/serve_exactness.t again with muse-engine built with AddressSanitizer and UBSan
# (build/t/muse-engine-asan): lanes, paged KV and the prompt cache under the sanitizers; a
# report stops the engine (requests fail) and lands in its log, which the test checks at the end.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use MuseNginx;
use Test::More;

my $asan = ($ENV{BUILD} || 'build') . '/t/muse-engine-asan';
plan skip_all => MuseNginx::_in_ci("$asan (mk/testengine.mk) not built") unless -x $asan;
$ENV{MUSE_ENGINE} = $asan;
$ENV{ASAN_OPTIONS} = 'halt_on_error=1:detect_leaks=1';
$ENV{UBSAN_OPTIONS} = 'halt_on_error=1:print_stacktrace=1';
exec $^X, "$FindBin::Bin/serve_exactness.t" or die "exec: $!";
