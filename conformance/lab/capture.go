package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopSettle is how long Stop lets in-flight frames reach tcpdump.
const stopSettle = 100 * time.Millisecond

// Capture is a running tcpdump on the lab bridge.
type Capture struct {
	path string
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
	err  error
}

// Capture starts tcpdump on the bridge writing every frame (full length)
// to the pcap file path, and returns once tcpdump is capturing. Since
// tcpdump puts the bridge in promiscuous mode, frames forwarded between
// guests are seen as well as those to and from the host. Stop it with
// Stop; Close stops it too.
func (l *Lab) Capture(path string) (*Capture, error) { return l.CaptureFilter(path, "") }

// CaptureFilter is Capture of only the frames that match filter, a
// tcpdump (pcap-filter) expression; "" keeps every frame.
func (l *Lab) CaptureFilter(path, filter string) (*Capture, error) {
	// -s 9100 -B 16384: a full jumbo frame and a 16 MiB buffer, so a busy
	// host does not make tcpdump drop frames.
	// --immediate-mode: without it frames wait in the kernel ring for a
	// block to fill or time out, and the last ones are lost at Stop.
	args := []string{"-i", bridgeName, "-n", "-s", "9100", "-B", "16384", "-U", "--immediate-mode", "-w", path}
	if filter != "" {
		args = append(args, filter)
	}
	cmd := l.Command("tcpdump", args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("tcpdump: %w", err)
	}
	c := &Capture{path: path, cmd: cmd, done: make(chan struct{})}
	// tcpdump says "listening on" once the socket is bound; frames sent
	// before that would be missing from the file.
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var seen []string
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, "listening on") {
				ready <- ""
				break
			}
			seen = append(seen, line)
		}
		if len(seen) > 0 || sc.Err() != nil {
			select {
			case ready <- strings.Join(seen, "; "):
			default:
			}
		}
		io.Copy(io.Discard, stderr)
		c.err = cmd.Wait()
		close(c.done)
	}()
	select {
	case msg := <-ready:
		if msg != "" {
			c.Stop()
			return nil, fmt.Errorf("tcpdump: %s", msg)
		}
	case <-c.done:
		return nil, fmt.Errorf("tcpdump exited: %v", c.err)
	case <-time.After(waitTimeout):
		c.Stop()
		return nil, errors.New("tcpdump did not start listening")
	}
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.captures = append(l.captures, c)
	}
	l.mu.Unlock()
	if closed {
		c.Stop()
		return nil, errors.New("lab is closed")
	}
	return c, nil
}

// Path returns the pcap file's path.
func (c *Capture) Path() string { return c.path }

// Stop ends the capture, letting tcpdump flush the file; it is safe to call
// more than once.
func (c *Capture) Stop() error {
	c.once.Do(func() {
		// Frames the caller's last action put on the wire may still be
		// on their way through the bridge.
		time.Sleep(stopSettle)
		c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.done:
		case <-time.After(waitTimeout):
			c.cmd.Process.Kill()
			<-c.done
		}
	})
	// tcpdump exits non-zero on SIGINT on some versions; only a missing
	// process is an error worth reporting.
	var ee *exec.ExitError
	if c.err != nil && !errors.As(c.err, &ee) {
		return c.err
	}
	return nil
}
