#!/bin/bash
# The 16-CPU sitting (issue 29): rxego against TCP and raw UDP on a lent
# 16-CPU machine that has no Go toolchain, in one run of at most 9 minutes
# that needs no second try. See docs/performance.md, "The 16-CPU sitting".
#
#   bench/device-sitting.sh build        # here: static binaries and this script into bench/device/
#   bench/device/device-sitting.sh run OUTDIR   # there: the sitting; report into OUTDIR
#
# QUICK=1 shortens the run (a handful of cases, -quick, 0.1 s each, one
# round) to try the script on a development machine; REPEAT, DURATION and
# QPS override the rounds, the measured interval and the QP counts; PIN
# is rxego-bench -pin (e.g. PIN=0-7/8-15: the server on CPUs 0-7, the
# client on 8-15; unset: the kernel places the peers).
set -u
here=$(cd "$(dirname "$0")" && pwd)

# The cases: the yardsticks (TCP, raw UDP GSO/GRO, UDP ping-pong, rsocket)
# and rxego's rows that issue 29's targets name, with the -multi rows (N
# TCP streams, N UDP GSO flows, WRITE/READ/SEND 64 KiB at MTU 4096 and
# 1024 over N QPs) for every N in $QPS.
RE='^(TCP stream|TCP 64 B ping-pong|TCP stream, [0-9]+ streams|rsocket stream \(rxego\)|rsocket 64 B ping-pong \(rxego\)|UDP gso (1|4) KiB|UDP gso-runs 4 KiB|UDP gso 4 KiB, [0-9]+ flows|UDP 64 B ping-pong, (blocking|busy-poll)|rxego (write|read|send) 64 KiB mtu (4096|1024)(, [0-9]+ QPs)?|rxego (send|write|read|atomic) 64 B latency, (blocking|busy-poll)|rxego WRITE 64 B rate, depth 128, 32 per post, (blocking|busy-poll)(, 8 QPs)?)$'

case "${1:-}" in
build)
	# Here, with the Go toolchain: a static binary (no libc needed there)
	# and this script, in the git-ignored bench/device/.
	root=$(cd "$here/.." && pwd)
	out=$root/bench/device
	mkdir -p "$out" || exit 1
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -o "$out/rxego-bench" ./cmd/rxego-bench) || exit 1
	cp "$root/bench/device-sitting.sh" "$out/device-sitting.sh" || exit 1
	chmod +x "$out/device-sitting.sh"
	{
		echo "commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . || echo ' (with uncommitted changes)')"
		echo "built $(date -u '+%F %T UTC') with $(go version)"
	} >"$out/BUILD"
	cat "$out/BUILD"
	echo "ready: carry bench/device, run: bench/device/device-sitting.sh run \$OUT"
	;;
run)
	dir=${2:?usage: device-sitting.sh run OUTDIR}
	mkdir -p "$dir" || exit 1
	bin=$here/rxego-bench
	[ -x "$bin" ] || { echo "no $bin: run 'bench/device-sitting.sh build' first" >&2; exit 1; }
	# 57 cases a round at 0.3 s warm-up + 1.5 s measured (+ ~0.05 s of
	# processes and set-up): about 105 s a round, 3 rounds about 5.3
	# minutes. -budget starts no case after 6.5 minutes, and one case is
	# bounded by its own 92 s timeout: at most about 8 minutes; timeout
	# stops the whole run at 8 m 40 s regardless. Every run's JSON line
	# is written as it ends, so the medians and targets come out of
	# whatever ran.
	repeat=${REPEAT:-3} qps=${QPS:-1,2,4,8,16} budget=6m30s limit=520
	args=()
	if [ "${QUICK:-}" = 1 ]; then
		repeat=${REPEAT:-1} qps=${QPS:-1,2} budget=1m limit=120
		RE='^(TCP stream|TCP stream, 2 streams|UDP gso 4 KiB(, 2 flows)?|rxego write 64 KiB mtu 4096(, 2 QPs)?|rxego send 64 B latency, blocking)$'
		args=(-quick -duration "${DURATION:-0.1s}")
	elif [ -n "${DURATION:-}" ]; then
		args=(-duration "$DURATION")
	fi
	[ -n "${PIN:-}" ] && args+=(-pin "$PIN")
	log=$dir/sitting.log
	stamp() { echo "$1: $(date -u +%T) load average $(cut -d' ' -f1-3 /proc/loadavg), nproc $(nproc)" | tee -a "$log"; }
	: >"$log"
	[ -f "$here/BUILD" ] && cat "$here/BUILD" | tee -a "$log"
	echo "uname: $(uname -srm); rounds $repeat, QPs $qps, budget $budget${PIN:+, pin $PIN}" | tee -a "$log"
	stamp start
	# A failed case is reported (its row reads "error") and the run goes
	# on; the exit status says whether any failed.
	timeout -k 10 "$limit" "$bin" -nice -repeat "$repeat" -qps "$qps" -budget "$budget" -run "$RE" "${args[@]}" \
		-json "$dir/runs.json" >"$dir/report.md" 2>"$dir/progress.log"
	rc=$?
	stamp end
	echo "rxego-bench exit status $rc ($(grep -c FAILED "$dir/progress.log") failed runs)" | tee -a "$log"
	"$bin" compare "sitting=$dir/runs.json" >"$dir/targets.md" 2>>"$log" || echo "compare failed" | tee -a "$log"
	tail -n 3 "$dir/progress.log"
	echo "report: $dir/report.md, runs.json, targets.md, progress.log, sitting.log"
	exit $rc
	;;
*)
	sed -n '2,14p' "$0" >&2
	exit 2
	;;
esac
