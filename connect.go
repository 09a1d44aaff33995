package rxego

import (
	"net/netip"

	"github.com/rxego/rxego/qp"
)

// RemoteQP is what one side of a connection learns of the other out of
// band: what ibv_rc_pingpong and perftest exchange over TCP.
type RemoteQP struct {
	Addr netip.AddrPort // the peer device's address (its GID) and UDP port
	QPN  uint32
	PSN  uint32 // the peer's starting send PSN
	QKey uint32 // UD only
	// SGIDIndex is the local GID the connection's packets leave from (the
	// sgid_index of ibv_ah_attr's GRH; see Device.QueryGID). 0 is Open's
	// address.
	SGIDIndex int
}

// ConnectOptions tune QP.Connect (RC and UC).
//
// Every verbs value can be expressed. Start from DefaultConnectOptions,
// which sets Exact, and change what you need: each field is then used as
// it is, zeros included (rnr_retry 0 fails at the first RNR NAK, timeout
// 0 waits forever):
//
//	o := rxego.DefaultConnectOptions()
//	o.RNRRetry, o.Timeout = 0, 0
//	err := q.Connect(remote, &o)
//
// In a ConnectOptions without Exact (a literal naming a few fields, as
// &rxego.ConnectOptions{LocalPSN: psn, Timeout: 12}), a zero MTU, Timeout,
// RetryCnt, RNRRetry, MinRNRTimer, MaxRdAtomic or Access stands for its
// default, so such a literal changes only the fields it names. LocalPSN
// and TrafficClass are always used as given. A nil *ConnectOptions means
// the defaults.
//
// RetryCnt 7 retries a lost packet forever, as rdma_rxe does (rxe's rule;
// on ConnectX 7 is seven retries and then RETRY_EXC_ERR): with the
// default, a peer that has gone away never fails the QP, it keeps
// resending. Give RetryCnt 1 to 6 to have such work fail with
// RETRY_EXC_ERR after that many retransmissions. RNRRetry 7 is "forever"
// on every device. docs/rnic.md and docs/reliability.md give the timings.
type ConnectOptions struct {
	MTU          MTU    // path_mtu (default MTU 1024)
	LocalPSN     uint32 // sq_psn, this side's first send PSN
	Timeout      uint8  // local ACK timeout: 4.096 us << Timeout, 0 infinite (default 14)
	RetryCnt     uint8  // retry_cnt, 7 infinite (default 7): see below
	RNRRetry     uint8  // rnr_retry, 7 infinite (default 7)
	MinRNRTimer  uint8  // min_rnr_timer, the IB RNR timer code (default 12)
	MaxRdAtomic  uint8  // max_rd_atomic and max_dest_rd_atomic (default 1)
	Access       Access // qp_access_flags (default: local write and all remote access)
	TrafficClass uint8  // the IP TOS of the QP's packets (0 unless set)
	// Exact makes every field count as given, zeros included.
	Exact bool
}

// DefaultConnectOptions returns the defaults of ibv_rc_pingpong, with
// Exact set: MTU 1024, timeout 14, retry_cnt 7, rnr_retry 7,
// min_rnr_timer 12, one outstanding READ or atomic, all remote access.
func DefaultConnectOptions() ConnectOptions {
	return ConnectOptions{MTU: qp.MTU1024, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1,
		Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic, Exact: true}
}

// withDefaults returns the options to use: o itself when Exact, else o
// with its zero fields (those with a default) filled in.
func (o *ConnectOptions) withDefaults() ConnectOptions {
	c := DefaultConnectOptions()
	if o == nil {
		return c
	}
	if o.Exact {
		return *o
	}
	pick := func(v, def uint8) uint8 {
		if v != 0 {
			return v
		}
		return def
	}
	if o.MTU != 0 {
		c.MTU = o.MTU
	}
	c.LocalPSN = o.LocalPSN
	c.Timeout = pick(o.Timeout, c.Timeout)
	c.RetryCnt = pick(o.RetryCnt, c.RetryCnt)
	c.RNRRetry = pick(o.RNRRetry, c.RNRRetry)
	c.MinRNRTimer = pick(o.MinRNRTimer, c.MinRNRTimer)
	c.MaxRdAtomic = pick(o.MaxRdAtomic, c.MaxRdAtomic)
	if o.Access != 0 {
		c.Access = o.Access
	}
	c.TrafficClass = o.TrafficClass
	return c
}
