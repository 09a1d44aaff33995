#!/usr/bin/env bash
# Usage: scripts/guest-deaths.sh CONFORMANCE_LOG DEATHS_FILE
#
# Decides whether a failed conformance run failed only because a guest
# kernel died: every failing case must belong to a test and kernel that
# DEATHS_FILE (written by the suite's recordGuestDeath, lines "TestName
# kernel") names, and some case must have failed. If so it prints
# "TestA|TestB 6.1,6.12" (the tests and kernels to rerun) and exits 0;
# otherwise it says which failures are not explained and exits 1.
set -euo pipefail
log=$1 deaths=$2
[ -s "$deaths" ] || { echo "conformance: failed, and no guest kernel died" >&2; exit 1; }
# Failing cases: "--- FAIL: TestX/kernel/..." at any depth; a test or
# kernel that failed without a failing case below it (a set-up error)
# counts as unexplained.
failed=$(grep -oE -- '--- FAIL: Test[^ ]+' "$log" | sed 's/^--- FAIL: //' | sort -u)
unexplained=""
cases=0
for name in $failed; do
  IFS=/ read -r top kernel rest <<<"$name"
  if [ -z "${kernel:-}" ]; then
    grep -qE -- "--- FAIL: $top/" "$log" || unexplained+=" $name"
    continue
  fi
  if ! grep -qxF "$top $kernel" "$deaths"; then
    unexplained+=" $name"
    continue
  fi
  [ -n "${rest:-}" ] && cases=$((cases + 1))
  [ -n "${rest:-}" ] || grep -qE -- "--- FAIL: $top/$kernel/" "$log" || unexplained+=" $name"
done
if grep -qE '^(panic:|FAIL\s+\S+ \[build failed\])' "$log"; then
  unexplained+=" (a panic or build failure)"
fi
if [ -n "$unexplained" ] || [ "$cases" = 0 ]; then
  echo "conformance: failures not explained by a guest kernel's death:${unexplained:- none counted}" >&2
  exit 1
fi
tests=$(cut -d' ' -f1 "$deaths" | sort -u | paste -sd'|')
kernels=$(cut -d' ' -f2 "$deaths" | sort -u | paste -sd,)
echo "$tests $kernels"
