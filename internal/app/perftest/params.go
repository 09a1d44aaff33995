package perftest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// Test names one perftest program, e.g. WriteBW for ib_write_bw.
type Test string

// The tests rxego speaks.
const (
	SendBW    Test = "send_bw"
	WriteBW   Test = "write_bw"
	ReadBW    Test = "read_bw"
	AtomicBW  Test = "atomic_bw"
	SendLat   Test = "send_lat"
	WriteLat  Test = "write_lat"
	ReadLat   Test = "read_lat"
	AtomicLat Test = "atomic_lat"
)

// Tests lists every test in a stable order.
var Tests = []Test{SendBW, WriteBW, ReadBW, AtomicBW, SendLat, WriteLat, ReadLat, AtomicLat}

// verb is perftest's VerbType: which operation a test measures.
type verb int

const (
	send verb = iota
	write
	read
	atomic
)

// verbNames are perftest's testsStr, used in the printed title.
var verbNames = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

func (t Test) verb() verb {
	switch t {
	case SendBW, SendLat:
		return send
	case WriteBW, WriteLat:
		return write
	case ReadBW, ReadLat:
		return read
	}
	return atomic
}

// Lat reports whether t is a latency test.
func (t Test) Lat() bool {
	switch t {
	case SendLat, WriteLat, ReadLat, AtomicLat:
		return true
	}
	return false
}

// Valid reports whether t is one of Tests.
func (t Test) Valid() bool {
	for _, x := range Tests {
		if t == x {
			return true
		}
	}
	return false
}

// AtomicOp is the -A choice of the atomic tests, spelled as perftest does.
type AtomicOp string

// Atomic operations.
const (
	FetchAndAdd AtomicOp = "FETCH_AND_ADD"
	CmpAndSwap  AtomicOp = "CMP_AND_SWAP"
)

// The operands perftest uses (ATOMIC_ADD_VALUE, ATOMIC_SWAP_VALUE; the
// compare value of CMP_AND_SWAP stays 0 from a zeroed work request).
const (
	atomicAdd     = 1
	atomicCompare = 0
	atomicSwap    = 0
)

// perftest's defaults and limits (perftest_parameters.h).
const (
	DefaultPort     = 18515
	defSizeBW       = 65536
	defSizeLat      = 2
	atomicSize      = 8
	defIters        = 1000
	defItersWriteBW = 5000
	minIters        = 5
	defTxBW         = 128
	defRxSend       = 512
	defCQMod        = 100
	cqModSizeLimit  = 8192    // MSG_SIZE_CQ_MOD_LIMIT: larger messages signal every WR
	maxSize         = 8388608 // MAX_SIZE: the largest -a size, and the buffer -a allocates for
	noPeakIters     = 20000   // beyond this many iterations perftest skips the peak
	defCacheLine    = 64
	defQPTimeout    = 14
	minRNRTimer     = 12
	maxQPs          = 16384
)

// Config mirrors perftest's flags. The zero value of a field means
// perftest's default for the test.
type Config struct {
	Test   Test
	Atomic AtomicOp // -A, atomic tests only; default FETCH_AND_ADD
	// Local is rxego's RoCE address (its GID as an IP address); default
	// the local address of the TCP exchange, as rxe's IPv4 GID would be.
	Local    netip.Addr
	Server   string // peer to connect to; empty: wait for a client
	Port     int    // -p, TCP port of the exchange
	Size     int    // -s
	All      bool   // -a: every size from 2 to 8 MiB
	Iters    int    // -n
	MTU      int    // -m in bytes; default 1024 (the port MTU rxe has on a 1500-byte link)
	NumQPs   int    // -q, BW tests only
	TxDepth  int    // -t
	RxDepth  int    // -r, SEND tests
	OutReads int    // -o, READ and atomic tests; default 128, rxe's maximum too
	Timeout  time.Duration
	Out      io.Writer // results, in perftest's format
	// Listener, when set, is used by a server instead of listening on Port.
	Listener net.Listener
	// Device, when set, is used instead of opening one on Local.
	Device *rxego.Device
	// DeviceOptions are the options of the device Run opens when Device
	// is nil (nil: the defaults), e.g. the data packets' IP TOS (-T).
	DeviceOptions *rxego.Options
	// GIDIndex is the Device's GID the QPs send from and the exchange
	// names (perftest's -x index; needs Device; 0: Open's address).
	GIDIndex int
	// KeepDevice leaves the device Run opens open (Result.Device), for
	// counters that settle after the run; the caller closes it.
	KeepDevice bool
	// Hold, when set, is called at the final synchronisation point, while
	// the peer is blocked waiting for rxego, with what rxego knows the
	// peer's memory must hold then (see PeerCheck). Tests read the peer's
	// memory there. Not called by write_lat, whose peer ends without a
	// final synchronisation.
	Hold func([]PeerCheck) error
	// RDMACM is perftest's -R: the exchange and the data QPs connect with
	// rdma_cm (package cm) instead of TCP and a modify. Local (or Device)
	// is then required, an IPv4 address as perftest's rdma_cm exchange is
	// IPv4 only, and Server must name an IPv4 address.
	RDMACM bool
	// CMConfig tunes the connection manager of an RDMACM run (nil: rdma_cm's values).
	CMConfig *cm.Config
	// Seed makes the fill pattern of rxego's buffer reproducible; 0 picks
	// one at random.
	Seed uint64

	// CQMod is -Q: a completion is requested for every CQMod-th work
	// request (0: perftest's 100, at most the tx depth; 1 above 8 KiB).
	CQMod int
	// PostList is -l: work requests handed over in one PostSend (0: 1).
	// With PostList > 1 and no CQMod, the last of each list is signalled.
	PostList int
	// QPTimeout is -u: the ACK timeout exponent of the QPs (4.096 us x
	// 2^QPTimeout; 0 waits forever); nil means perftest's 14.
	QPTimeout *uint8
	// Events is -e: sleep on completion events instead of polling. rxego
	// always sleeps in CQ.PollWait once the device's busy-poll spin (if
	// any) found nothing, so this changes nothing but is checked as
	// perftest checks it (not with Duration).
	Events bool
	// Duration is -D: a BW client posts for this long instead of Iters
	// work requests per QP, and reports what completed between Margin
	// after the start and Margin before the end; no BW peak then.
	Duration time.Duration
	// Margin is -f: see Duration (0: perftest's 2 s).
	Margin time.Duration
	// RunInfinitely is --run_infinitely: a BW client posts until ctx ends
	// and prints a report line every Duration (0: perftest's 5 s).
	RunInfinitely bool
	// ReportGbits is --report_gbits: bandwidth in Gb/s (10^9 bits) instead
	// of MB/s (2^20 bytes).
	ReportGbits bool
	// Bidirectional is -b: both sides post (write_bw and read_bw), each
	// measures its own work requests and prints the sum of both reports.
	// The peer must be run with -b too.
	Bidirectional bool
}

// Defaults of the timed modes (perftest's DEF_DURATION and
// DEF_INIT_MARGIN).
const (
	defDuration = 5 * time.Second
	defMargin   = 2 * time.Second
)

// maxPeakWRs bounds the work requests whose post and completion times a BW
// run keeps to compute the peak (two timestamps each); beyond it, or
// beyond noPeakIters per QP, the peak is not measured, with perftest's
// warning.
const maxPeakWRs = 1 << 22

// maxLatIters bounds a latency test's iterations: one timestamp each
// (128 MiB at most).
const maxLatIters = 1 << 24

// noPeakWarning is what perftest prints when it will not measure the BW
// peak.
const noPeakWarning = " WARNING: BW peak won't be measured in this run.\n"

// normalised holds the values a run actually uses after perftest's
// defaults and its dependency rules (force_dependecies).
type normalised struct {
	Config
	mtu   rxego.MTU
	cqMod int
	// postList is PostList, at least 1.
	postList int
	// noPeak says the BW peak is not measured (a timed run, or too many
	// work requests to keep the times of).
	noPeak bool
	// serverAddr is Server resolved, for an RDMACM client.
	serverAddr netip.Addr
}

// normalise applies perftest's defaults and rules to c.
func normalise(c Config) (normalised, error) {
	n := normalised{Config: c}
	if !c.Test.Valid() {
		return n, fmt.Errorf("perftest: unknown test %q (want one of %v)", c.Test, Tests)
	}
	v := c.Test.verb()
	if n.Port == 0 {
		n.Port = DefaultPort
	}
	if n.Port < 0 || n.Port > 65535 {
		return n, fmt.Errorf("perftest: port %d", n.Port)
	}
	if v == atomic {
		if n.Atomic == "" {
			n.Atomic = FetchAndAdd
		}
		if n.Atomic != FetchAndAdd && n.Atomic != CmpAndSwap {
			return n, fmt.Errorf("perftest: -A %q: want %s or %s", n.Atomic, CmpAndSwap, FetchAndAdd)
		}
		if n.All || (n.Size != 0 && n.Size != atomicSize) {
			return n, errors.New("perftest: message size cannot be changed for atomic tests (8 bytes; no -a)")
		}
		n.Size = atomicSize
	} else if n.Atomic != "" {
		return n, errors.New("perftest: -A is for the atomic tests only")
	}
	switch {
	case n.Size == 0 && c.Test.Lat():
		n.Size = defSizeLat
	case n.Size == 0:
		n.Size = defSizeBW
	}
	if n.Size < 1 || n.Size > maxSize {
		return n, fmt.Errorf("perftest: size %d: want 1 to %d", n.Size, maxSize)
	}
	if n.Iters == 0 {
		n.Iters = defIters
		if c.Test == WriteBW {
			n.Iters = defItersWriteBW
		}
	}
	if n.Iters < minIters || n.Iters > 100_000_000 {
		return n, fmt.Errorf("perftest: iterations %d: want %d to 100000000", n.Iters, minIters)
	}
	if c.Test.Lat() && n.Iters > maxLatIters {
		return n, fmt.Errorf("perftest: iterations %d: a latency test keeps one timestamp per iteration, at most %d", n.Iters, maxLatIters)
	}
	if n.NumQPs == 0 {
		n.NumQPs = 1
	}
	if c.Test.Lat() && n.NumQPs != 1 {
		return n, errors.New("perftest: multiple QPs only available on bw tests")
	}
	if n.NumQPs < 1 || n.NumQPs > maxQPs {
		return n, fmt.Errorf("perftest: %d QPs: want 1 to %d", n.NumQPs, maxQPs)
	}
	if n.MTU == 0 {
		n.MTU = 1024
	}
	m, ok := rxego.MTUFromBytes(n.MTU)
	if !ok {
		return n, fmt.Errorf("perftest: MTU %d is not 256, 512, 1024, 2048 or 4096", n.MTU)
	}
	n.mtu = m
	if n.TxDepth == 0 {
		n.TxDepth = defTxBW
		if c.Test.Lat() {
			n.TxDepth = 1
		}
	}
	if n.TxDepth < 1 || n.TxDepth > 15000 {
		return n, fmt.Errorf("perftest: tx depth %d: want 1 to 15000", n.TxDepth)
	}
	n.TxDepth = min(n.TxDepth, n.Iters)
	if n.RxDepth == 0 {
		n.RxDepth = 1
		if v == send {
			n.RxDepth = defRxSend
		}
	}
	if n.RxDepth < 1 || n.RxDepth > 16384 {
		return n, fmt.Errorf("perftest: rx depth %d: want 1 to 16384", n.RxDepth)
	}
	if v == send {
		n.RxDepth = min(n.RxDepth, n.Iters)
		if n.RxDepth%2 == 1 && !n.All { // perftest's work-around for odd SEND rx depths
			n.RxDepth++
		}
	}
	if v == read || v == atomic {
		if n.OutReads == 0 {
			n.OutReads = rxego.MaxRdAtomicLimit
		}
		if n.OutReads < 1 || n.OutReads > rxego.MaxRdAtomicLimit {
			return n, fmt.Errorf("perftest: outstanding reads %d: want 1 to %d", n.OutReads, rxego.MaxRdAtomicLimit)
		}
	} else {
		n.OutReads = 1
	}
	if err := n.checkModes(); err != nil {
		return n, err
	}
	if n.Timeout == 0 {
		n.Timeout = 2 * time.Minute
	}
	if n.Out == nil {
		n.Out = io.Discard
	}
	if n.Seed == 0 {
		n.Seed = randomSeed()
	}
	if n.RDMACM {
		if err := n.checkRDMACM(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// checkModes applies and checks -Q, -l, -u, -e, -D, --run_infinitely and
// -b, as perftest's force_dependecies does.
func (n *normalised) checkModes() error {
	lat := n.Test.Lat()
	if lat && (n.CQMod != 0 || n.PostList > 1 || n.Duration != 0 || n.RunInfinitely || n.Bidirectional) {
		return errors.New("perftest: -Q, -l, -D, --run_infinitely and -b are for the BW tests")
	}
	n.postList = max(n.PostList, 1)
	if n.PostList < 0 || n.postList > n.TxDepth {
		return fmt.Errorf("perftest: post list %d: want 1 to the tx depth (%d)", n.PostList, n.TxDepth)
	}
	switch {
	case n.CQMod != 0:
		if n.CQMod < 1 || n.CQMod > n.TxDepth {
			return fmt.Errorf("perftest: CQ moderation %d: want 1 to the tx depth (%d)", n.CQMod, n.TxDepth)
		}
		n.cqMod = n.CQMod
	case n.postList > 1:
		n.cqMod = n.postList
	default:
		n.cqMod = min(defCQMod, n.TxDepth)
		if n.Size > cqModSizeLimit && !n.All {
			n.cqMod = 1
		}
	}
	if n.postList > 1 && n.postList%n.cqMod != 0 {
		return fmt.Errorf("perftest: post list %d must be a multiple of the CQ moderation %d", n.postList, n.cqMod)
	}
	timed := n.Duration != 0 || n.RunInfinitely
	if !timed && n.Iters%n.postList != 0 {
		return fmt.Errorf("perftest: iterations %d must be a multiple of the post list %d", n.Iters, n.postList)
	}
	if n.QPTimeout != nil && *n.QPTimeout > 31 {
		return fmt.Errorf("perftest: QP timeout %d: want 0 to 31", *n.QPTimeout)
	}
	if n.Duration < 0 || n.Margin < 0 {
		return errors.New("perftest: negative duration or margin")
	}
	if timed {
		if n.Events {
			return errors.New("perftest: duration mode doesn't work with events (-e)")
		}
		if n.All {
			return errors.New("perftest: duration mode doesn't support running on all sizes (-a)")
		}
		if n.RunInfinitely && n.Bidirectional {
			return errors.New("perftest: --run_infinitely runs one way only (no -b)")
		}
		if n.Margin == 0 {
			n.Margin = defMargin
		}
		if n.RunInfinitely && n.Duration == 0 {
			n.Duration = defDuration
		}
		if !n.RunInfinitely && n.Duration <= 2*n.Margin {
			return fmt.Errorf("perftest: duration %v must be longer than twice the margin %v (-f)", n.Duration, n.Margin)
		}
	}
	if timed && n.Test.verb() == send {
		return errors.New("perftest: rxego runs -D and --run_infinitely on write_bw, read_bw and atomic_bw (a SEND server must know the count)")
	}
	if n.Bidirectional && n.Test != WriteBW && n.Test != ReadBW {
		return fmt.Errorf("perftest: -b: rxego runs write_bw and read_bw bidirectionally, not %s", n.Test)
	}
	n.noPeak = !lat && (timed || n.Iters > noPeakIters || n.Iters*n.NumQPs > maxPeakWRs)
	return nil
}

// sizes returns the message sizes a run goes through: the one size, or
// with -a every power of two from 2 to 8 MiB.
func (n *normalised) sizes() []int {
	if !n.All {
		return []int{n.Size}
	}
	var s []int
	for i := 1; i < 24; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// bufSizeFor is the size perftest's buffer layout is computed from
// (ctx->size): MAX_SIZE with -a.
func (n *normalised) bufSizeFor() int {
	if n.All {
		return maxSize
	}
	return n.Size
}

// checkRDMACM checks what -R needs: rxego's own address and the server's,
// both IPv4 (perftest's rdma_cm exchange resolves AF_INET only).
func (n *normalised) checkRDMACM() error {
	local := n.Local
	if n.Device != nil {
		local = n.Device.Addr().Addr()
	}
	if !local.IsValid() {
		return errors.New("perftest: -R needs rxego's RoCE address (Config.Local)")
	}
	if !local.Unmap().Is4() {
		return fmt.Errorf("perftest: -R runs over IPv4 only (perftest's rdma_cm exchange is AF_INET); %v is not", local)
	}
	if n.Server == "" {
		return nil
	}
	a, err := ResolveIPv4(n.Server)
	n.serverAddr = a
	return err
}

// ResolveIPv4 returns an IPv4 address of host (an address or a name), as
// perftest's rdma_cm mode resolves its server (AF_INET only).
func ResolveIPv4(host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		if a = a.Unmap(); !a.Is4() {
			return netip.Addr{}, fmt.Errorf("perftest: -R runs over IPv4; %v is not an IPv4 address", a)
		}
		return a, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("perftest: resolving %s: %w", host, err)
	}
	for _, ip := range ips {
		if ip4 := ip.To4(); ip4 != nil {
			return netip.AddrFrom4([4]byte(ip4)), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("perftest: %s has no IPv4 address (-R runs over IPv4)", host)
}

// Check applies perftest's defaults and rules to c and reports whether
// the run is possible, before anything is opened or allocated.
func (c Config) Check() error {
	_, err := normalise(c)
	return err
}
