package qp

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// Type is a QP transport type (ibv_qp_type values).
type Type uint8

// QP types.
const (
	RC Type = 2
	UC Type = 3
	UD Type = 4
)

// class is the transport class of t's opcodes.
func (t Type) class() bth.Class {
	switch t {
	case UC:
		return bth.UC
	case UD:
		return bth.UD
	}
	return bth.RC
}

// String returns "RC", "UC" or "UD".
func (t Type) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return "QPT_" + strconv.Itoa(int(t))
}

// State is a QP state (ibv_qp_state values).
type State uint8

// QP states.
const (
	Reset State = 0
	Init  State = 1
	RTR   State = 2
	RTS   State = 3
	SQD   State = 4
	SQE   State = 5
	Err   State = 6
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns the state's verbs name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "STATE_" + strconv.Itoa(int(s))
}

// MTU is a path MTU in ibv_mtu encoding: 1=256, 2=512, 3=1024, 4=2048, 5=4096.
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 when invalid.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// ActiveMTU returns the largest path MTU whose packets fit an interface
// MTU of ifMTU bytes, as rxe derives a port's active_mtu from its netdev
// (eth_mtu_int_to_enum: 80 bytes for the IP, UDP, BTH and extended
// headers and the ICRC): 1500 gives MTU1024, 4176 and more (loopback's
// 65536) MTU4096. It is 0 below 336 bytes, where not even MTU256 fits.
func ActiveMTU(ifMTU int) MTU {
	var best MTU
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes()+activeMTUHeaders <= ifMTU {
			best = m
		}
	}
	return best
}

// activeMTUHeaders is rxe's RXE_MAX_HDR_LENGTH.
const activeMTUHeaders = 80

// MTUFromBytes returns the ibv_mtu for 256, 512, 1024, 2048 or 4096.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// AttrMask selects the fields of Attr a Modify call sets (ibv_qp_attr_mask).
type AttrMask uint32

// Attribute mask bits, numbered as ibv_qp_attr_mask.
const (
	AttrState           AttrMask = 1 << 0
	AttrCurState        AttrMask = 1 << 1
	AttrEnSQDAsyncNotif AttrMask = 1 << 2
	AttrAccessFlags     AttrMask = 1 << 3
	AttrPKeyIndex       AttrMask = 1 << 4
	AttrPort            AttrMask = 1 << 5
	AttrQKey            AttrMask = 1 << 6
	AttrAV              AttrMask = 1 << 7
	AttrPathMTU         AttrMask = 1 << 8
	AttrTimeout         AttrMask = 1 << 9
	AttrRetryCnt        AttrMask = 1 << 10
	AttrRNRRetry        AttrMask = 1 << 11
	AttrRQPSN           AttrMask = 1 << 12
	AttrMaxQPRdAtomic   AttrMask = 1 << 13
	AttrAltPath         AttrMask = 1 << 14
	AttrMinRNRTimer     AttrMask = 1 << 15
	AttrSQPSN           AttrMask = 1 << 16
	AttrMaxDestRdAtomic AttrMask = 1 << 17
	AttrPathMigState    AttrMask = 1 << 18
	AttrCap             AttrMask = 1 << 19
	AttrDestQPN         AttrMask = 1 << 20
)

// attrMaskNames are ibv_qp_attr_mask's names, by bit.
var attrMaskNames = [...]string{"IBV_QP_STATE", "IBV_QP_CUR_STATE", "IBV_QP_EN_SQD_ASYNC_NOTIFY",
	"IBV_QP_ACCESS_FLAGS", "IBV_QP_PKEY_INDEX", "IBV_QP_PORT", "IBV_QP_QKEY", "IBV_QP_AV", "IBV_QP_PATH_MTU",
	"IBV_QP_TIMEOUT", "IBV_QP_RETRY_CNT", "IBV_QP_RNR_RETRY", "IBV_QP_RQ_PSN", "IBV_QP_MAX_QP_RD_ATOMIC",
	"IBV_QP_ALT_PATH", "IBV_QP_MIN_RNR_TIMER", "IBV_QP_SQ_PSN", "IBV_QP_MAX_DEST_RD_ATOMIC",
	"IBV_QP_PATH_MIG_STATE", "IBV_QP_CAP", "IBV_QP_DEST_QPN"}

// String names the mask's bits as ibv_qp_attr_mask does, joined with
// "|" ("IBV_QP_AV|IBV_QP_PATH_MTU"); a bit verbs does not define shows as
// a number.
func (m AttrMask) String() string {
	if m == 0 {
		return "0"
	}
	var names []string
	for i := range 32 {
		bit := AttrMask(1) << i
		if m&bit == 0 {
			continue
		}
		if i < len(attrMaskNames) {
			names = append(names, attrMaskNames[i])
		} else {
			names = append(names, fmt.Sprintf("%#x", uint32(bit)))
		}
	}
	return strings.Join(names, "|")
}

// String returns the MTU as IBV_MTU_256 .. IBV_MTU_4096, or the number
// when it is none of them.
func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return "IBV_MTU_" + strconv.Itoa(b)
	}
	return "MTU(" + strconv.Itoa(int(m)) + ")"
}

// Attr is the modifiable state of a QP (ibv_qp_attr).
type Attr struct {
	State           State
	CurState        State
	PathMTU         MTU
	QKey            uint32
	RQPSN           uint32
	SQPSN           uint32
	DestQPN         uint32
	AccessFlags     mr.Access // remote access this QP's responder allows
	PKeyIndex       uint16
	Port            uint8
	Timeout         uint8 // local ACK timeout: 4.096 us * 2^Timeout, 0 = infinite
	RetryCnt        uint8 // 0..7, 7 = retry forever
	RNRRetry        uint8 // 0..7, 7 = retry forever
	MinRNRTimer     uint8 // 0..31, index into the RNR timer table
	MaxRdAtomic     uint8 // READ/atomic requests this QP may have outstanding
	MaxDestRdAtomic uint8 // READ/atomic requests this QP accepts outstanding
	// Dest is the remote port's address (its GID as an IP address) and UDP
	// port: the address vector of an RC or UC QP.
	Dest         netip.AddrPort
	TrafficClass uint8
	HopLimit     uint8
}

// Limits on attribute values.
const (
	// MaxRdAtomicLimit is the largest max_rd_atomic and max_dest_rd_atomic
	// accepted (rxe advertises 128).
	MaxRdAtomicLimit = 128
)

// ErrInvalidModify is returned for an attribute change ibv_modify_qp would
// refuse with EINVAL; the wrapped message says which rule it broke.
var ErrInvalidModify = errors.New("qp: invalid modify")

type transition struct{ from, to State }

type transitionRule struct {
	required map[Type]AttrMask
	optional map[Type]AttrMask
}

// rules is the QP state transition table of IBTA 11.2.4.2 as the kernel's
// ib_modify_qp_is_ok encodes it (for RC, UC and UD; no XRC, no RD). The
// moves to RESET and ERR, which take no attribute, are in ruleFor.
var rules = map[transition]transitionRule{
	{Reset, Init}: {
		required: map[Type]AttrMask{
			RC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
			UC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
			UD: AttrPKeyIndex | AttrPort | AttrQKey,
		},
	},
	{Init, Init}: {
		optional: map[Type]AttrMask{
			RC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
			UC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
			UD: AttrPKeyIndex | AttrPort | AttrQKey,
		},
	},
	{Init, RTR}: {
		required: map[Type]AttrMask{
			RC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			UC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
		},
		optional: map[Type]AttrMask{
			RC: AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
			UC: AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
			UD: AttrPKeyIndex | AttrQKey,
		},
	},
	{RTR, RTS}: {
		required: map[Type]AttrMask{
			RC: AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic,
			UC: AttrSQPSN,
			UD: AttrSQPSN,
		},
		optional: map[Type]AttrMask{
			RC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
			UC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			UD: AttrCurState | AttrQKey,
		},
	},
	{RTS, RTS}: {
		optional: map[Type]AttrMask{
			RC: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer,
			UC: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState,
			UD: AttrCurState | AttrQKey,
		},
	},
	{RTS, SQD}: {optional: map[Type]AttrMask{RC: AttrEnSQDAsyncNotif, UC: AttrEnSQDAsyncNotif, UD: AttrEnSQDAsyncNotif}},
	{SQD, RTS}: {
		optional: map[Type]AttrMask{
			RC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
			UC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			UD: AttrCurState | AttrQKey,
		},
	},
	{SQD, SQD}: {
		optional: map[Type]AttrMask{
			RC: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic |
				AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer |
				AttrPathMigState,
			UC: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState,
			UD: AttrPKeyIndex | AttrQKey,
		},
	},
	{SQE, RTS}: {
		optional: map[Type]AttrMask{UC: AttrCurState | AttrAccessFlags, UD: AttrCurState | AttrQKey},
	},
}

// checkModify applies ibv_modify_qp's rules for a QP of type t in state
// cur, and the value ranges of each attribute set in mask. A cur_qp_state
// must name the QP's actual state: the kernel would take it on trust.
func checkModify(t Type, cur State, a *Attr, mask AttrMask) error {
	if mask&AttrCurState != 0 && a.CurState != cur {
		return fmt.Errorf("%w: cur_qp_state %v but QP is %v", ErrInvalidModify, a.CurState, cur)
	}
	next := cur
	if mask&AttrState != 0 {
		next = a.State
	}
	if next > Err {
		return fmt.Errorf("%w: unknown state %d", ErrInvalidModify, next)
	}
	r, ok := ruleFor(cur, next)
	if !ok {
		return fmt.Errorf("%w: no transition %v -> %v", ErrInvalidModify, cur, next)
	}
	req, opt := r.required[t], r.optional[t]
	attrs := mask &^ AttrState
	if missing := req &^ attrs; missing != 0 {
		return fmt.Errorf("%w: %v %v -> %v also needs %v (attribute mask %#x)", ErrInvalidModify, t, cur, next, missing, uint32(missing))
	}
	if extra := attrs &^ (req | opt); extra != 0 {
		return fmt.Errorf("%w: %v %v -> %v does not take %v (attribute mask %#x)", ErrInvalidModify, t, cur, next, extra, uint32(extra))
	}
	return checkValues(t, a, mask)
}

// ruleFor returns the rule for cur -> next. Every state may move to RESET,
// and every state but RESET to ERR, with no attribute but the state (not
// even cur_qp_state): that is the kernel's table, which has no RESET -> ERR.
func ruleFor(cur, next State) (transitionRule, bool) {
	if next == Reset || next == Err && cur != Reset {
		return transitionRule{}, true
	}
	r, ok := rules[transition{cur, next}]
	return r, ok
}

func checkValues(t Type, a *Attr, mask AttrMask) error {
	bad := func(f string, args ...any) error {
		return fmt.Errorf("%w: "+f, append([]any{ErrInvalidModify}, args...)...)
	}
	if mask&AttrPathMTU != 0 && a.PathMTU.Bytes() == 0 {
		return bad("path MTU %d is not 1..5 (256..4096 bytes)", a.PathMTU)
	}
	if mask&AttrPort != 0 && a.Port != 1 {
		return bad("port %d: the device has port 1 only", a.Port)
	}
	if mask&AttrPKeyIndex != 0 && a.PKeyIndex != 0 {
		return bad("P_Key index %d: the table has the default P_Key only", a.PKeyIndex)
	}
	if mask&AttrRQPSN != 0 && a.RQPSN > 0xffffff {
		return bad("rq_psn %#x exceeds 24 bits", a.RQPSN)
	}
	if mask&AttrSQPSN != 0 && a.SQPSN > 0xffffff {
		return bad("sq_psn %#x exceeds 24 bits", a.SQPSN)
	}
	if mask&AttrDestQPN != 0 && a.DestQPN > 0xffffff {
		return bad("dest_qp_num %#x exceeds 24 bits", a.DestQPN)
	}
	if mask&AttrTimeout != 0 && a.Timeout > 31 {
		return bad("timeout %d exceeds 31", a.Timeout)
	}
	if mask&AttrRetryCnt != 0 && a.RetryCnt > 7 {
		return bad("retry_cnt %d exceeds 7", a.RetryCnt)
	}
	if mask&AttrRNRRetry != 0 && a.RNRRetry > 7 {
		return bad("rnr_retry %d exceeds 7", a.RNRRetry)
	}
	if mask&AttrMinRNRTimer != 0 && a.MinRNRTimer > 31 {
		return bad("min_rnr_timer %d exceeds 31", a.MinRNRTimer)
	}
	if mask&AttrMaxQPRdAtomic != 0 && a.MaxRdAtomic > MaxRdAtomicLimit {
		return bad("max_rd_atomic %d exceeds %d", a.MaxRdAtomic, MaxRdAtomicLimit)
	}
	if mask&AttrMaxDestRdAtomic != 0 && a.MaxDestRdAtomic > MaxRdAtomicLimit {
		return bad("max_dest_rd_atomic %d exceeds %d", a.MaxDestRdAtomic, MaxRdAtomicLimit)
	}
	if mask&AttrAccessFlags != 0 && a.AccessFlags&^(mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic|mr.MWBind) != 0 {
		return bad("qp_access_flags %v not supported", a.AccessFlags)
	}
	if mask&AttrAV != 0 {
		if !a.Dest.Addr().IsValid() || a.Dest.Port() == 0 {
			return bad("address vector needs a destination address and port")
		}
		if t == UD {
			return bad("UD QPs take their address per work request")
		}
	}
	return nil
}

// rnrTimerTable is IBTA table 45: the RNR NAK timer field encoding, in
// microseconds (entry 0 means 655.36 ms).
var rnrTimerTable = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
	163840, 245760, 327680, 491520,
}

// RNRTimerMicros returns the RNR wait of an RNR timer field value.
func RNRTimerMicros(v uint8) uint32 { return rnrTimerTable[v&31] }

// DefaultRNRTick is the grain of a requester's RNR wait. rxe arms its
// rnr_nak_timer max(usecs_to_jiffies(t), 1) jiffies ahead, and the
// kernels it runs on in the lab (Debian's 6.1 and 6.12) tick at HZ=250.
const DefaultRNRTick = 4 * time.Millisecond

// RNRWait returns how long a requester waits after an RNR NAK carrying
// timer field v: the IBTA time rounded up to whole ticks, at least one,
// as rxe's jiffies round it (rxe's timer fires between n-1 and n ticks
// later; this waits n). A tick <= 0 gives the IBTA time exactly.
func RNRWait(v uint8, tick time.Duration) time.Duration {
	d := time.Duration(RNRTimerMicros(v)) * time.Microsecond
	if tick <= 0 {
		return d
	}
	return max((d+tick-1)/tick, 1) * tick
}
