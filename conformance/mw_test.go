package conformance

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/conformance/lab"
	"github.com/rxego/rxego/internal/app/devstats"
	"github.com/rxego/rxego/qp"
)

// The memory-window cases face mwpeer (mwpeer/mwpeer.c, a small
// libibverbs program of the project's own, built here with gcc and run
// from the lab's share directory) with rxego in the test process. Each
// window covers bytes [mwOff, mwOff+mwLen) of a 4096-byte MR that grants
// no remote access itself. Patterns and the TCP script are mwpeer.c's.
const (
	mwOff = 1024
	mwLen = 1024
)

func mwPatA(j int) byte { return byte(j*13 + 7) }
func mwPatB(i int) byte { return byte(i*31 + 3) }

// cPeers builds the lab's own libibverbs peers (mwpeer, mcpeer), each
// once, into the shared lab's share directory.
var cPeers struct {
	mu    sync.Mutex
	built map[string]error
}

// cPeer returns the path in the guests of the C peer name (name/name.c),
// building it on first use.
func cPeer(t *testing.T, l *lab.Lab, name string) string {
	t.Helper()
	cPeers.mu.Lock()
	defer cPeers.mu.Unlock()
	err, done := cPeers.built[name]
	if !done {
		out, cerr := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", filepath.Join(l.ShareDir(), name),
			filepath.Join(name, name+".c"), "-libverbs").CombinedOutput()
		if cerr != nil {
			err = fmt.Errorf("building %s (conformance/setup.sh installs gcc and libibverbs-dev): %v\n%s", name, cerr, out)
		}
		if cPeers.built == nil {
			cPeers.built = map[string]error{}
		}
		cPeers.built[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return lab.GuestShareDir + "/" + name
}

// mwCase is one memory-window case: who binds, the window type, and how
// the window is invalidated (unbind: a type 1 bind of length 0; local:
// LOCAL_INV by the binder; send: the other side's SEND with Invalidate).
type mwCase struct {
	rxeBinds bool
	typ      int
	inv      string
}

// TestMemoryWindows: rxe binds a window (ibv_bind_mw for type 1, a
// BIND_MW work request for a zero-based type 2) and rxego READs it and
// WRITEs through it, rxe checks exactly the window changed, invalidates
// it, and rxego's next READ gets a remote access error (NAK); and the
// reverse, rxego binding and rxe accessing. Type 2 windows are also
// invalidated by the accessing side's SEND with Invalidate, which the
// binder's receive completion must report.
func TestMemoryWindows(t *testing.T) {
	cases := []mwCase{
		{true, 1, "unbind"}, {true, 2, "local"}, {true, 2, "send"},
		{false, 1, "unbind"}, {false, 2, "local"}, {false, 2, "send"},
	}
	forEachKernel(t, func(t *testing.T, p *Peer) {
		bin := cPeer(t, p.Lab, "mwpeer")
		for _, c := range cases {
			// The access after invalidation is NAKed (rxe counts neither
			// sending nor receiving that NAK): rxego's requester completes
			// with an error, or rxego's responder counts the refusal.
			cs := Case{Name: fmt.Sprintf("mw type %d inv=%s", c.typ, c.inv), Role: "rxego accesses",
				Expect: []string{"send_err", "flushed_work_requests"}, Require: []string{"rxego:send_err"}}
			if !c.rxeBinds {
				cs.Role = "rxego binds"
				cs.Expect = []string{"remote_access_naks", "naks_sent", "drop_bad_access", "flushed_work_requests"}
				cs.Require = []string{"rxego:remote_access_naks", "rxego:drop_bad_access"}
			}
			p.Case(t, cs,
				func(t *testing.T) Outcome { return p.memoryWindow(t, bin, c) })
		}
	})
}

func (p *Peer) memoryWindow(t *testing.T, bin string, c mwCase) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	mode := "access"
	if c.rxeBinds {
		mode = "bind"
	}
	proc, err := p.Guest.Start(bin, "-d", "rxe0", "-g", "1", "-p", strconv.Itoa(p.Port), "-m", mode,
		"-t", strconv.Itoa(c.typ), "-i", c.inv)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	fail := func(f string, a ...any) {
		t.Helper()
		stdout, stderr, _ := proc.Output()
		t.Fatalf(f+"\nmwpeer stdout: %s\nmwpeer stderr: %s", append(a, stdout, stderr)...)
	}
	if err := p.Guest.WaitTCPListen(ctx, p.Port); err != nil {
		fail("%v", err)
	}

	var dev *rxego.Device
	if err := p.Lab.InNetns(func() (err error) { dev, err = rxego.Open(p.HostIP, nil); return err }); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	buf := make([]byte, 4096)
	for j := range buf {
		if !c.rxeBinds {
			buf[j] = mwPatA(j)
		}
	}
	m, err := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := dev.CreateCQ(16)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
		Caps: rxego.Caps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := p.Lab.Dial(ctx, "tcp4", net.JoinHostPort(p.Guest.IP(), strconv.Itoa(p.Port)))
	if err != nil {
		fail("%v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	psn := rand.Uint32() & 0xffffff
	if _, err := conn.Write(ppDest{qpn: q.Num(), psn: psn, gid: netip.MustParseAddr(p.HostIP)}.encode()); err != nil {
		fail("%v", err)
	}
	remote, err := readPPDest(conn)
	if err != nil {
		fail("%v", err)
	}
	r := rxego.RemoteQP{Addr: netip.AddrPortFrom(netip.MustParseAddr(p.Guest.IP()), rxego.DefaultPort), QPN: remote.qpn, PSN: remote.psn}
	if err := q.Connect(r, &rxego.ConnectOptions{LocalPSN: psn}); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	line := func(want string) {
		t.Helper()
		s, err := rd.ReadString('\n')
		if err != nil || (want != "" && s != want+"\n") {
			fail("TCP line %q, %v; want %q", s, err, want)
		}
	}
	wait := func(what string, id uint64, st rxego.WCStatus) rxego.WC {
		t.Helper()
		wc := make([]rxego.WC, 1)
		if _, err := cq.PollWait(ctx, wc); err != nil {
			fail("%s: %v", what, err)
		}
		if wc[0].ID != id || wc[0].Status != st {
			fail("%s: completion %+v, want wr_id %d status %v", what, wc[0], id, st)
		}
		return wc[0]
	}
	post := func(wr rxego.SendWR) {
		t.Helper()
		wr.Flags |= rxego.SendSignaled
		if err := q.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	sge := func(off, n int) []rxego.SGE {
		return []rxego.SGE{{Addr: m.IOVA() + uint64(off), Length: uint32(n), LKey: m.LKey()}}
	}
	var note string
	if c.rxeBinds {
		s, err := rd.ReadString('\n')
		var rkey uint32
		var addr uint64
		var n int
		if _, err2 := fmt.Sscanf(s, "W %x %x %d\n", &rkey, &addr, &n); err != nil || err2 != nil || n != mwLen {
			fail("window line %q: %v %v", s, err, err2)
		}
		if c.typ == 1 {
			// rxe checks a window access's range against the MR, not the
			// window (docs/rnic.md): 8 bytes before the window, inside the
			// MR, come back instead of a NAK.
			post(rxego.SendWR{ID: 9, Opcode: rxego.WRRead, SGL: sge(0, 8), RemoteAddr: addr - mwOff, RKey: rkey})
			wait("READ outside rxe's window, inside its MR", 9, 0)
			for j := range 8 {
				if buf[j] != mwPatA(j) {
					fail("MR byte %d outside the window = %#x, want %#x", j, buf[j], mwPatA(j))
				}
			}
		}
		post(rxego.SendWR{ID: 1, Opcode: rxego.WRRead, SGL: sge(0, mwLen), RemoteAddr: addr, RKey: rkey})
		wait("READ through rxe's window", 1, 0)
		for i := range mwLen {
			if buf[i] != mwPatA(mwOff+i) {
				fail("window byte %d = %#x, want %#x", i, buf[i], mwPatA(mwOff+i))
			}
			buf[2048+i] = mwPatB(i)
		}
		post(rxego.SendWR{ID: 2, Opcode: rxego.WRWrite, SGL: sge(2048, mwLen), RemoteAddr: addr, RKey: rkey})
		wait("WRITE through rxe's window", 2, 0)
		if c.inv == "send" {
			post(rxego.SendWR{ID: 3, Opcode: rxego.WRSendInv, InvalidateRKey: rkey, SGL: sge(0, 4)})
			wait("SEND with Invalidate", 3, 0)
		}
		fmt.Fprintf(conn, "written\n")
		line("invalidated")
		post(rxego.SendWR{ID: 4, Opcode: rxego.WRRead, SGL: sge(0, 8), RemoteAddr: addr, RKey: rkey})
		wait("READ after invalidation", 4, rxego.WCRemAccessErr)
		fmt.Fprintf(conn, "done\n")
		note = fmt.Sprintf("rxe bound %#x; rxego READ %d B (checked; type 1: rxe also served 8 B outside the window, inside the MR), WROTE %d B (rxe checked the window and nothing else); after invalidation remote access error", rkey, mwLen, mwLen)
	} else {
		var key uint32
		var addr uint64
		w, err := pd.AllocMW(rxego.MWType(c.typ))
		if err != nil {
			t.Fatal(err)
		}
		if c.typ == 1 {
			if key, err = q.BindMW(w, 1, rxego.SendSignaled, m, m.IOVA()+mwOff, mwLen, rxego.AccessRemoteRead|rxego.AccessRemoteWrite); err != nil {
				t.Fatal(err)
			}
			addr = m.IOVA() + mwOff
			wait("bind", 1, 0)
		} else {
			key = qp.IncRKey(w.RKey())
			post(rxego.SendWR{ID: 1, Opcode: rxego.WRBindMW, Bind: rxego.MWBind{MW: w.RKey(), RKey: key, MR: m.LKey(),
				Addr: m.IOVA() + mwOff, Length: mwLen, Access: rxego.AccessRemoteRead | rxego.AccessRemoteWrite | rxego.AccessZeroBased}})
			wait("bind", 1, 0)
		}
		var recvBuf [64]byte
		rm, _ := pd.RegMR(recvBuf[:], rxego.AccessLocalWrite)
		if err := q.PostRecv(rxego.RecvWR{ID: 50, SGL: []rxego.SGE{{Addr: rm.IOVA(), Length: 64, LKey: rm.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "W %x %x %d\n", key, addr, mwLen)
		line("written")
		dev.Sync()
		for j := range buf {
			want := mwPatA(j)
			if j >= mwOff && j < mwOff+mwLen {
				want = mwPatB(j - mwOff)
			}
			if buf[j] != want {
				fail("MR byte %d = %#x, want %#x", j, buf[j], want)
			}
		}
		switch c.inv {
		case "send":
			wc := wait("receive", 50, 0)
			if wc.Flags&rxego.WCWithInv == 0 || wc.InvalidatedRKey != key {
				fail("receive %+v: want invalidated rkey %#x", wc, key)
			}
		case "unbind":
			if _, err := q.BindMW(w, 2, rxego.SendSignaled, nil, 0, 0, 0); err != nil {
				t.Fatal(err)
			}
			wait("unbind", 2, 0)
		case "local":
			post(rxego.SendWR{ID: 2, Opcode: rxego.WRLocalInv, InvalidateRKey: key})
			wait("local invalidate", 2, 0)
		}
		fmt.Fprintf(conn, "invalidated\n")
		note = fmt.Sprintf("rxego bound %#x; rxe READ and WROTE %d B (rxego checked the window and nothing else); after invalidation rxe got a remote access error", key, mwLen)
	}
	res, err := proc.Wait(ctx)
	if err != nil {
		fail("mwpeer: %v", err)
	}
	devstats.Settle(dev, 250*time.Millisecond, 5*time.Second)
	return Outcome{Note: note + "; " + strings.TrimSpace(string(res.Stdout)), Rxego: devstats.Map(dev)}
}
