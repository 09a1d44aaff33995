package lab

import (
	"context"
	"net"
	"os/exec"
	"time"

	"github.com/rxego/rxego/internal/testenv/netns"
)

// InNetns runs fn on an OS thread switched into the lab's network
// namespace and switches back afterwards. Sockets fn creates stay in the
// namespace for their whole life, so fn can open UDP/TCP sockets facing the
// guests and hand them out. Goroutines fn starts do not run in the
// namespace. If the thread cannot be switched back it is discarded rather
// than reused.
func (l *Lab) InNetns(fn func() error) error {
	return netns.Do(l.ns, fn)
}

// Dial connects to address inside the lab namespace (network "tcp",
// "udp", "tcp6", ...), like net.DialTimeout.
func (l *Lab) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := l.InNetns(func() error {
		var d net.Dialer
		var err error
		// The socket is created synchronously on this thread; connect may
		// finish in the poller, which is fine: the socket keeps its netns.
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// ListenPacket opens a packet socket inside the lab namespace, e.g.
// ListenPacket("udp4", "198.18.0.1:4791").
func (l *Lab) ListenPacket(network, address string) (net.PacketConn, error) {
	var c net.PacketConn
	err := l.InNetns(func() error {
		var err error
		c, err = net.ListenPacket(network, address)
		return err
	})
	return c, err
}

// Listen opens a stream listener inside the lab namespace, e.g.
// Listen("tcp4", "198.18.0.1:18515") for a tool's out-of-band exchange.
func (l *Lab) Listen(network, address string) (net.Listener, error) {
	var ln net.Listener
	err := l.InNetns(func() error {
		var err error
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// Command returns a command that runs the host program name inside the lab
// namespace (through `ip netns exec`), e.g. the rxego binary facing the
// guests from HostIP. The caller starts and waits for it.
func (l *Lab) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", l.name, name}, args...)...)
}

// CommandContext is Command with a context that kills the process.
func (l *Lab) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.name, name}, args...)...)
	cmd.WaitDelay = waitTimeout
	return cmd
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
