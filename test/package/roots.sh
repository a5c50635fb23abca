# Debian roots for the package suite, made with debootstrap and cached outside the checkout.
# shellcheck shell=bash
#   package_root NAME BASE PKGS...  a cached Debian 12 root NAME with PKGS installed (made once):
#                                   debootstrap's minbase when BASE is -, else a copy of root BASE
#   scratch_root NAME DEST          a throwaway copy of it at DEST, with /proc and /dev/shm mounted
#   drop_root DEST                  unmounts and removes such a copy
#   in_root DEST CMD...             runs CMD inside it (chroot, a clean environment)

ROOTS=${JOBCAP_ROOTS:-/var/cache/jobcap/roots}
SUITE=bookworm

# The host's Debian mirror, from its apt sources (deb822 or one-line format).
debian_mirror() {
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v '^\s*#' | grep -v -- '-security' \
        | sed -nE 's/^\s*URIs:\s*(\S+).*/\1/p; s/^\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s.*/\2/p' | head -1)
    echo "${m:-http://deb.debian.org/debian}"
}

# The root's apt sources: the host's mirror, for the suite, its updates and its security updates.
root_sources() {
    local mirror security
    mirror=$(debian_mirror)
    security=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -v '^\s*#' \
        | sed -nE 's/^\s*URIs:\s*(\S+-security\S*).*/\1/p; s/^\s*deb\s+(\[[^]]*\]\s+)?(\S+-security\S*)\s.*/\2/p' | head -1)
    printf 'deb %s %s main\n' "$mirror" "$SUITE" "$mirror" "$SUITE-updates" \
        "${security:-http://security.debian.org/debian-security}" "$SUITE-security"
}

# The packages the host's apt has downloaded, linked into DIR (an apt or debootstrap cache), so
# that a root reuses them instead of downloading them again: the same versions from the same
# mirror, checked against the same signed indexes. The root's apt-get clean removes its links.
host_debs() {
    local dir=$1
    mkdir -p "$dir"
    find /var/cache/apt/archives -maxdepth 1 -name '*.deb' -exec cp -l -n -t "$dir" {} + 2>/dev/null || true
}

in_root() {
    local root=$1; shift
    chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

# /proc, and a tmpfs for POSIX shared memory. /dev stays the root's own (debootstrap made its
# device nodes): nothing of the host's is bound inside, so removing a root cannot reach it.
mount_root() {
    local root=$1
    mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
    mkdir -p "$root/dev/shm"
    mountpoint -q "$root/dev/shm" || mount -t tmpfs -o mode=1777,size=256m shm "$root/dev/shm"
}

umount_root() {
    local root=$1 m
    # Deepest first.
    for m in $(findmnt -rn -o TARGET | grep -F "$root/" | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}

# A cached root $ROOTS/NAME: debootstrap's minbase (or a copy of root BASE), then PKGS from the
# host's mirror. Made in NAME.tmp and renamed when complete, under a lock, so a half-made root
# is never used.
package_root() {
    local name=$1 base=$2; shift 2
    local root=$ROOTS/$name mirror
    mkdir -p "$ROOTS"
    exec {lock}>"$ROOTS/.$name.lock"
    flock "$lock"
    # What the root is made of; a root made by another recipe is made again.
    local recipe="suite=$SUITE base=$base$( [ "$base" = - ] || md5sum < "$ROOTS/$base/.complete" | cut -c1-8) sources=$(root_sources | md5sum | cut -c1-8) packages=$*"
    if [ "$(cat "$root/.complete" 2>/dev/null)" != "$recipe" ]; then
        mirror=$(debian_mirror)
        umount_root "$root.tmp"
        rm -rf "$root.tmp" "$root"
        if [ "$base" = - ]; then
            say "making the $SUITE root $root (debootstrap from $mirror, once; later runs reuse it)"
            mkdir -p "$ROOTS/.debs"
            host_debs "$ROOTS/.debs"
            debootstrap --variant=minbase --cache-dir="$ROOTS/.debs" "$SUITE" "$root.tmp" "$mirror" \
                >"$ROOTS/$name.log" 2>&1 \
                || { tail -20 "$ROOTS/$name.log"; flock -u "$lock"; return 1; }
            # No service starts inside the root while packages are installed.
            printf '#!/bin/sh\nexit 101\n' > "$root.tmp/usr/sbin/policy-rc.d"
            chmod +x "$root.tmp/usr/sbin/policy-rc.d"
            # Debian 12 as installed: with its point-release updates and security updates.
            root_sources > "$root.tmp/etc/apt/sources.list"
        else
            say "making the root $root from $ROOTS/$base (once; later runs reuse it)"
            cp -a --reflink=auto "$ROOTS/$base" "$root.tmp"
            rm -f "$root.tmp/.complete"
        fi
        mount_root "$root.tmp"
        host_debs "$root.tmp/var/cache/apt/archives"
        if ! { in_root "$root.tmp" apt-get update -q \
               && in_root "$root.tmp" apt-get dist-upgrade -y -q \
               && in_root "$root.tmp" apt-get install -y -q --no-install-recommends "$@"; } \
               >>"$ROOTS/$name.log" 2>&1; then
            tail -20 "$ROOTS/$name.log"
            umount_root "$root.tmp"
            flock -u "$lock"
            return 1
        fi
        in_root "$root.tmp" apt-get clean
        umount_root "$root.tmp"
        echo "$recipe" > "$root.tmp/.complete"
        mv "$root.tmp" "$root"
    fi
    flock -u "$lock"
    exec {lock}>&-
}

# The copy is an overlay on the cached root (its changes go to DEST.changes), or, where overlays
# cannot be mounted, a full copy.
scratch_root() {
    local name=$1 dest=$2
    drop_root "$dest"
    mkdir -p "$dest" "$dest.changes/upper" "$dest.changes/work"
    mount -t overlay overlay -o "lowerdir=$ROOTS/$name,upperdir=$dest.changes/upper,workdir=$dest.changes/work" \
        "$dest" 2>/dev/null \
        || { rm -rf "$dest"; cp -a --reflink=auto "$ROOTS/$name" "$dest"; }
    mount_root "$dest"
}

drop_root() {
    local dest=$1
    [ -e "$dest" ] || [ -e "$dest.changes" ] || return 0
    umount_root "$dest"
    mountpoint -q "$dest" && umount "$dest"
    if findmnt -rn -o TARGET | grep -qE "^$dest(/|$)"; then
        echo "still mounted under $dest; not removing it" >&2
        return 1
    fi
    rm -rf --one-file-system "$dest" "$dest.changes"
}
