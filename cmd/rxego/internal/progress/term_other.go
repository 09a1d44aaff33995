//go:build !linux

package progress

import "os"

// IsTerminal reports whether f is a character device (a terminal, most
// likely; only Linux checks properly).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
