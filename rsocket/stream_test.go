package rsocket

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// pattern returns n pseudo-random bytes from seed.
func pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// exchange sends a to the peer through x and b back through y at the same
// time, each side writing in uneven pieces and reading everything, and
// checks every byte.
func exchange(t *testing.T, x, y *Conn, a, b []byte) {
	t.Helper()
	for _, c := range []*Conn{x, y} {
		c.SetDeadline(time.Now().Add(60 * time.Second))
	}
	type result struct {
		got []byte
		err error
	}
	send := func(c *Conn, data []byte, seed uint64) chan error {
		done := make(chan error, 1)
		go func() {
			r := rand.New(rand.NewPCG(seed, 1))
			for off := 0; off < len(data); {
				n := min(1+r.IntN(20000), len(data)-off)
				if _, err := c.Write(data[off : off+n]); err != nil {
					done <- err
					return
				}
				off += n
			}
			done <- c.CloseWrite()
		}()
		return done
	}
	recv := func(c *Conn) chan result {
		done := make(chan result, 1)
		go func() {
			got, err := io.ReadAll(c)
			done <- result{got, err}
		}()
		return done
	}
	sx, sy := send(x, a, 1), send(y, b, 2)
	rx, ry := recv(x), recv(y)
	for _, e := range []chan error{sx, sy} {
		if err := <-e; err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	for i, r := range []chan result{ry, rx} {
		res := <-r
		want := [][]byte{a, b}[i]
		if res.err != nil {
			t.Fatalf("receive %d: %v after %d bytes", i, res.err, len(res.got))
		}
		if !bytes.Equal(res.got, want) {
			t.Fatalf("receive %d: %d bytes, sha256 %x, want %d bytes, sha256 %x", i, len(res.got),
				sha256.Sum256(res.got), len(want), sha256.Sum256(want))
		}
	}
}

// TestSmallBuffers: 4 KiB halves of the receive buffer and 16-entry
// queues make the target SGL wrap and credits run out hundreds of times.
func TestSmallBuffers(t *testing.T) {
	p := newPair(t, nil)
	cfg := &Config{SendBuffer: 8192, RecvBuffer: 8192, SendQueue: 16, RecvQueue: 16}
	cli, srv := p.connect(t, cfg, cfg)
	defer cli.Close()
	defer srv.Close()
	exchange(t, cli, srv, pattern(1, 1<<20), pattern(2, 700_000))
	st := cli.Stats()
	if st.CreditUpdates < 100 || st.DataSent < 100 || st.Malformed != 0 {
		t.Fatalf("client stats %+v: want many credit updates and DATA messages", st)
	}
}

// TestImpaired moves data both ways through a network that loses,
// duplicates and reorders packets; RC recovers and every byte arrives.
func TestImpaired(t *testing.T) {
	var shims []*impair.Conn
	seed := uint64(7)
	p := newPair(t, func(c transport.Conn) transport.Conn {
		seed++
		s := impair.Wrap(c, impair.Config{Seed: seed, Dir: impair.Both,
			Loss: 0.02, Duplicate: 0.01, Reorder: 0.05})
		shims = append(shims, s)
		return s
	})
	cfg := &Config{SendBuffer: 16384, RecvBuffer: 16384}
	cli, srv := p.connect(t, cfg, cfg)
	defer cli.Close()
	defer srv.Close()
	exchange(t, cli, srv, pattern(3, 1<<20), pattern(4, 1<<19))
	var lost, reordered uint64
	for _, s := range shims {
		st := s.ImpairStats()
		lost += st.Send.Lost + st.Recv.Lost
		reordered += st.Send.Reordered + st.Recv.Reordered
	}
	if lost == 0 || reordered == 0 {
		t.Fatalf("the shim lost %d and reordered %d packets: the test impaired nothing", lost, reordered)
	}
}

// TestCloseWrite: after CloseWrite the peer reads the data, then io.EOF,
// and may still answer; this side's Write fails with EPIPE.
func TestCloseWrite(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, nil)
	defer cli.Close()
	defer srv.Close()
	msg := pattern(5, 5000)
	if _, err := cli.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := cli.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v, want EPIPE", err)
	}
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(srv)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("server read %d bytes, %v; want %d and EOF", len(got), err, len(msg))
	}
	if _, err := srv.Write([]byte("reply")); err != nil {
		t.Fatalf("server write after the client's SHUTDOWN: %v", err)
	}
	buf := make([]byte, 16)
	cli.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := cli.Read(buf)
	if err != nil || string(buf[:n]) != "reply" {
		t.Fatalf("client read %q, %v", buf[:n], err)
	}
}

// TestDisconnect: the peer's Close (its DISCONNECT) gives the data sent
// before it, then io.EOF; a Write after it fails with ECONNRESET.
func TestDisconnect(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, nil)
	defer srv.Close()
	msg := pattern(6, 3000)
	if _, err := cli.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v, want net.ErrClosed", err)
	}
	srv.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(srv)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("server read %d bytes, %v; want %d and EOF", len(got), err, len(msg))
	}
	if _, err := srv.Write([]byte("late")); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write after the peer's DISCONNECT: %v, want ECONNRESET", err)
	}
}

// TestAfterShutdown: Stats.AfterShutdown counts the peer's messages taken
// after this side's SHUTDOWN or DISCONNECT: 1 on both ends when their
// DISCONNECTs crossed (each posted while neither end's poller could run),
// 0 on both when one end's DISCONNECT was taken before the other closed,
// and the data and DISCONNECT that followed a SHUTDOWN.
func TestAfterShutdown(t *testing.T) {
	deadline := time.Now().Add(10 * time.Second)
	p := newPair(t, nil)
	// connect sends a byte and waits for each end's first credit update
	// (the second half of the receive buffer, advertised at the first
	// completion), so the counts below are of the endings alone.
	connect := func() (cli, srv *Conn) {
		t.Helper()
		cli, srv = p.connect(t, nil, nil)
		srv.SetDeadline(deadline)
		if _, err := cli.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		for cli.Stats().CreditUpdates == 0 || srv.Stats().CreditUpdates == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no credit update within 10 s of connecting")
			}
			time.Sleep(time.Millisecond)
		}
		return cli, srv
	}
	check := func(what string, cli, srv *Conn, wantCli, wantSrv uint64) {
		t.Helper()
		if got := cli.Stats().AfterShutdown; got != wantCli {
			t.Errorf("%s: client AfterShutdown = %d, want %d", what, got, wantCli)
		}
		if got := srv.Stats().AfterShutdown; got != wantSrv {
			t.Errorf("%s: server AfterShutdown = %d, want %d", what, got, wantSrv)
		}
	}

	cli, srv := connect()
	cli.mu.Lock()
	srv.mu.Lock()
	for _, c := range []*Conn{cli, srv} {
		c.state &^= stReadable | stWritable
		if err := c.sendCtrlLocked(ctrlDisconnect, deadline); err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Unlock()
	cli.mu.Unlock()
	// Each end takes the other's DISCONNECT; Close then sends nothing.
	for _, c := range []*Conn{cli, srv} {
		for {
			c.mu.Lock()
			st := c.state
			c.mu.Unlock()
			if st == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the peer's DISCONNECT not taken within 10 s")
			}
			time.Sleep(time.Millisecond)
		}
		c.Close()
	}
	check("crossed DISCONNECTs", cli, srv, 1, 1)

	cli, srv = connect()
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	srv.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := srv.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("server read after the client's Close: %v, want io.EOF", err)
	}
	srv.Close()
	check("one DISCONNECT", cli, srv, 0, 0)

	cli, srv = connect()
	if err := cli.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	srv.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := srv.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("server read after the client's CloseWrite: %v, want io.EOF", err)
	}
	if _, err := srv.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	cli.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.ReadAll(cli); err != nil || string(got) != "x" {
		t.Fatalf("client read %q, %v after its CloseWrite; want \"x\" and EOF", got, err)
	}
	cli.Close()
	check("SHUTDOWN, then DATA and DISCONNECT", cli, srv, 2, 0)
}

// TestReset: a connection torn down without DISCONNECT (the CM's DREQ
// alone, as a crashed peer's kernel sends) is a reset, not an EOF.
func TestReset(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, nil)
	defer srv.Close()
	defer cli.Close()
	errs := make(chan error, 1)
	go func() {
		_, err := srv.Read(make([]byte, 10))
		errs <- err
	}()
	if err := cli.cmc.Disconnect(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after a bare CM disconnect: %v, want ECONNRESET", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read not unblocked by the CM disconnect")
	}
}

// TestCloseUnblocks: Close ends blocked Read and Write calls.
func TestCloseUnblocks(t *testing.T) {
	p := newPair(t, nil)
	cfg := &Config{SendBuffer: 8192, RecvBuffer: 8192}
	cli, srv := p.connect(t, cfg, cfg)
	defer srv.Close()
	errs := make(chan error, 2)
	go func() { _, err := cli.Read(make([]byte, 10)); errs <- err }()
	go func() { _, err := cli.Write(make([]byte, 1<<20)); errs <- err }() // the server reads nothing
	time.Sleep(50 * time.Millisecond)
	cli.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked call after Close: %v, want net.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close left a call blocked")
		}
	}
}

// TestCopy: io.Copy uses ReadFrom and WriteTo, and the bytes arrive.
func TestCopy(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, nil)
	defer cli.Close()
	defer srv.Close()
	var _ io.ReaderFrom = cli
	var _ io.WriterTo = srv
	data := pattern(8, 3<<20)
	done := make(chan error, 1)
	go func() {
		n, err := cli.ReadFrom(bytes.NewReader(data))
		if err == nil && n != int64(len(data)) {
			err = errors.New("short ReadFrom")
		}
		if err == nil {
			err = cli.CloseWrite()
		}
		done <- err
	}()
	var got bytes.Buffer
	srv.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := srv.WriteTo(&got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("WriteTo got %d bytes, want %d, contents differ", got.Len(), len(data))
	}
}

// TestKeepalive: keepalives go out on an idle connection and the peer
// takes them as nothing (no message, no malformed count).
func TestKeepalive(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, &Config{KeepAlive: 10 * time.Millisecond})
	defer cli.Close()
	defer srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	for cli.Stats().Keepalives < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := cli.Stats().Keepalives; n < 5 {
		t.Fatalf("%d keepalives sent, want 5", n)
	}
	exchange(t, cli, srv, []byte("after keepalives"), []byte("still fine"))
	if st := srv.Stats(); st.Malformed != 0 || st.DataReceived != 1 {
		t.Fatalf("server stats %+v: want one DATA, nothing malformed", st)
	}
}

// postRaw posts a zero-length WRITE with immediate imm from c, as a
// control message (its completion frees a control slot).
func postRaw(t *testing.T, c *Conn, imm uint32) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ctrlSeq++
	if err := c.q.PostSend(rxego.SendWR{ID: uint64(msgSet(opCtrl, ctrlKeepalive)), Opcode: rxego.WRWriteImm, Imm: imm}); err != nil {
		t.Fatal(err)
	}
}

// TestMalformed: a message with a reserved operation is dropped and
// counted, the connection carries on; a DATA message whose length is not
// what was written fails the connection with a reset, counted too.
func TestMalformed(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, nil)
	defer cli.Close()
	defer srv.Close()
	postRaw(t, cli, msgSet(5, 0))
	exchange(t, cli, srv, []byte("still"), []byte("fine"))
	if n := srv.Stats().Malformed; n != 1 {
		t.Fatalf("%d malformed counted after a reserved op, want 1", n)
	}

	p2 := newPair(t, nil)
	cli2, srv2 := p2.connect(t, nil, nil)
	defer cli2.Close()
	defer srv2.Close()
	postRaw(t, cli2, msgSet(opData, 1000)) // 1000 bytes said, none written
	srv2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := srv2.Read(make([]byte, 10)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a lying DATA message: %v, want ECONNRESET", err)
	}
	if n := srv2.Stats().Malformed; n != 1 {
		t.Fatalf("%d malformed counted, want 1", n)
	}
}
