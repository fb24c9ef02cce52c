#!/usr/bin/perl
# t/exl3_pack.t again with muse-engine built with AddressSanitizer and UBSan
# (build/t/muse-engine-asan): a bad access, undefined behaviour or a leak on any path it runs,
# bad input included, makes the engine exit non-zero, so the test's own checks fail.
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
exec "$FindBin::Bin/exl3_pack.t" or die "exec: $!";
