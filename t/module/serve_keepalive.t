#!/usr/bin/perl
# Keepalives (API.md): while a long prompt is read, a stream gets ": keepalive" comments, and a
# non-streaming request that takes longer than muse_queue_timeout and muse_idle_timeout is still
# answered, because the engine's first record marks it admitted and its keepalives show it works.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use JSON::PP;
use MuseNginx;
use Test::More;
use Time::HiRes qw(time);

my $why = MuseNginx::missing_real();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
# a slow prompt: 1500 tokens read 8 rows a round; keepalives every 100 ms
$n->start_real_engine(args => ['--streams', '2', '--context', '2048', '--max-rows', '8', '--keepalive-ms', '100']);
my $loc = $n->default_locations;
$loc =~ s/muse_queue_timeout 3s;/muse_queue_timeout 700ms;/;
$loc =~ s/muse_idle_timeout 3s;/muse_idle_timeout 700ms;/;
$n->start_nginx(locations => $loc);
my @prompt = map { ($_ * 37 + 11) % 990 } 1 .. 1500;
my $JSON = JSON::PP->new;

my $t0 = time;
my $r = $n->request('POST', '/v1/completions', $JSON->encode({prompt => \@prompt, max_tokens => 2, temperature => 0}), timeout => 60);
my $took = time - $t0;
is($r->{status}, 200, sprintf('non-streaming: answered after %.1f s, past the 0.7 s queue and idle timeouts', $took));
ok($took > 0.7, 'the prompt really took longer than the timeouts (the check can fail)');
ok($r->{json} && $r->{json}{usage}{prompt_tokens} == 1500, 'the whole prompt was read');

$r = $n->request('POST', '/v1/completions', $JSON->encode({prompt => [@prompt[0 .. 1200], 5], max_tokens => 2, temperature => 0, stream => JSON::PP::true}), timeout => 60);
is($r->{status}, 200, 'streaming: answered');
my @keep = grep { $_->{text} eq ': keepalive' } @{ $r->{events} };
ok(@keep >= 2, scalar(@keep) . ' keepalive comments while the prompt was read');
like($r->{body}, qr/data: \[DONE\]\n\n\z/, 'the stream ends normally');
is(join("\n", $n->bad_log_lines), '', 'no [alert]/[crit] in error.log');
done_testing();
