#!/usr/bin/perl
# t/tools/trace_round.py on a made-up kernel trace (t/tools/kernel_trace.c's CSV): rounds found
# at the embed kernels, a round's span and the time no kernel ran, end increments that add up
# to the span and go to the kernel whose end closed the gap (a kernel launched early by PDL
# gets only its end's share), template names shortened, and a layer listed in start order.
use strict;
use warnings;
use File::Temp qw(tempdir);
use FindBin;
use Test::More;

my $ROOT = "$FindBin::Bin/../..";
my $dir  = tempdir(CLEANUP => 1);
plan skip_all => 'python3 not found' unless grep { -x "$_/python3" } split /:/, $ENV{PATH};

# Three rounds of: embed 0-2 us, idle 2-3, a product launched early at 3 us that ends at 20, a
# finish launched at 4 that ends at 24, a side-stream kernel 21-23 inside the finish, idle
# 24-30, a head 30-40; the next round at 50 us.
my $csv = "$dir/trace.csv";
open my $f, '>', $csv or die;
print $f "start_ns,end_ns,stream,graph,node,grid,block,name\n";
my $prod = '_Z14k_fast_productILi1ELi2ELi1ELi2ELi16ELi0ELi2ELi1EEv9fast_prod';
for my $r (0 .. 2) {
    my $t = 50_000 * $r;
    printf $f "%d,%d,7,1,1,1,128,_Z12k_embed_fastPKf\n", $t, $t + 2000;
    printf $f "%d,%d,7,1,2,1152,128,%s\n", $t + 3000, $t + 20_000, $prod;
    printf $f "%d,%d,7,1,3,96,256,_Z13k_fast_finish10muse_fast_fin\n", $t + 4000, $t + 24_000;
    printf $f "%d,%d,8,1,4,24,128,_Z13k_side_kernelv\n", $t + 21_000, $t + 23_000;
    printf $f "%d,%d,7,1,5,3158,128,_Z6k_headv\n", $t + 30_000, $t + 40_000;
}
close $f;

my $out = `python3 $ROOT/t/tools/trace_round.py $csv --round 1 --rounds 2 --layer 0 --layers 1 2>&1`;
is($? >> 8, 0, 'trace_round.py exits 0') or diag($out);
my @rounds = $out =~ /^round: (\d+) kernels, span ([\d.]+) us, some kernel running ([\d.]+) us, none ([\d.]+) us/mg;
is(scalar @rounds, 8, 'two whole rounds (the last round has no embed after it)') or diag($out);
is_deeply([@rounds[0 .. 3]], [5, '40.0', '33.0', '7.0'],
          'a round: 5 kernels, span 40 us, 33 running, the gaps of 1 and 6 us none');
my %inc;
my $sum = 0;
for my $line (split /\n/, $out) {
    last if $line =~ /^layer/;
    next unless $line =~ /^\| (\S+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)% \|$/;
    $inc{$1} = $4;
    $sum += $4;
}
is(sprintf('%.1f', $sum), '40.0', 'the end increments add up to the span');
is($inc{'k_fast_product<1,2,1,2,16,0,2,1>[1152]'}, '18.0',
   'the product: its end less the embed\'s (the gap after it included), the name shortened');
is($inc{'k_side_kernel[24]'}, '3.0', 'a side kernel ending inside another takes its end\'s share');
is($inc{'k_fast_finish[96]'}, '1.0', 'the finish gets what is left after the side kernel\'s end');
is($inc{'k_head[3158]'}, '16.0', 'the head: its run and the idle gap before it');
like($out, qr/layer 0 .*\n.*\n.*\n\| k_fast_product\S+ \| 7 \| 0\.0 \| 17\.0 \| 17\.0 \| 17\.0 \|/,
     'the layer listing starts after the round\'s embed, in start order');
done_testing();
