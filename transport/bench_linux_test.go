package transport

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// benchBatch is how many packets each Send call carries.
const benchBatch = 64

// BenchmarkLoopback measures packets per second from one Conn to another
// over lo: batched sendmmsg/recvmmsg, with and without GSO and GRO, in
// socket and raw receive mode, and one packet per system call for
// comparison. Every packet's ICRC is computed and checked. The sender
// keeps at most a socket buffer's worth of packets in flight so that
// nothing is lost.
func BenchmarkLoopback(b *testing.B) {
	for _, size := range []int{1024, 4096} {
		for _, bc := range []struct {
			name         string
			send, recv   Options
			gso, privile bool
		}{
			{"single", Options{NoGSO: true, BatchSize: 1}, Options{NoGRO: true, BatchSize: 1}, false, false},
			{"batch", Options{NoGSO: true}, Options{NoGRO: true}, false, false},
			{"gso", Options{}, Options{NoGRO: true}, true, false},
			{"gso+gro", Options{}, Options{}, true, false},
			{"raw-batch", Options{NoGSO: true}, Options{Mode: RecvRaw}, false, true},
			{"raw-gso", Options{}, Options{Mode: RecvRaw}, true, true},
		} {
			b.Run(strconv.Itoa(size)+"/"+bc.name, func(b *testing.B) {
				if bc.privile {
					needCaps(b, capNetRaw)
				}
				benchLoopback(b, size, bc.send, bc.recv, bc.gso)
			})
		}
	}
}

func benchLoopback(b *testing.B, size int, sopts, ropts Options, gso bool) {
	a := listenAny(b, "127.0.0.1", sopts)
	r := listenAny(b, "127.0.0.2", ropts)
	window := int64(recvBuffer(r) / (2 * (size + 1024)))
	window = max(16, min(window, 4096))
	batch := benchBatch
	if sopts.BatchSize == 1 {
		batch = 1
	}
	var msgs []Message
	if gso {
		run := min(MaxSegments, 65000/size)
		for left := batch; left > 0; left -= run {
			k := min(run, left)
			var buf []byte
			for i := range k {
				buf = append(buf, rocePacket(size, uint32(i))...)
			}
			msgs = append(msgs, Message{Buf: buf, Peer: r.LocalAddr(), Seg: size})
		}
	} else {
		for i := range batch {
			msgs = append(msgs, Message{Buf: rocePacket(size, uint32(i)), Peer: r.LocalAddr()})
		}
	}
	total := int64((b.N + batch - 1) / batch * batch)
	var received atomic.Int64
	credit := make(chan struct{}, 1) // the receiver made progress
	done := make(chan error, 1)
	go func() {
		buf := make([]Message, 64)
		for received.Load() < total {
			n, err := r.Recv(buf)
			if err != nil {
				done <- err
				return
			}
			received.Add(int64(n))
			select {
			case credit <- struct{}{}:
			default:
			}
		}
		done <- nil
	}()
	stuck := time.NewTimer(time.Hour)
	defer stuck.Stop()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	for sent := int64(0); sent < total; sent += int64(batch) {
		for sent-received.Load() > window {
			stuck.Reset(5 * time.Second)
			select {
			case <-credit:
			case <-stuck.C:
				b.Fatalf("receiver stuck at %d of %d sent: %+v", received.Load(), sent, r.Stats())
			}
		}
		if k, err := a.Send(msgs); k != len(msgs) {
			b.Fatalf("Send = %d, %v", k, err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			b.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		b.Fatalf("received %d of %d: %+v", received.Load(), total, r.Stats())
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(total), "cpu-ns/pkt")
	sa, sr := a.Stats(), r.Stats()
	b.ReportMetric(float64(total)/el.Seconds(), "pkts/s")
	b.ReportMetric(float64(sa.SendCalls)/float64(total), "sendcalls/pkt")
	b.ReportMetric(float64(sr.RecvCalls)/float64(total), "recvcalls/pkt")
	if sr.Dropped() != 0 {
		b.Fatalf("drops: %+v", sr.Drops)
	}
}

// cpuTime returns the user and system CPU time the process has used:
// unlike wall time it hardly depends on what else the machine runs.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// recvBuffer returns the receive socket buffer the kernel granted.
func recvBuffer(c Conn) int {
	u := c.(*udpConn)
	rc := u.rc
	if u.rrc != nil {
		rc = u.rrc
	}
	size := 208 << 10
	rc.Control(func(fd uintptr) {
		if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF); err == nil {
			size = v / 2 // the kernel doubles it for bookkeeping
		}
	})
	return size
}

// BenchmarkPipe measures the in-memory network.
func BenchmarkPipe(b *testing.B) {
	n := NewPipeNetwork()
	a, r := pipePair(b, n, "10.0.0.1:4791", "10.0.0.2:4791")
	msgs := make([]Message, benchBatch)
	for i := range msgs {
		msgs[i] = Message{Buf: rocePacket(1024, uint32(i)), Peer: r.LocalAddr()}
	}
	buf := make([]Message, benchBatch)
	b.SetBytes(1024)
	b.ReportAllocs()
	for b.Loop() {
		a.Send(msgs)
		for got := 0; got < benchBatch; {
			k, _ := r.Recv(buf)
			got += k
		}
	}
}

// BenchmarkVerify compares the per-packet check of the two receive modes:
// socket mode recovers the IPv4 ID, raw mode checks with the known ID.
func BenchmarkVerify(b *testing.B) {
	ep := newEndpoint(netipMustAP("127.0.0.2:4791"))
	peer := netipMustAP("127.0.0.1:4791")
	for _, size := range []int{64, 1024, 4096} {
		// ID 0 is found by the first try; a GSO segment's ID needs the
		// recovery proper.
		for _, id := range []uint16{0, 5} {
			p := rocePacket(size, 1)
			ep2 := newEndpoint(peer)
			ep2.fill(p, ep.local, id)
			name := strconv.Itoa(size) + "/id" + strconv.Itoa(int(id))
			b.Run("recover/"+name, func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, got, _, ok := ep.recover(p, peer, ep.inbound(peer), 0); !ok || got != id {
						b.Fatal("bad")
					}
				}
			})
			b.Run("check/"+name, func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, _, ok := ep.check(p, peer, id); !ok {
						b.Fatal("bad")
					}
				}
			})
		}
	}
}
