// Package progress prints a one-line, self-overwriting progress report on
// a terminal (or wherever asked) while a long command runs: `rxego trace`
// of a large file, `rxego perf`, the demo's congestion scenario.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Interval is how often a Reporter redraws.
const Interval = 250 * time.Millisecond

// Reporter redraws a status line every Interval until Stop. A nil
// *Reporter is valid and does nothing, so callers need not check whether
// progress is on.
type Reporter struct {
	w    io.Writer
	fn   func() string
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// Start begins reporting fn's line on w every Interval. It returns nil
// (reporting nothing) when on is false.
func Start(w io.Writer, on bool, fn func() string) *Reporter {
	if !on {
		return nil
	}
	r := &Reporter{w: w, fn: fn, stop: make(chan struct{}), done: make(chan struct{})}
	go r.loop()
	return r
}

func (r *Reporter) loop() {
	defer close(r.done)
	t := time.NewTicker(Interval)
	defer t.Stop()
	last := 0
	for {
		select {
		case <-r.stop:
			if last > 0 {
				fmt.Fprintf(r.w, "\r%*s\r", last, "") // leave a clean line
			}
			return
		case <-t.C:
			s := r.fn()
			fmt.Fprintf(r.w, "\r%s%*s", s, max(0, last-len(s)), "")
			last = len(s)
		}
	}
}

// Stop ends the reporting and erases the line; it waits for the last
// redraw to finish.
func (r *Reporter) Stop() {
	if r == nil {
		return
	}
	r.once.Do(func() { close(r.stop) })
	<-r.done
}

// Wanted reports whether progress should be shown on f: when forced, or
// when f is a terminal.
func Wanted(f *os.File, forced bool) bool { return forced || IsTerminal(f) }
