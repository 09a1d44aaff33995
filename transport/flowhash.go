package transport

// SourcePortBase and MaxSourcePorts bound the UDP source ports RoCEv2
// senders use for entropy: 0xC000-0xFFFF, as rxe and RNICs do.
const (
	SourcePortBase = 0xC000
	MaxSourcePorts = 1 << 14
)

// FlowHash is the 14-bit hash of a destination QP number that picks a
// packet's source socket: Linux's hash_32(qpn, 14), which rxe applies to
// a QP's own number for its default source port. It is portable (the
// coalescer uses it on every system), unlike the sockets that use it.
func FlowHash(qpn uint32) uint32 { return (qpn * 0x61C88647) >> 18 }
