package bth

// PSN is a 24-bit packet sequence number. PSNs wrap, so they are compared
// by signed 24-bit distance and never with < on the raw values.
type PSN uint32

// PSNMask keeps the low 24 bits.
const PSNMask = 0xffffff

// Add returns p+n modulo 2^24 (n may be negative).
func (p PSN) Add(n int) PSN { return PSN((int64(p) + int64(n)) & PSNMask) }

// Next returns p+1 modulo 2^24.
func (p PSN) Next() PSN { return (p + 1) & PSNMask }

// Diff returns the signed distance p-q in [-2^23, 2^23): positive when p is
// after q in sequence space. Two PSNs exactly 2^23 apart are each Before
// the other (distance -2^23 both ways); a window never spans that far.
func (p PSN) Diff(q PSN) int32 {
	return int32((uint32(p)-uint32(q))<<8) >> 8
}

// Before reports whether p comes strictly before q.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// After reports whether p comes strictly after q.
func (p PSN) After(q PSN) bool { return p.Diff(q) > 0 }

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return p <= PSNMask }
