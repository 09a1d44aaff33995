// Package netns runs code inside a network namespace: the one way tests
// open sockets facing a lab or a veth pair they created, shared by the
// conformance lab and the end-to-end tests.
package netns

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn on an OS thread switched into the network namespace ns (an
// open /var/run/netns/NAME or /proc/PID/ns/net) and switches back
// afterwards. Sockets fn creates stay in the namespace for their whole
// life; goroutines fn starts do not run in it. A thread that cannot be
// switched back is discarded rather than reused.
func Do(ns *os.File, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", ns.Name(), err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime ends it with this goroutine.
		return fmt.Errorf("restoring network namespace: %w (fn: %v)", err, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}
