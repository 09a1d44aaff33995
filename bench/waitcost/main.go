// Command waitcost measures what the way a blocked reader waits costs a
// 64-byte UDP round trip on loopback: two processes ping-pong a
// datagram over connected sockets, each reader waiting in one of four
// ways, and the p50 and p99 round trip are printed. It is the experiment
// behind docs/performance.md, "Blocking round trips and nested epoll":
//
//	net     Go's net.UDPConn: the runtime's poller watches the socket
//	nested  the runtime's poller watches an epoll instance that holds
//	        the socket (how rxego's readers waited until session 24)
//	epoll   the reader blocks in epoll_wait on an instance that holds the
//	        socket (how they wait since)
//	block   the reader blocks in read(2) on a blocking socket
//
// Run it on an otherwise idle machine, each mode several times in turns,
// with perf stat -a -e irq_vectors:call_function_single_entry beside it
// to count the wake-ups that cross CPUs. Linux only.
//
//	go run ./bench/waitcost -mode nested
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

var (
	mode = flag.String("mode", "net", "how a reader waits: net, nested, epoll or block")
	n    = flag.Int("n", 60000, "round trips measured (after 2,000 to warm up)")
	peer = flag.Int("server", 0, "run as the echo server, answering this loopback port (set by the client)")
)

const warmup = 2000

func main() {
	flag.Parse()
	switch *mode {
	case "net", "nested", "epoll", "block":
	default:
		log.Fatalf("unknown -mode %q", *mode)
	}
	if *peer != 0 {
		server(*peer)
		return
	}
	client()
}

// endpoint is one side's connected socket and how it reads.
type endpoint struct {
	conn *net.UDPConn // mode net
	fd   int
	read func([]byte) error
}

// open binds a loopback socket; connect connects it to port.
func open() (*endpoint, int) {
	if *mode == "net" {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			log.Fatal(err)
		}
		return &endpoint{conn: c}, c.LocalAddr().(*net.UDPAddr).Port
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		log.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		log.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		log.Fatal(err)
	}
	return &endpoint{fd: fd}, sa.(*unix.SockaddrInet4).Port
}

func (e *endpoint) connect(port int) {
	if e.conn != nil {
		// Reopen connected: net.DialUDP from the same local port.
		local := e.conn.LocalAddr().(*net.UDPAddr)
		e.conn.Close()
		c, err := net.DialUDP("udp4", local, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			log.Fatal(err)
		}
		e.conn = c
		e.read = func(b []byte) error { _, err := c.Read(b); return err }
		return
	}
	if err := unix.Connect(e.fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
		log.Fatal(err)
	}
	e.read = waiter(e.fd)
}

func (e *endpoint) write(b []byte) error {
	if e.conn != nil {
		_, err := e.conn.Write(b)
		return err
	}
	_, err := unix.Write(e.fd, b)
	return err
}

// waiter returns fd's read for the mode.
func waiter(fd int) func([]byte) error {
	switch *mode {
	case "block":
		if err := unix.SetNonblock(fd, false); err != nil {
			log.Fatal(err)
		}
		return func(b []byte) error { _, err := unix.Read(fd, b); return err }
	case "epoll":
		efd := instance(fd)
		evs := make([]unix.EpollEvent, 1)
		return func(b []byte) error {
			for {
				if _, err := unix.Read(fd, b); err != unix.EAGAIN {
					return err
				}
				if _, err := unix.EpollWait(efd, evs, -1); err != nil && err != unix.EINTR {
					return err
				}
			}
		}
	default: // nested
		efd := instance(fd)
		if err := unix.SetNonblock(efd, true); err != nil { // so the runtime's poller takes it
			log.Fatal(err)
		}
		rc, err := os.NewFile(uintptr(efd), "epoll").SyscallConn()
		if err != nil {
			log.Fatal(err)
		}
		evs := make([]unix.EpollEvent, 1)
		return func(b []byte) error {
			var rerr error
			err := rc.Read(func(uintptr) bool {
				if _, rerr = unix.Read(fd, b); rerr == unix.EAGAIN {
					unix.EpollWait(efd, evs, 0) // take the stale event: level-triggered
					return false
				}
				return true
			})
			if err != nil {
				return err
			}
			return rerr
		}
	}
}

// instance is an epoll instance holding fd for reading, level-triggered.
func instance(fd int) int {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		log.Fatal(err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(efd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		log.Fatal(err)
	}
	return efd
}

// server echoes every datagram, its socket connected to the client's
// port; it reports its own port on stdout.
func server(port int) {
	e, own := open()
	e.connect(port)
	fmt.Println(own)
	buf := make([]byte, 64)
	for {
		if err := e.read(buf); err != nil {
			log.Fatal(err)
		}
		if err := e.write(buf); err != nil {
			log.Fatal(err)
		}
	}
}

// client starts the server in a process of its own, then times round
// trips.
func client() {
	e, own := open()
	cmd := exec.Command(os.Args[0], "-mode", *mode, "-server", strconv.Itoa(own))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var port int
	if _, err := fmt.Fscan(out, &port); err != nil {
		log.Fatalf("server's port: %v", err)
	}
	e.connect(port)
	buf := make([]byte, 64)
	lat := make([]time.Duration, 0, *n)
	for i := range warmup + *n {
		t := time.Now()
		if err := e.write(buf); err != nil {
			log.Fatal(err)
		}
		if err := e.read(buf); err != nil {
			log.Fatal(err)
		}
		if i >= warmup {
			lat = append(lat, time.Since(t))
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("%s: %d round trips, p50 %v, p99 %v\n", *mode, len(lat), lat[len(lat)/2], lat[len(lat)*99/100])
}
