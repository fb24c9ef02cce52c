#!/usr/bin/perl
# The shipped configs (conf/*.conf) pass `nginx -t` with the module this tree builds: only the
# module path, the listen address, the user, the engine's user, the worker key and the API key
# file are swapped for local ones.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../lib";
use MuseNginx;
use Test::More;

my $why = MuseNginx::missing();
plan skip_all => $why if $why;

my $n = MuseNginx->new;
my $dir = $n->dir;
my $port = MuseNginx::free_port();
open my $kf, '>', "$dir/keys" or die $!;
print $kf "sk-conf-test\n";
close $kf;
open my $wk, '>', "$dir/worker.key" or die $!; # 0600, 32 bytes or more: the module's key rules
print $wk 'k' x 48, "\n";
close $wk;
chmod 0600, "$dir/worker.key" or die $!;
my @confs = glob MuseNginx::root() . '/conf/*.conf';
ok(@confs >= 2, 'conf/ has the minimal and the hardened config');
for my $conf (@confs) {
    my $name = (split m{/}, $conf)[-1];
    open my $in, '<', $conf or die $!;
    my $text = do { local $/; <$in> };
    close $in;
    my $mod = MuseNginx::module_path();
    ok($text =~ s/^([ \t]*load_module[ \t]+)[^;\n]+;/$1$mod;/m, "$name: loads the module");
    # directives only, never text in comments ([^;\n]: one line)
    $text =~ s/^([ \t]*)user[ \t]+[^;\n]+;/$1/mg;
    $text =~ s/^([ \t]*)listen[ \t]+[^;\n]+;/${1}listen 127.0.0.1:$port;/mg;
    # the engine's user, and the worker key (a third argument) for a local one of the same rules
    ok($text =~ s/^([ \t]*muse_engine[ \t]+\S+[ \t]+)[^;\s]+([ \t]+[^;\s]+)?;/
                  $1 . MuseNginx::engine_user() . (defined $2 ? " $dir\/worker.key" : '') . ';'/mex,
       "$name: names the engine's user");
    $text =~ s/^([ \t]*)muse_api_key_file[ \t]+[^;\n]+;/${1}muse_api_key_file $dir\/keys;/mg;
    open my $out, '>', "$dir/$name" or die $!;
    print $out $text;
    close $out;
    my $got = `'@{[MuseNginx::nginx_bin()]}' -t -p '$dir' -c '$dir/$name' -g 'error_log $dir/logs/test.log; pid $dir/logs/test.pid;' 2>&1`;
    is($?, 0, "$name: nginx -t accepts it") or diag($got);
    like($got, qr/test is successful/, "$name: nginx says so");
}

done_testing();
