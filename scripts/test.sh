#!/usr/bin/env bash
# The project's whole test run, from a fresh Debian 12 machine with Go 1.26:
# installs what the tests need (conformance/setup.sh: the rxe lab's QEMU,
# kernels and rdma-core tools, and every program the tests run, each
# checked with command -v), then runs formatting and vet checks, every Go
# test under the race detector (the rxe conformance suite included: with
# CI=true it fails instead of skipping when the lab cannot run), and each
# fuzz target for a bounded time.
#
# Usage: scripts/test.sh         in a root shell (the lab needs netns and tap)
#        sudo scripts/test.sh    as a user allowed to use sudo
# Env:   FUZZTIME (default 5s per target), SKIP_SETUP=1 to skip installs.
# Unprivileged, `go test ./...` runs the tests that need no root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh needs root: run it in a root shell, or as sudo scripts/test.sh" >&2
  echo "(unprivileged, go test ./... runs the tests that need no root)" >&2
  exit 1
fi
# sudo resets PATH to its secure_path, which lacks Go's usual place.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
  export PATH="$PATH:/usr/local/go/bin"
fi
command -v go >/dev/null || { echo "scripts/test.sh: go not found on PATH (Go 1.26 is a prerequisite)" >&2; exit 1; }
export CI="${CI:-true}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
fuzztime="${FUZZTIME:-5s}"
start=$(date +%s)
step() { printf '\n=== %s (%ds)\n' "$*" $(( $(date +%s) - start )); }

if [ "${SKIP_SETUP:-}" != 1 ]; then
  step "setting up the rxe lab and test tools"
  conformance/setup.sh
fi

step "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...

step "the library builds for other systems"
# Listen needs Linux; the verbs, the engine and the pipe network do not,
# and an application importing rxego must compile elsewhere (README,
# "Other systems").
lib=$(go list ./... | grep -v -e /internal/ -e /cmd/ -e /bench -e /conformance -e /reliability -e /e2e/ -e /examples/)
for os in darwin windows; do
  GOOS=$os go build $lib
done

step "unit and integration tests (race detector)"
# e2e/dcqcn measures how flows share a rate-limited link over seconds; on
# a small machine another package's tests beside it take the CPU the
# flows need (the shares then follow the CPU, not DCQCN), so it runs
# alone afterwards.
pkgs=$(go list ./... | grep -v -e '/conformance$' -e '/e2e/dcqcn$')
go test -race -timeout 30m $pkgs
go test -race -timeout 10m ./e2e/dcqcn/

step "rxe conformance suite (QEMU guests, kernels 6.1 and 6.12)"
# A test during which a guest's kernel panicked (the emulated peer, not
# rxego) is rerun on fresh guests, at most twice; every other failure
# fails the run, and so does a third panic (conformance/README.md, "A
# guest that dies"). Every death's console is kept and named.
deaths=/tmp/rxego-guest-deaths/deaths.txt
rm -rf /tmp/rxego-guest-deaths && mkdir -p /tmp/rxego-guest-deaths
log=/tmp/rxego-conformance.log
RXEGO_GUEST_DEATHS=$deaths go test -timeout 60m -v ./conformance/ 2>&1 | tee $log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)' || true
for try in 1 2; do
  grep -q '^ok' $log && break
  tail -100 $log
  scripts/failed-output.sh $log || true # a report only: the decision is below
  if ! rerun=$(scripts/guest-deaths.sh $log "$deaths"); then
    exit 1
  fi
  step "rerun $try of 2, on fresh guests, of the tests during which a guest kernel died: $rerun"
  read -r tests kernels <<<"$rerun"
  deaths=/tmp/rxego-guest-deaths/deaths-rerun$try.txt log=/tmp/rxego-conformance-rerun$try.log
  RXEGO_GUEST_DEATHS=$deaths RXEGO_KERNELS=$kernels RXEGO_REPORT=$PWD/conformance/report-rerun$try.md \
    go test -timeout 30m -v -run "^($tests)\$" ./conformance/ 2>&1 | tee $log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)' || true
done
if ! grep -q '^ok' $log; then
  tail -100 $log
  scripts/failed-output.sh $log || true # a report only: the decision is below
  echo "conformance: a guest kernel died in the second rerun too, or the rerun failed otherwise" >&2
  exit 1
fi
if ls /tmp/rxego-guest-deaths/console-* >/dev/null 2>&1; then
  echo "conformance: passed on a rerun; the dead guests' consoles: $(ls /tmp/rxego-guest-deaths/console-* | tr '\n' ' ')"
fi

if [ -x scripts/fuzz.sh ]; then
  step "fuzz targets, $fuzztime each"
  scripts/fuzz.sh "$fuzztime"
fi

step "all tests passed"
