package rxego

import (
	"github.com/rxego/rxego/transport"
)

// SetTap installs t as the observer of every packet the device sends,
// receives and drops (nil removes it): a transport/pcaptap Writer records
// them as pcapng, `rxego trace` and the demo draw them. It replaces the
// Tap given in Options. Packets already in flight when SetTap returns may
// still reach the previous Tap. The sockets of multicast groups the
// device joins (AttachMcast) get it too.
func (d *Device) SetTap(t transport.Tap) {
	if d.dev != nil {
		d.dev.SetTap(t)
	}
}
