#!/usr/bin/perl
# t/serve_exactness.t again against muse-engine built with ASan and UBSan: lanes, paged KV and
# the prompt cache under the sanitizers; a report stops the engine (requests fail) and lands in
# its log, which the test checks at the end.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;

MuseNginx::exec_with_asan_engine("$FindBin::Bin/serve_exactness.t");
