#!/usr/bin/env bash
# Sets up the rdma_rxe interop lab: Debian packages, two stock Debian
# kernels (6.1 and 6.12) extracted into a cache directory, and one small
# initramfs per kernel. Idempotent: a second run only checks and prints.
#
#   conformance/setup.sh         (in a root shell)
#   sudo conformance/setup.sh    (as a user allowed to use sudo)
#
# Env:
#   RXEGO_LAB_DIR   cache directory (default: conformance/.lab next to this file)
#   RXEGO_KERNEL_6_1, RXEGO_KERNEL_6_12
#                   exact Debian kernel image package to use instead of the
#                   newest one apt knows (e.g. linux-image-6.1.0-56-amd64-unsigned)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lab=${RXEGO_LAB_DIR:-$here/.lab}
initsrc=$here/initramfs/init

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root: $0 in a root shell, or sudo $0"

# --- packages ---------------------------------------------------------------
# chromium: the headless-browser test of rxego trace's HTML page
# (internal/app/ladder); fonts-liberation gives its text metrics. gcc,
# libc6-dev and libibverbs-dev build mwpeer, mcpeer and rspoll (mwpeer/mwpeer.c, mcpeer/mcpeer.c, rspoll/rspoll.c), the
# memory-window and multicast peers the tests compile into the lab's share directory
# (guests run the host's root, so its libibverbs too).
pkgs=(qemu-system-x86 busybox-static rdma-core ibverbs-utils perftest
	rdmacm-utils tshark nftables tcpdump iproute2 xz-utils cpio kmod
	ethtool util-linux chromium fonts-liberation gcc libc6-dev libibverbs-dev curl git)
missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing: ${missing[*]}"
	# tshark asks whether non-root users may capture; answer no, quietly.
	echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
	log "packages: all present"
fi

# Every program a test, the lab or a command runs (guests run the host's
# programs through a 9p root), checked after installing: a test finding
# one missing fails late and far from here. internal/testenv/setupcheck fails when
# the Go code runs a program this list lacks. The Go toolchain is a
# prerequisite, not installed here.
programs=(
	ip tc rdma nft tcpdump tshark mergecap ethtool setpriv dmesg   # iproute2 nftables tcpdump tshark ethtool util-linux; dmesg also busybox's, in the guests
	qemu-system-x86_64 busybox xz cpio depmod modprobe       # qemu-system-x86 busybox-static xz-utils cpio kmod
	ibv_devinfo ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong   # ibverbs-utils
	ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat   # perftest
	rping ucmatose udaddy mckey rstream rcopy riostream      # rdmacm-utils
	chromium                                                 # chromium
	gcc                                                      # gcc: builds conformance/mwpeer, mcpeer, rspoll
	sh bash dd cat echo true sleep rm sha256sum stdbuf             # base system, stdbuf from coreutils
	awk                                                      # base system, mawk: scripts/failed-output.sh
	git                                                      # git: the conformance report names the commit it tested
	curl                                                     # curl: under librspreload (librdmacm1) against rxego's HTTP over rsocket
)
for p in "${programs[@]}"; do
	command -v "$p" >/dev/null || die "$p not found after installing the packages above"
done
log "programs: all ${#programs[@]} found"

# --- kernels ----------------------------------------------------------------
# newest_pkg PATTERN prints the newest package name apt knows matching the
# extended regex PATTERN (version-sorted), or nothing.
newest_pkg() {
	{ apt-cache search --names-only "$1" 2>/dev/null || true; } | awk '{print $1}' |
		{ grep -E "$1" || true; } | sort -V | tail -n 1
}

# pick_kernel SERIES prints the image package to use for SERIES.
pick_kernel() {
	local series=$1 override pat p
	case $series in
	6.1)
		override=${RXEGO_KERNEL_6_1:-}
		pat='^linux-image-6\.1\.0-[0-9]+-amd64'
		;;
	6.12)
		override=${RXEGO_KERNEL_6_12:-}
		pat='^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64'
		;;
	esac
	if [ -n "$override" ]; then
		echo "$override"
		return
	fi
	# Unsigned and signed images carry the same kernel and modules; prefer
	# the unsigned one when both exist since it has no shim packaging.
	p=$(newest_pkg "$pat-unsigned\$")
	[ -n "$p" ] || p=$(newest_pkg "$pat\$")
	if [ -z "$p" ]; then
		apt-get update -qq
		p=$(newest_pkg "$pat-unsigned\$")
		[ -n "$p" ] || p=$(newest_pkg "$pat\$")
	fi
	[ -n "$p" ] || die "no kernel package for $series found by apt-cache search"
	echo "$p"
}

# Modules the guest loads, in dependency order (modprobe --show-depends).
# crc32_generic: rxe allocates the "crc32" crypto hash for the ICRC and the
# initramfs has no modprobe to load it on demand.
guest_modules=(virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe rdma_ucm)

build_kernel() {
	local series=$1 pkg ver dir tmp stamp want kver m path seen
	pkg=$(pick_kernel "$series")
	ver=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
	dir=$lab/kernels/$series
	stamp=$dir/stamp
	# The stamp pins package, version and the init script so that a change
	# to any of them rebuilds the initramfs.
	want="$pkg $ver $(sha256sum "$initsrc" "$0" | sha256sum | cut -c1-16)"
	if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
		[ -f "$dir/vmlinuz" ] && [ -f "$dir/initramfs.cpio" ]; then
		log "kernel $series: $pkg $ver (cached in $dir)"
		return
	fi
	log "kernel $series: fetching $pkg $ver"
	tmp=$lab/tmp-$series
	rm -rf "$tmp"
	mkdir -p "$tmp/deb" "$tmp/root" "$tmp/initramfs"
	if ! (cd "$tmp/deb" && apt-get download -qq "$pkg" 2>/dev/null); then
		# A stale package index names versions the archive no longer has.
		log "download failed; refreshing the package index"
		apt-get update -qq
		(cd "$tmp/deb" && apt-get download "$pkg") || die "apt-get download $pkg failed"
	fi
	dpkg-deb -x "$tmp"/deb/*.deb "$tmp/root"
	kver=$(ls "$tmp/root/lib/modules")
	[ -n "$kver" ] && [ -f "$tmp/root/boot/vmlinuz-$kver" ] || die "$pkg: no vmlinuz/modules in package"
	depmod -b "$tmp/root" "$kver"

	# initramfs: busybox, the init script, the modules decompressed (busybox
	# insmod takes plain .ko files) and modules.list in load order.
	local ir=$tmp/initramfs
	mkdir -p "$ir"/{bin,dev,proc,sys,newroot,share,lib/modules}
	cp /bin/busybox "$ir/bin/busybox"
	cp "$initsrc" "$ir/init"
	chmod 0755 "$ir/init" "$ir/bin/busybox"
	: >"$ir/lib/modules/modules.list"
	seen=" "
	for m in "${guest_modules[@]}"; do
		while read -r _ path; do
			local base
			base=$(basename "$path")
			base=${base%.xz}
			case $seen in *" $base "*) continue ;; esac
			seen="$seen$base "
			case $path in
			*.xz) xz -dc "$path" >"$ir/lib/modules/$base" ;;
			*) cp "$path" "$ir/lib/modules/$base" ;;
			esac
			echo "$base" >>"$ir/lib/modules/modules.list"
		done < <(modprobe -d "$tmp/root" -S "$kver" --show-depends "$m" | grep '^insmod ')
	done
	# Uncompressed cpio: TCG decompresses slowly and the archive is small.
	(cd "$ir" && find . -print0 | cpio --null -o -H newc --quiet) >"$tmp/initramfs.cpio"

	rm -rf "$dir"
	mkdir -p "$dir"
	mv "$tmp/root/boot/vmlinuz-$kver" "$dir/vmlinuz"
	mv "$tmp/initramfs.cpio" "$dir/initramfs.cpio"
	cp "$tmp/root/boot/config-$kver" "$dir/config"
	echo "$kver" >"$dir/release"
	echo "$pkg $ver" >"$dir/package"
	tr '\n' ' ' <"$ir/lib/modules/modules.list" >"$dir/modules"
	echo "$want" >"$stamp"
	rm -rf "$tmp"
	log "kernel $series: built $dir (release $kver; modules: $(cat "$dir/modules"))"
}

mkdir -p "$lab"
for s in 6.1 6.12; do
	build_kernel "$s"
done
log "lab ready in $lab"
