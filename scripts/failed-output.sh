#!/usr/bin/env bash
# Usage: scripts/failed-output.sh GO_TEST_V_LOG [HEAD [TAIL]]
#
# Prints what each failing leaf test of a `go test -v` log said: the
# lines go test streams under that test's "=== RUN/NAME/CONT" headers,
# each cut at 400 characters, the first HEAD (default 25) and the last
# TAIL (default 50) of them per test.
# The conformance suite runs its kernels in parallel, so a failure's
# message sits far above the log's tail; CI shows only the end of its
# output, and without this a failure there cannot be read (stop 47).
set -euo pipefail
log=$1 head=${2:-25} tail=${3:-50}
awk -v head="$head" -v tail="$tail" '
  # Pass 1: the failing tests; a leaf has no failing test below it.
  NR == FNR {
    if (match($0, /--- FAIL: [^ ]+/)) failed[substr($0, RSTART + 10, RLENGTH - 10)] = 1
    next
  }
  FNR == 1 {
    for (n in failed) {
      leaf[n] = 1
      for (m in failed) if (m != n && index(m, n "/") == 1) { delete leaf[n]; break }
    }
  }
  # Pass 2: attribute each line to the test whose header came last.
  /^=== (RUN|NAME|CONT) / { cur = $3; next }
  /^=== / || /^ *--- (PASS|FAIL|SKIP)/ { next }
  /^(FAIL|ok|PASS)([ \t]|$)/ { cur = ""; next } # a package summary
  cur in leaf {
    if (!(cur in started)) { started[cur] = 1; order[++k] = cur }
    out[cur, ++said[cur]] = substr($0, 1, 400)
  }
  END {
    for (i = 1; i <= k; i++) {
      n = order[i]
      printf "\n--- what %s said:\n", n
      for (j = 1; j <= said[n]; j++) {
        if (j == head + 1 && said[n] > head + tail) {
          printf "    ... %d lines left out ...\n", said[n] - head - tail
          j = said[n] - tail + 1
        }
        print out[n, j]
      }
    }
    for (n in leaf) if (!(n in started)) printf "\n--- %s failed and said nothing under its own name\n", n
  }
' "$log" "$log"
