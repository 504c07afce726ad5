#!/bin/sh
# The executor image's file system, shared by kind/executor.Dockerfile and the e2e suite's real
# node (tests/e2e/bin/build-node-images.sh), so both build the same image: Debian's static
# busybox as the userland (a POSIX shell, `sleep` and the usual tools, one file, no libc), the
# statically linked `execution-helper` at /mecatl-executor (k8s-executor §4.4), the executor
# user 65532 and /workspace (where the workspace PVC is mounted; fsGroup 65532 keeps it writable).
#
# usage: executor-rootfs.sh ROOTFS BUSYBOX HELPER   (ROOTFS must not exist or be empty)
set -eu
root=$1 busybox=$2 helper=$3
mkdir -p "$root"
[ -z "$(ls -A "$root")" ] || { echo "$root is not empty" >&2; exit 1; }
mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/etc" "$root/tmp" \
  "$root/workspace" "$root/proc" "$root/sys" "$root/dev" "$root/root"
install -m 0755 "$busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list-full); do
  [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nexecutor:x:65532:65532:executor:/workspace:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nexecutor:x:65532:\n' >"$root/etc/group"
install -m 0755 "$helper" "$root/mecatl-executor"
chown 65532:65532 "$root/mecatl-executor" "$root/workspace"
chmod 1777 "$root/tmp"
