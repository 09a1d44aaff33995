#!/usr/bin/env bash
# Run every wire-format fuzz target for a bounded time each.
#
#   scripts/fuzz.sh [DURATION] [PKG...]    e.g. scripts/fuzz.sh 10s
#
# DURATION defaults to 10s; PKG defaults to every package with a Fuzz
# function in its tests (decoders, the ladder, CM MADs, and ./reliability's
# live endpoint fed arbitrary datagrams). The targets are found with
# `go test -list`, so a new Fuzz function is run without editing this
# script. Each runs as
# `go test -run=^$ -fuzz=^Target$ -fuzztime=DURATION PKG`; the script stops
# at the first failure (go test saves the input under PKG/testdata/fuzz/).
# A run that fails only with the fuzzing coordinator's deadline race (no
# failing input) runs once more.
set -euo pipefail
cd "$(dirname "$0")/.."
time="${1:-10s}"
shift || true
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
	mapfile -t pkgs < <(grep -l --include='*_test.go' -r '^func Fuzz' . | xargs -n1 dirname | sort -u)
fi
n=0
for pkg in "${pkgs[@]}"; do
	for name in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "== $pkg $name ($time)"
		for attempt in 1 2; do
			log=$(mktemp)
			if go test -run='^$' -fuzz="^${name}\$" -fuzztime="$time" "$pkg" 2>&1 | tee "$log"; then
				rm -f "$log"
				break
			fi
			# Go's fuzzing coordinator can fail a run with a bare "context
			# deadline exceeded" when -fuzztime ends while a starved worker
			# is mid-call (golang/go#75804): no input failed, none was
			# written. That alone gets one more run; anything else fails.
			if [ "$attempt" -eq 1 ] && grep -q 'context deadline exceeded' "$log" &&
				! grep -qE 'Failing input written|panic:' "$log"; then
				echo "== $pkg $name: fuzzing coordinator deadline race, no failing input; running again"
				rm -f "$log"
				continue
			fi
			rm -f "$log"
			exit 1
		done
		n=$((n + 1))
	done
done
if [ "$n" -eq 0 ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
echo "fuzz: $n targets ran for $time each"
