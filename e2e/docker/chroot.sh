# Sourced by the image scripts: run commands inside a root filesystem being built.
#
# A command run in a chroot sees only the rootfs's files, but inherits this shell's environment.
# A TMPDIR of this host (`make demo` may run with one, so may a user) names no directory there,
# and every mktemp inside fails ("mktemp: failed to create file via template"): update-ca-
# certificates, and the packages' maintainer scripts debootstrap runs in the target. /tmp exists
# on the host and in every Debian rootfs, so commands that enter the rootfs get TMPDIR=/tmp.

# in_rootfs ROOTFS COMMAND [ARG...]: COMMAND chrooted into ROOTFS, with a TMPDIR that exists there.
in_rootfs() {
  local rootfs="$1"
  shift
  TMPDIR=/tmp chroot "$rootfs" "$@"
}

# with_rootfs_tmpdir COMMAND [ARG...]: a host command that chroots on its own (debootstrap).
with_rootfs_tmpdir() {
  TMPDIR=/tmp "$@"
}
