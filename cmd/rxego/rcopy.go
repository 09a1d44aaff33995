package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/rsocket"
)

// rcopy's protocol (rdma-core librdmacm/examples/rcopy.c): 16-byte
// headers in the host's byte order (little-endian on every lab machine;
// rcopy.c leaves byte swapping as a TODO): version 0, command, length,
// data, id. OPEN carries the file mode in data and the NUL-terminated
// destination path padded to 8 bytes; WRITE the size (8 bytes) and then
// the file's bytes; CLOSE nothing. Each is answered by a header with the
// command | 0x80 and a status (an errno) in data.
const (
	rcopyPort   = 7427
	rcopyHdr    = 16
	rcopyOpen   = 1
	rcopyClose  = 2
	rcopyWrite  = 3
	rcopyResp   = 0x80
	rcopyMaxHdr = 4096 + rcopyHdr // the longest OPEN rxego takes (PATH_MAX)
)

type rcopyMsg struct {
	command uint8
	length  uint16
	data    uint32
	id      uint64
}

func (m rcopyMsg) bytes() []byte {
	b := make([]byte, rcopyHdr)
	b[1] = m.command
	binary.LittleEndian.PutUint16(b[2:], m.length)
	binary.LittleEndian.PutUint32(b[4:], m.data)
	binary.LittleEndian.PutUint64(b[8:], m.id)
	return b
}

func readRcopyMsg(r io.Reader) (rcopyMsg, error) {
	var b [rcopyHdr]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return rcopyMsg{}, err
	}
	m := rcopyMsg{command: b[1], length: binary.LittleEndian.Uint16(b[2:]), data: binary.LittleEndian.Uint32(b[4:]),
		id: binary.LittleEndian.Uint64(b[8:])}
	if b[0] != 0 || m.length < rcopyHdr || int(m.length) > rcopyMaxHdr {
		return m, fmt.Errorf("invalid version %d or length %d", b[0], m.length)
	}
	return m, nil
}

// expect reads the answer to command and returns its status.
func rcopyExpect(r io.Reader, command uint8) error {
	m, err := readRcopyMsg(r)
	if err != nil {
		return err
	}
	if m.length != rcopyHdr || m.command != command|rcopyResp {
		return fmt.Errorf("invalid length %d or bad command response %x:%x", m.length, m.command, command|rcopyResp)
	}
	if m.data != 0 {
		return fmt.Errorf("the server answered %v", syscall.Errno(m.data))
	}
	return nil
}

func runRcopy(args []string) error {
	fs := flag.NewFlagSet("rcopy", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego rcopy [-p port] [-b bind_address] [-n count]     (server)
       rxego rcopy source server[:destination] [-p port] [-b bind_address]

Talks to librdmacm's rcopy over rsocket: the client sends the file
source to the server, which writes it at destination (default: source's
path) with source's mode. The server serves clients one after another,
-n of them (0: until -timeout); -b is its RoCE address (default: every
IPv4 address of the host), and the client's own.

  rxego rcopy -b 198.18.0.1 -n 1             # server
  rcopy /etc/services 198.18.0.1:/tmp/s      # the peer, elsewhere

flags:
`)
		printFlags(fs)
	}
	port := fs.Uint("p", rcopyPort, "port")
	bind := fs.String("b", "", "local RoCE address (rxego)")
	count := fs.Int("n", 0, "server: clients to serve, then exit (rxego; 0: until -timeout)")
	f := addCMFlags(fs)
	operands, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if *port > 0xffff || *count < 0 {
		return usageErrorf("port %d or count %d out of range", *port, *count)
	}
	var conns rsocketConns // their counters join --stats
	f.extra = conns.counters
	switch len(operands) {
	case 0:
		return rsocketServer(*bind, uint16(*port), f, func(ctx context.Context, ln *rsocket.Listener) error {
			return rcopyServe(ctx, ln, *count, &conns)
		}, nil)
	case 2:
		src, dst := operands[0], operands[0]
		server, path, ok := strings.Cut(operands[1], ":")
		if ok {
			dst = path
		}
		return rsocketClient(server, *bind, uint16(*port), f, func(ctx context.Context, m *cm.Manager, to string) error {
			return rcopySend(ctx, m, to, src, dst, *f.timeout, &conns)
		})
	}
	return usageErrorf("want no operands (server) or source server[:destination]")
}

// rcopySend is rcopy's client; timeout is the -timeout its errors name;
// the connection joins conns.
func rcopySend(ctx context.Context, m *cm.Manager, to, src, dst string, timeout time.Duration, conns *rsocketConns) error {
	file, err := os.Open(src)
	if err != nil {
		return err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return err
	}
	c, err := rsocket.DialContext(ctx, m, to, nil)
	if err != nil {
		return rsocketDialError(to, err, timeout)
	}
	conns.add(c)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fmt.Print("opening...")
	if len(dst) > rcopyMaxHdr-rcopyHdr-8 {
		return fmt.Errorf("destination path of %d bytes is too long", len(dst))
	}
	path := make([]byte, (len(dst)+8)&^7)
	copy(path, dst)
	open := rcopyMsg{command: rcopyOpen, length: uint16(rcopyHdr + len(path)), data: uint32(unixMode(st.Mode()))}
	if _, err := c.Write(append(open.bytes(), path...)); err != nil {
		return err
	}
	if err := rcopyExpect(c, rcopyOpen); err != nil {
		return err
	}
	fmt.Print("transferring")
	write := append(rcopyMsg{command: rcopyWrite, length: rcopyHdr + 8}.bytes(), make([]byte, 8)...)
	binary.LittleEndian.PutUint64(write[rcopyHdr:], uint64(st.Size()))
	if _, err := c.Write(write); err != nil {
		return err
	}
	fmt.Print("...")
	start := time.Now()
	n, err := c.ReadFrom(io.LimitReader(file, st.Size()))
	if err == nil && n != st.Size() {
		err = fmt.Errorf("%s shrank to %d bytes while sending", src, n)
	}
	if err == nil {
		err = rcopyExpect(c, rcopyWrite)
	}
	elapsed := time.Since(start)
	fmt.Print("closing...")
	if _, cerr := c.Write(rcopyMsg{command: rcopyClose, length: rcopyHdr}.bytes()); err == nil {
		err = cerr
	}
	if err == nil {
		if err = rcopyExpect(c, rcopyClose); err == nil {
			fmt.Println("done")
		}
	}
	if err != nil {
		fmt.Println()
		return err
	}
	usec := max(float64(elapsed.Microseconds()), 1)
	fmt.Printf("%d bytes in %.2f seconds = %.2f Gb/sec\n", n, usec/1e6, float64(n*8)/(1000*usec))
	return nil
}

// unixMode is st_mode's permission bits for a Go file mode.
func unixMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= syscall.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		u |= syscall.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		u |= syscall.S_ISVTX
	}
	return u | syscall.S_IFREG
}

// rcopyServe is rcopy's server: clients one after another, count of
// them (0: until ctx ends), each connection joining conns.
func rcopyServe(ctx context.Context, ln *rsocket.Listener, count int, conns *rsocketConns) error {
	for served := 0; count == 0 || served < count; served++ {
		fmt.Print("waiting for connection...")
		c, err := acceptContext(ctx, ln)
		if err != nil {
			fmt.Println()
			return err
		}
		conns.add(c)
		fmt.Printf("client: %v\n", c.RemoteAddr().(rsocket.Addr).AddrPort.Addr())
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
		err = rcopyProcess(c)
		stop()
		c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// rcopyProcess serves one client's commands until it disconnects.
func rcopyProcess(c net.Conn) error {
	var file *os.File
	defer func() {
		if file != nil {
			file.Close()
		}
	}()
	for {
		m, err := readRcopyMsg(c)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		status := uint32(0)
		switch m.command {
		case rcopyOpen:
			fmt.Print("opening: ")
			path := make([]byte, int(m.length)-rcopyHdr)
			if _, err := io.ReadFull(c, path); err != nil {
				return fmt.Errorf("error receiving path: %w", err)
			}
			name, _, _ := strings.Cut(string(path), "\x00")
			fmt.Printf("%s, ", name)
			switch {
			case file != nil:
				fmt.Println("cannot open another file")
				status = uint32(syscall.EBUSY)
			default:
				if file, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, os.FileMode(m.data&0o777)); err != nil {
					fmt.Println("unable to open destination file")
					status = errnoOf(err)
					file = nil
				}
			}
		case rcopyWrite:
			fmt.Print("transferring")
			if file == nil || m.length != rcopyHdr+8 {
				fmt.Println("...file not opened or invalid message length")
				return rcopyAnswer(c, m, uint32(syscall.EINVAL), errors.New("rcopy: WRITE without an open file"))
			}
			var sz [8]byte
			if _, err := io.ReadFull(c, sz[:]); err != nil {
				return err
			}
			size := int64(binary.LittleEndian.Uint64(sz[:]))
			fmt.Printf("...%d bytes...", size)
			n, err := io.CopyN(file, c, size)
			if err != nil {
				fmt.Println("...error receiving data")
				return rcopyAnswer(c, m, uint32(syscall.EIO), fmt.Errorf("rcopy: %d of %d bytes: %w", n, size, err))
			}
		case rcopyClose:
			fmt.Print("closing...")
			if file != nil {
				if err := file.Close(); err != nil {
					status = errnoOf(err)
				}
				file = nil
			}
			if err := rcopyAnswer(c, m, status, nil); err != nil {
				return err
			}
			fmt.Println("done")
			continue
		default:
			return rcopyAnswer(c, m, uint32(syscall.EINVAL), fmt.Errorf("rcopy: unknown command %d", m.command))
		}
		if err := rcopyAnswer(c, m, status, nil); err != nil {
			return err
		}
	}
}

// rcopyAnswer answers m with status and returns err.
func rcopyAnswer(c net.Conn, m rcopyMsg, status uint32, err error) error {
	_, werr := c.Write(rcopyMsg{command: m.command | rcopyResp, length: rcopyHdr, data: status, id: m.id}.bytes())
	return errors.Join(err, werr)
}

// errnoOf is the errno in err, or EIO.
func errnoOf(err error) uint32 {
	var e syscall.Errno
	if errors.As(err, &e) {
		return uint32(e)
	}
	return uint32(syscall.EIO)
}
