package probe

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestArrivalTime: a packet's arrival time is when the kernel received it,
// not when the probe got round to reading it, so a reader held up on a
// loaded host does not shorten the intervals the probe judges (a resend
// after the ACK timeout measured as one after half a millisecond).
func TestArrivalTime(t *testing.T) {
	addr := netip.AddrPortFrom(testaddr.Loopback(), 0)
	rx, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := stampArrivals(rx); err != nil {
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	// Linux turns receive timestamping on for the stack a little after
	// the first socket asks (a deferred static key); until then it stamps
	// at the read. So a few tries, each a packet held in the socket.
	const held = 30 * time.Millisecond
	var read time.Time
	for try := 0; ; try++ {
		before := time.Now()
		if _, err := tx.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(held)
		oob := arrivalOOB()
		_, oobn, _, _, err := rx.ReadMsgUDPAddrPort(make([]byte, 16), oob)
		if err != nil {
			t.Fatal(err)
		}
		read = time.Now()
		at := arrivalTime(oob[:oobn])
		if !at.Before(before) && read.Sub(at) >= held {
			break
		}
		if try == 9 {
			t.Fatalf("arrival %v after sending, read %v after arrival; want the kernel's time: at most %v after sending, at least %v before the read",
				at.Sub(before), read.Sub(at), read.Sub(before)-held, held)
		}
	}
	if got := arrivalTime(nil); got.Before(read) {
		t.Errorf("without a timestamp: %v, want now (after %v)", got, read)
	}
}
