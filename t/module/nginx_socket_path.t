#!/usr/bin/perl
# Issue 23, item 3: a socket path is checked without following links, in nginx -t and in the
# engine. A directory on the path reached through a symbolic link another local user owns (who
# could repoint it) is refused by both, naming the link; a directory above the socket's that
# others can write is refused too; the real directory is accepted.
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
my $real = "$dir/run";
mkdir $real, 0750 or die "mkdir: $!";
my $link = "$dir/via";
symlink($real, $link) or die "symlink: $!";
# owned by another user, as in the issue (nobody: lchown needs root; the check refuses any link)
my $nobody = getpwnam('nobody');
if ($> == 0 && defined $nobody) { system('chown', '-h', 'nobody', $link) == 0 or die "chown -h" }

sub nginx_t {
    my ($socket) = @_;
    open my $fh, '>', "$dir/conf/t.conf" or die $!;
    print $fh "load_module @{[MuseNginx::module_path()]};\nerror_log $dir/logs/t.log;\npid $dir/logs/t.pid;\n"
        . "events {}\nhttp { muse_engine $socket @{[MuseNginx::engine_user()]}; }\n";
    close $fh;
    my $out = `'@{[MuseNginx::nginx_bin()]}' -e stderr -t -p '$dir' -c '$dir/conf/t.conf' 2>&1`;
    return ($? >> 8, $out);
}
sub engine_start {
    my ($socket) = @_;
    my $out = `timeout 5 '@{[MuseNginx::engine_path()]}' --shm /muse-t-path-$$ --socket '$socket' 2>&1 </dev/null & sleep 0.3; kill %1 2>/dev/null; wait`;
    return $out;
}

my ($rc, $out) = nginx_t("$link/engine.sock");
ok($rc != 0, 'nginx -t refuses a socket reached through a symbolic link');
like($out, qr/"\Q$link\E" on the socket's path is a symbolic link/, 'naming the link') or diag($out);

$out = engine_start("$link/engine.sock");
like($out, qr/\Q$link\E on the socket's path is a symbolic link/, 'the engine refuses it too, naming the link') or diag($out);
ok(!-e "$real/engine.sock", 'the engine bound nothing through the link');

# a link higher up the path: every component is checked from / down
symlink($dir, "$dir.up") or die "symlink: $!";
($rc, $out) = nginx_t("$dir.up/run/engine.sock");
ok($rc != 0 && $out =~ /"\Q$dir.up\E" on the socket's path is a symbolic link/, 'a link above the socket\'s directory: refused by name') or diag($out);
unlink "$dir.up";

# a directory above the socket's that others can write (not sticky) is refused
chmod 0777, $dir;
($rc, $out) = nginx_t("$real/engine.sock");
ok($rc != 0 && $out =~ /socket directory "\Q$dir\E" \(mode 0777/, 'nginx -t: a world-writable parent refused, by name') or diag($out);
$out = engine_start("$real/engine.sock");
like($out, qr/socket directory \Q$dir\E can be written by others/, 'the engine: the same, by name') or diag($out);
chmod 0755, $dir;

# the real path: accepted by both
($rc, $out) = nginx_t("$real/engine.sock");
is($rc, 0, 'nginx -t accepts the real directory') or diag($out);
$out = engine_start("$real/engine.sock");
like($out, qr/ready/, 'the engine serves on the real directory') or diag($out);
unlink "$real/engine.sock";
done_testing();
