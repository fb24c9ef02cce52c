#!/usr/bin/perl
# The rows of a round (engine/serve/scheduler.h), read from /health's round_rows histogram: a
# lone prompt is read in rounds of up to --max-rows rows; while another stream decodes, a round
# holds at most --busy-rows rows, that stream's token among them, so its gap between tokens stays
# one short round; and the tokens are the same either way (a row's bits never depend on its round).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use JSON::PP;
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
my $JSON = JSON::PP->new->canonical;
$n->start_real_engine(args => ['--streams', '4', '--queue', '8', '--context', '1024',
    '--max-rows', '64', '--busy-rows', '8', '--prompt-cache-gib', '0']);
$n->start_nginx;

# Rounds of more than $rows rows so far (the histogram's count past its bucket le = $rows).
sub rounds_over {
    my ($rows) = @_;
    my $h = $n->health->{json} or return undef;
    my $r = $h->{histograms}{round_rows} or return undef;
    for my $i (0 .. $#{ $r->{le} }) {
        return $r->{count} - $r->{counts}[$i] if $r->{le}[$i] == $rows;
    }
    return undef;
}

# The histogram once the engine has published every round so far (it publishes every 250 ms).
sub settled {
    my ($rows) = @_;
    my $last = rounds_over($rows);
    MuseNginx::wait_until(3, sub {
        select(undef, undef, undef, 0.3);
        my $v = rounds_over($rows);
        my $same = defined $v && defined $last && $v == $last;
        $last = $v;
        $same;
    });
    return $last;
}

my $prompt = [map { ($_ * 37 + 11) % 990 } 0 .. 199];
my $body = $JSON->encode({prompt => $prompt, max_tokens => 4, temperature => 0});

# alone: 200 prompt rows in rounds of 64, 64, 64 and 8
is(settled(32), 0, 'no round of more than 32 rows before any request');
my $alone = $n->together('/v1/completions', [$body])->[0];
ok($alone->{muse}, 'a lone 200-token prompt is answered');
is(settled(32), 3, 'a lone prompt is read in rounds of --max-rows (64) rows: three rounds past 32');

# beside a decoding stream (a prompt whose greedy tokens run to max_tokens): rounds of at most 8
# rows, its one decode row among them (7 prompt rows: the round stays in the 8-row bucket)
my $long = $n->open_post('/v1/completions', $JSON->encode(
    {prompt => [851, 880, 909, 938], max_tokens => 600, temperature => 0, stream => JSON::PP::true}));
my $first = MuseNginx::read_some($long, 20, qr/data: \{/);
like($first->[0], qr/data: \{/, 'the long stream decodes');
my $over8 = settled(8);
my $beside = $n->together('/v1/completions', [$body])->[0];
my $mid = MuseNginx::read_some($long, 0.05);
unlike($first->[0] . $mid->[0], qr/\[DONE\]/, 'it still decodes when the other prompt is answered');
my $rest = MuseNginx::read_some($long, 60, qr/data: \[DONE\]/);
like($rest->[0], qr/"finish_reason":"length"/, 'it ran to max_tokens');
is(settled(8) - $over8, 0, 'beside a decoding stream no round held more than 8 rows (--busy-rows 8, its token among them)');
is(MuseNginx::token_sha($beside), MuseNginx::token_sha($alone),
    'the prompt read 7 rows a round gives the tokens it gave read 64 a round');
close $long;

# a budget past the round's rows is refused at start, naming both flags and the fix
my $engine = MuseNginx::real_engine_path();
my $out = `'$engine' serve --listen /tmp/muse-rounds-none.sock --model '@{[MuseNginx::tiny_pack()]}' --max-rows 256 --busy-rows 300 2>&1`;
is($? >> 8, 2, '--busy-rows past --max-rows: exit 2 before anything starts');
like($out, qr/--busy-rows 300 is more than --max-rows 256.*lower --busy-rows or raise --max-rows/,
    'the refusal names both flags and the fix');

done_testing;
