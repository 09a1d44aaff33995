package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
)

// readPair connects two RC QPs on engines whose configuration cfg
// adjusts, on a fabric that delivers packets 5 us after they leave.
func readPair(t *testing.T, o connOpts, qps int, cfg func(*Config)) (*fabric, []*endpoint, []*endpoint) {
	f := newFabric(t)
	f.engineCfg = cfg
	f.delay = func(wirePkt) time.Duration { return 5 * time.Microsecond }
	na, nb := f.node("198.18.0.1"), f.node("198.18.0.2")
	var as, bs []*endpoint
	for range qps {
		a, b := na.newQP(t, RC, 64), nb.newQP(t, RC, 64)
		connect(t, a, b, o)
		as, bs = append(as, a), append(bs, b)
	}
	return f, as, bs
}

// readRequest is a READ request seen on the wire.
type readRequest struct {
	psn  bth.PSN
	addr uint64
	len  uint32
}

// TestReadSplit: a READ work request longer than ReadChunk goes out as
// requests of at most ReadChunk bytes, each naming the next slice of the
// remote buffer and starting at the PSN after the previous one's last
// response; it completes once, with every byte in place, and leaves no
// max_rd_atomic slot or budget byte held. max_rd_atomic bounds the
// requests outstanding, chunks counted one by one.
func TestReadSplit(t *testing.T) {
	const chunk = 4096
	for _, rd := range []uint8{1, 2, 16} {
		for _, size := range []int{chunk, chunk + 1, 50*1024 + 3} {
			o := defaultConn()
			o.rdAtomic = rd
			f, as, bs := readPair(t, o, 1, func(c *Config) { c.ReadChunk = chunk })
			a, b := as[0], bs[0]
			lmr, lbuf := a.n.reg(t, size, allAccess)
			rmr, rbuf := b.n.reg(t, size, allAccess)
			fill(rbuf, uint64(size))
			var reqs []readRequest
			outstanding, most := 0, 0
			f.tap = func(p wirePkt, pkt bth.Packet) {
				switch {
				case pkt.Info.Opcode == bth.RCReadRequest:
					h := pkt.RETH()
					reqs = append(reqs, readRequest{pkt.BTH().PSN(), h.VA(), h.DMALen()})
					outstanding++
					most = max(most, outstanding)
				case pkt.Info.Op == bth.OpReadResponse && pkt.Info.Has(bth.Last):
					outstanding--
				}
			}
			a.post(t, SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
			f.run(time.Second)
			check(t, "requester", pollAll(a.scq), want{3, WCSuccess, WCRead})
			if !bytes.Equal(lbuf, rbuf) {
				t.Fatalf("size %d: the data read differs", size)
			}
			n := (size + chunk - 1) / chunk
			if len(reqs) != n {
				t.Fatalf("size %d: %d READ requests, want %d", size, len(reqs), n)
			}
			for j, r := range reqs {
				wantLen := uint32(min(chunk, size-j*chunk))
				if r.psn != bth.PSN(o.apsn).Add(j*chunk/1024) || r.addr != rmr.IOVA()+uint64(j*chunk) || r.len != wantLen {
					t.Fatalf("size %d: request %d is psn %d addr %#x len %d, want psn %d addr %#x len %d", size, j, r.psn, r.addr, r.len,
						bth.PSN(o.apsn).Add(j*chunk/1024), rmr.IOVA()+uint64(j*chunk), wantLen)
				}
			}
			if most > int(rd) || n > 1 && rd > 1 && most < 2 {
				t.Fatalf("size %d max_rd_atomic %d: at most %d requests outstanding", size, rd, most)
			}
			if a.qp.req.rdOut != 0 || a.n.e.readOut != 0 {
				t.Fatalf("after the READ: rdOut %d, readOut %d", a.qp.req.rdOut, a.n.e.readOut)
			}
		}
	}
}

// TestReadBudget: QPs of one engine together never have more READ
// response bytes asked for and not received than ReadBudget (one chunk
// always may go); the others wait for room and are woken by the
// responses that free it, and every READ completes.
func TestReadBudget(t *testing.T) {
	const chunk, budget, size = 4096, 3 * 4096, 64 * 1024
	o := defaultConn()
	f, as, bs := readPair(t, o, 4, func(c *Config) { c.ReadChunk, c.ReadBudget = chunk, budget })
	asked, most, ticked := 0, 0, 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		switch {
		case pkt.Info.Opcode == bth.RCReadRequest:
			asked += int(pkt.RETH().DMALen())
			most = max(most, asked)
			if p.ticked {
				ticked++
			}
		case pkt.Info.Op == bth.OpReadResponse:
			asked -= len(pkt.Payload())
		}
	}
	type mem struct{ l, r []byte }
	var bufs []mem
	for i := range as {
		lmr, lbuf := as[i].n.reg(t, size, allAccess)
		rmr, rbuf := bs[i].n.reg(t, size, allAccess)
		fill(rbuf, uint64(i))
		bufs = append(bufs, mem{lbuf, rbuf})
		as[i].post(t, SendWR{ID: uint64(i), Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
	}
	f.run(time.Second)
	for i, a := range as {
		check(t, "requester", pollAll(a.scq), want{uint64(i), WCSuccess, WCRead})
		if !bytes.Equal(bufs[i].l, bufs[i].r) {
			t.Fatalf("QP %d: the data read differs", i)
		}
	}
	if most > budget {
		t.Fatalf("%d READ response bytes outstanding at most, budget %d", most, budget)
	}
	e := as[0].n.e
	if e.Stats.ReadBudgetWaits.Load() == 0 || e.readOut != 0 || len(e.readWait) != 0 {
		t.Fatalf("read_budget_waits %d, readOut %d, waiting %d", e.Stats.ReadBudgetWaits.Load(), e.readOut, len(e.readWait))
	}
	// Room freed by responses lets the waiting QPs ask in the same input
	// batch, not from a timer (a wake-up of the timer goroutine and a
	// send of its own on a device).
	if ticked != 0 {
		t.Errorf("%d READ requests sent from the timers, want 0 (no loss)", ticked)
	}
}

// TestReadRetryAsksForTheRest: a READ response lost in the middle of a
// chunk makes the requester ask again from the first missing byte to the
// end of that chunk, then for the later chunks it had asked for (their
// responses were discarded behind the gap), never for the whole message.
func TestReadRetryAsksForTheRest(t *testing.T) {
	const chunk, size = 8192, 32 * 1024
	o := defaultConn()
	f, as, bs := readPair(t, o, 1, func(c *Config) { c.ReadChunk = chunk })
	a, b := as[0], bs[0]
	lmr, lbuf := a.n.reg(t, size, allAccess)
	rmr, rbuf := b.n.reg(t, size, allAccess)
	fill(rbuf, 5)
	lost := bth.PSN(o.apsn).Add(6) // the 7th response: chunk 0, 6 KiB in
	dropped := false
	f.drop = func(p wirePkt) bool {
		pkt := parse(t, p)
		if !dropped && pkt.Info.Op == bth.OpReadResponse && pkt.BTH().PSN() == lost {
			dropped = true
			return true
		}
		return false
	}
	var reqs []readRequest
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Opcode == bth.RCReadRequest {
			h := pkt.RETH()
			reqs = append(reqs, readRequest{pkt.BTH().PSN(), h.VA(), h.DMALen()})
		}
	}
	a.post(t, SendWR{ID: 1, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCRead})
	if !bytes.Equal(lbuf, rbuf) {
		t.Fatal("the data read differs")
	}
	var retry *readRequest
	for i := range reqs {
		if reqs[i].psn == lost {
			retry = &reqs[i]
		}
		if reqs[i].len > chunk {
			t.Fatalf("request %d asks for %d bytes, more than a chunk", i, reqs[i].len)
		}
	}
	if retry == nil || retry.addr != rmr.IOVA()+6*1024 || retry.len != chunk-6*1024 {
		t.Fatalf("no retry from the first missing byte to the chunk's end among %+v", reqs)
	}
}
