#!/usr/bin/perl
# t/serve_faults2.t (TESTPLAN 21-32) again against the test engine built with ASan and UBSan:
# a corrupt ring or a fault path that touched memory it should not shows up as a report in the
# engine's log, checked after every case; a deliberate overflow first proves the build reports.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;

MuseNginx::exec_with_asan_engine("$FindBin::Bin/serve_faults2.t");
