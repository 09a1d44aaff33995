// Package setupcheck holds a test that keeps conformance/setup.sh true:
// it finds the programs the project's Go code runs (exec.Command,
// exec.CommandContext, exec.LookPath, `ip netns exec`, and the helpers
// that pass a program name on to them) and fails on one that setup.sh
// does not install and check. It has no code of its own.
package setupcheck
