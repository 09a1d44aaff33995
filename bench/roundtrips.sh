#!/bin/bash
# Counts what one round trip costs, per side: system calls (by kind),
# futex wake-ups, kernel context switches (perf stat on each peer, over
# the whole run, divided by every round trip the client made, warm-up's
# included: set-up adds well under 1%) and goroutine switches and
# unblocks (an execution trace of each peer for one second, bench/harness
# RXEGO_BENCH_TRACE, divided by the round trips the client logged in it). Counts, not
# timings: they hold on a loaded machine too, up to the work a timer or a
# slow scheduler adds. Needs perf with tracepoints (root).
#
#   bench/roundtrips.sh ['case regexp' ...]   (default: the latency cases)
set -euo pipefail
cd "$(dirname "$0")/.."
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
bin=$bindir/rxego-bench
go build -o "$bin" ./cmd/rxego-bench
cases=("$@")
if [ ${#cases[@]} -eq 0 ]; then
	cases=('UDP 64 B ping-pong, blocking' 'UDP 64 B ping-pong, busy-poll'
		'rxego send 64 B latency, blocking' 'rxego write 64 B latency, blocking'
		'rxego read 64 B latency, blocking' 'rxego atomic 64 B latency, blocking'
		'rxego send 64 B latency, busy-poll' 'rxego write 64 B latency, busy-poll'
		'rxego read 64 B latency, busy-poll' 'rxego atomic 64 B latency, busy-poll')
fi
events=(raw_syscalls:sys_enter syscalls:sys_enter_recvmmsg syscalls:sys_enter_sendmmsg
	syscalls:sys_enter_read syscalls:sys_enter_write syscalls:sys_enter_epoll_pwait syscalls:sys_enter_epoll_pwait2
	syscalls:sys_enter_nanosleep syscalls:sys_enter_futex context-switches)
perfargs=()
for e in "${events[@]}"; do perfargs+=(-e "$e"); done
# FUTEX_WAKE_PRIVATE is 129: count the wakes apart from the waits. A busy
# poller's reads that find nothing depend on timing: count the reads that
# returned data apart.
perfargs+=(-e syscalls:sys_enter_futex --filter 'op == 129'
	-e syscalls:sys_exit_recvmmsg --filter 'ret > 0' -e syscalls:sys_exit_read --filter 'ret > 0')
printf '| case | side | round trips | syscalls | recvmmsg | with data | sendmmsg | read | with data | write | epoll_pwait | epoll_pwait2 | nanosleep | futex | futex wake | ctx switches | goroutine switches | unblocks |\n'
printf '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for c in "${cases[@]}"; do
	dir=$(mktemp -d)
	RXEGO_BENCH_TRACE=$dir "$bin" -multi -repeat 1 -duration 2s -run "^${c}\$" -json "$dir/r.json" >/dev/null 2>&1 &
	h=$!
	perfs=()
	for role in server client; do # each peer counted from its start to its end
		pid=
		for _ in $(seq 500); do
			pid=$(pgrep -P "$h" -f "peer -role $role" | head -1 || true)
			[ -n "$pid" ] && break
			sleep 0.01
		done
		perf stat -x, "${perfargs[@]}" -p "$pid" -o "$dir/$role.perf" &
		perfs+=($!)
	done
	wait "$h" || true
	wait "${perfs[@]}" || true
	rate=$(python3 -c "import json
for l in open('$dir/r.json'):
    r=json.loads(l)
    if r.get('Role')=='client': print(r['Rounds'])")
	for role in client server; do
		go tool trace -d=parsed "$dir/$role.trace" >"$dir/$role.txt" 2>/dev/null || true
		logs=$(grep -c ' Log .*Category="round trip"' "$dir/client.txt" || true)
		sw=$(grep -c 'StateTransition.*Runnable->Running' "$dir/$role.txt" || true)
		ub=$(grep -c 'StateTransition.*Waiting->Runnable' "$dir/$role.txt" || true)
		python3 - "$dir/$role.perf" "$rate" "$c" "$role" "$sw" "$ub" "$logs" <<'EOF'
import sys
path, rate, case, role, sw, ub, logs = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
vals = []
for line in open(path):
    f = line.strip().split(',')
    if len(f) > 2 and f[0].replace('.', '').isdigit():
        vals.append(float(f[0]))
per = lambda v: '%.2f' % (v / rate) if rate else '-'
tr = lambda v: '%.2f' % (v / logs) if logs else '-'
# perf's order: the events as given, the filtered ones last.
sysc, recvmmsg, sendmmsg, read, write, epoll, epoll2, nanosleep, futex, ctx, wake, recvdata, readdata = (vals + [0] * 13)[:13]
cols = [sysc, recvmmsg, recvdata, sendmmsg, read, readdata, write, epoll, epoll2, nanosleep, futex, wake, ctx]
print('| %s | %s | %d | %s | %s | %s |' % (case, role, rate, ' | '.join(per(v) for v in cols), tr(sw), tr(ub)))
EOF
	done
	rm -rf "$dir"
done
