#!/usr/bin/perl
# The same requests give the same tokens as the engine before the backend seam changed: a few
# requests' token_sha (greedy and seeded, completions and chat, one and several streams a
# round) pinned to values taken from the engine of commit af108dd (the last before the seam).
# MUSE_PIN_PRINT=1 prints the values this engine gives instead of checking them.
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
$n->start_real_engine(args => ['--streams', '4', '--context', '256', '--max-rows', '32']);
$n->start_nginx;

my @prompt_a = map { ($_ * 37 + 11) % 990 } 0 .. 40;
my @prompt_b = map { ($_ * 53 + 7) % 990 } 0 .. 9;
my %bodies = (
    'completion greedy' => { prompt => \@prompt_a, max_tokens => 12, temperature => 0 },
    'completion seeded 0.7' =>
      { prompt => \@prompt_b, max_tokens => 12, temperature => 0.7, seed => 4242 },
    'completion seeded top_k 5' =>
      { prompt => \@prompt_a, max_tokens => 8, temperature => 1.1, seed => 7, top_k => 5 },
    'chat greedy' => { messages => [{ role => 'user', content => 'hello there' }],
                       max_tokens => 10, temperature => 0 },
    'chat seeded 0.9' => { messages => [{ role => 'user', content => 'tell me more' }],
                           max_tokens => 10, temperature => 0.9, seed => 99 },
);
my %pins = (
    'completion greedy'         => 'e0fbedf3b150630eba65746ba60a780bc3c66b25653e01ecf11d0e22e195c844',
    'completion seeded 0.7'     => 'a304fad173c75410cdbfa4538d8ec0c6033215d43d5989cbd8b535cf2a8e7790',
    'completion seeded top_k 5' => '492931dc8326fed9362d43859dd988410310de713082f5c75ccea952b0682e82',
    'chat greedy'               => 'c238a62115e099032be2a49c734c00b9e7c206ab7fb0707c54dfe2f6e02145e1',
    'chat seeded 0.9'           => 'af3ce8e7c0fef5c388b164500da478d534225c8fbdceaed735b3e7c7b4f9e477',
);

sub path_of { exists $_[0]{messages} ? '/v1/chat/completions' : '/v1/completions' }

# alone, then all five in one round (concurrent == solo keeps the same pins)
my %alone;
for my $name (sort keys %bodies) {
    my $r = $n->parallel([MuseNginx::post_bytes(path_of($bodies{$name}), $JSON->encode($bodies{$name}))], 60)->[0];
    $alone{$name} = $r->{status} == 200 && $r->{json}{muse} ? $r->{json}{muse}{token_sha} : "status $r->{status}";
}
my @names = sort keys %bodies;
my $together = $n->parallel([map { MuseNginx::post_bytes(path_of($bodies{$_}), $JSON->encode($bodies{$_})) } @names], 60);
if ($ENV{MUSE_PIN_PRINT}) {
    diag("    '$_' => '$alone{$_}'," ) for @names;
}
for my $i (0 .. $#names) {
    my $name = $names[$i];
    is($alone{$name}, $pins{$name}, "$name: token_sha equals the engine before the seam")
      unless $ENV{MUSE_PIN_PRINT};
    my $r = $together->[$i];
    is($r->{status} == 200 ? $r->{json}{muse}{token_sha} : "status $r->{status}", $alone{$name},
       "$name: the same among five streams");
}
done_testing();
