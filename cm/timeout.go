package cm

import "time"

// IBATime is the exact duration of an IBA time exponent: 4.096 us * 2^n.
func IBATime(n uint8) time.Duration {
	return time.Duration(4096<<min(n, 31)) * time.Nanosecond
}

// cmTime is the Linux CM's approximation of an IBA time exponent in
// milliseconds (cm_convert_to_ms: 1 << max(n-8, 0) ms). rxego times its
// retransmissions with it so that both ends of a connection agree.
func cmTime(n uint8) time.Duration {
	if n < 8 {
		n = 8
	}
	return time.Duration(1<<min(n-8, 31)) * time.Millisecond
}

// ackTimeout is the local ACK timeout exponent of a path (cm_ack_timeout):
// 4.096 us * 2^t covers the CA's ACK delay plus twice the packet lifetime;
// it takes the larger term and rounds up when the other is within 50%.
func ackTimeout(caACKDelay, packetLifeTime uint8) uint8 {
	t := int(packetLifeTime) + 1
	d := int(caACKDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		t = d
		if int(packetLifeTime)+1 >= d-1 {
			t++
		}
	}
	return uint8(min(31, t))
}
