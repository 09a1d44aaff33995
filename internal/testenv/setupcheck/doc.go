// Package setupcheck holds tests that keep the project's test scripts
// true. One keeps conformance/setup.sh complete: it finds the programs
// the project's Go code runs (exec.Command, exec.CommandContext,
// exec.LookPath, `ip netns exec`, and the helpers that pass a program
// name on to them) and fails on one that setup.sh does not install and
// check. Another runs scripts/failed-output.sh, which scripts/test.sh
// calls to show what failing conformance tests said, on a saved log. It
// has no code of its own.
package setupcheck
