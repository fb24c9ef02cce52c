#!/usr/bin/perl
# t/exl3_pack.t again against muse-engine built with ASan and UBSan: a bad access, undefined
# behaviour or a leak while reading EXL3 packs, corrupt ones included, makes a command exit
# non-zero, so the test's own checks fail.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;

MuseNginx::exec_with_asan_engine("$FindBin::Bin/exl3_pack.t");
