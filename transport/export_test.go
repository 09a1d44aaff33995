package transport

// The helpers of this package's tests, for the external test package
// (transport_test), which tests the impairment shim (transport/impair):
// the shim imports this package, so its tests cannot be in it.
var (
	PipePair   = pipePair
	RocePacket = rocePacket
	PsnOf      = psnOf
	ListenAny  = listenAny
	RecvN      = recvN
)

// TapRec is a Tap that records what it sees.
type TapRec = tapRec

// TapSnapshot returns what r saw.
func TapSnapshot(r *tapRec) ([]tapPkt, []tapDrop) { return r.snapshot() }
