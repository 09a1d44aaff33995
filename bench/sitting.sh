#!/bin/bash
# A quiet sitting on the development machine: two (or more) trees'
# rxego-bench binaries run alternately, round after round, at -nice, on
# issue 29's target rows; then "rxego-bench compare" prints each case's
# median per tree, the ratios and the targets. See docs/performance.md,
# "Quiet sittings".
#
#   bench/sitting.sh [-f] [-n ROUNDS] [-r REGEX] [-p PIN] [-s SHARDS] OUTDIR [name=]BIN [name=]BIN ...
#
# A tree may be "[name=]BIN FLAG ..." (one argument): its runs get those
# rxego-bench flags too ('zc=/tmp/rxego-bench -zerocopy' against
# 'copy=/tmp/rxego-bench' weighs a flag with one binary).
#
#   -f        start even if the load average is 1 or more (the figures are
#             then not evidence: say so beside them)
#   -n ROUNDS rounds of every tree (default 3)
#   -r REGEX  the cases (default: the rows of issue 29's targets)
#   -p PIN    rxego-bench -pin: the peers' CPUs ("1": both on CPU 1; "0/1":
#             server on 0, client on 1); every binary must know -pin
#   -s SHARDS rxego-bench -shards: the rxego devices' shards ("4/1": the
#             server's 4, the client's 1); every binary must know -shards
#
# The trees run in the order given in odd rounds and in reverse in even
# ones. Unnamed binaries are called before, after, tree3, ... Each round of
# each tree writes OUTDIR/NAME-ROUND.{json,md,err}; OUTDIR/compare.md is
# the comparison (by the last tree's binary), OUTDIR/sitting.log the load
# averages.
set -u
force=0 rounds=3 pin=() shards=()
re='^(TCP stream|TCP 64 B ping-pong|TCP stream, (8|16) streams|UDP gso (1|4) KiB|UDP gso-runs 4 KiB|UDP gso 4 KiB, (8|16) flows|UDP 64 B ping-pong, (blocking|busy-poll)|rxego (write|read|send) 64 KiB mtu (4096|1024)(, (8|16) QPs)?|rxego (send|write|read|atomic) 64 B latency, (blocking|busy-poll)|rxego WRITE 64 B rate, depth 128, 32 per post, (blocking|busy-poll)(, 8 QPs)?)$'
while getopts fn:r:p:s: o; do
	case $o in
	f) force=1 ;;
	n) rounds=$OPTARG ;;
	r) re=$OPTARG ;;
	p) pin=(-pin "$OPTARG") ;;
	s) shards=(-shards "$OPTARG") ;;
	*) sed -n '8,22p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ]; then
	sed -n '8,22p' "$0" >&2
	exit 2
fi
out=$1
shift
names=() bins=() flags=()
i=0
for a in "$@"; do
	i=$((i + 1))
	case ${a%% *} in
	*=*) n=${a%%=*} b=${a#*=} ;;
	*) n=$([ $i = 1 ] && echo before || { [ $i = 2 ] && echo after || echo tree$i; }) b=$a ;;
	esac
	read -ra cmd <<<"$b"
	[ -x "${cmd[0]}" ] || { echo "sitting: ${cmd[0]} is not an executable" >&2; exit 2; }
	names+=("$n") bins+=("${cmd[0]}") flags+=("${cmd[*]:1}")
done
mkdir -p "$out" || exit 1
log=$out/sitting.log
load() { cut -d' ' -f1-3 /proc/loadavg; }
one=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$one" 'BEGIN { exit !(l >= 1) }'; then
	if [ $force = 0 ]; then
		echo "sitting: load average $(load): not quiet (wait until the 1-minute figure is under 1, or -f)" >&2
		exit 1
	fi
	echo "sitting: load average $(load), started anyway (-f): the figures are not from a quiet sitting" | tee -a "$log"
fi
echo "start: $(date -u +%T) load average $(load), nproc $(nproc); trees ${names[*]}; $rounds rounds ${pin[*]} ${shards[*]}" | tee -a "$log"
for r in $(seq 1 "$rounds"); do
	# Odd rounds run the trees in the order given, even rounds in reverse
	# (ABBA): a tree that always ran second in a round would take on
	# whatever the round's order does (the load the first one left, say).
	order=("${!bins[@]}")
	if [ $((r % 2)) = 0 ]; then
		order=()
		for ((k = ${#bins[@]} - 1; k >= 0; k--)); do order+=("$k"); done
	fi
	for k in "${order[@]}"; do
		n=${names[$k]}
		# A failed case is in its round's report and JSON; the sitting
		# goes on.
		# shellcheck disable=SC2086 # a tree's flags are words
		"${bins[$k]}" ${flags[$k]} -nice "${pin[@]}" "${shards[@]}" -multi -repeat 1 -run "$re" -json "$out/$n-$r.json" >"$out/$n-$r.md" 2>"$out/$n-$r.err" ||
			echo "$n round $r: $(grep -c FAILED "$out/$n-$r.err") failed cases" | tee -a "$log"
		echo "$n round $r done: $(date -u +%T) load average $(load)" | tee -a "$log"
	done
done
echo "end: $(date -u +%T) load average $(load)" | tee -a "$log"
args=()
for n in "${names[@]}"; do
	files=$(ls "$out/$n"-[0-9]*.json | paste -sd, -)
	args+=("$n=$files")
done
"${bins[-1]}" compare "${args[@]}" >"$out/compare.md" || exit 1
cat "$out/compare.md"
