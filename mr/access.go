package mr

import (
	"fmt"
	"strings"
)

// Access is a set of MR access flags with the bit values of verbs'
// enum ibv_access_flags. Local read access is always granted.
type Access uint32

// Access flags, bit-compatible with IBV_ACCESS_*.
const (
	LocalWrite   Access = 1 << 0 // IBV_ACCESS_LOCAL_WRITE
	RemoteWrite  Access = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	RemoteRead   Access = 1 << 2 // IBV_ACCESS_REMOTE_READ
	RemoteAtomic Access = 1 << 3 // IBV_ACCESS_REMOTE_ATOMIC
	MWBind       Access = 1 << 4 // IBV_ACCESS_MW_BIND: memory windows may be bound to the MR
	ZeroBased    Access = 1 << 5 // IBV_ACCESS_ZERO_BASED: IOVA is 0
	OnDemand     Access = 1 << 6 // IBV_ACCESS_ON_DEMAND (unsupported)
)

const (
	// remoteAccess is what a peer can ask for.
	remoteAccess = RemoteWrite | RemoteRead | RemoteAtomic
	// supported is what Register accepts.
	supported = LocalWrite | remoteAccess | MWBind | ZeroBased
)

var accessNames = [...]string{"LocalWrite", "RemoteWrite", "RemoteRead", "RemoteAtomic", "MWBind", "ZeroBased", "OnDemand"}

// String lists the flags, for logs and error messages.
func (a Access) String() string {
	if a == 0 {
		return "0"
	}
	var parts []string
	for i, name := range accessNames {
		if a&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if rest := a &^ (1<<len(accessNames) - 1); rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint32(rest)))
	}
	return strings.Join(parts, "|")
}

// validate applies ibv_reg_mr's rules to registration flags.
func (a Access) validate() error {
	if bad := a &^ supported; bad != 0 {
		return fmt.Errorf("%w: access flags %v", ErrUnsupported, bad)
	}
	// Remote writes and atomics modify memory, so verbs insists the
	// owner may modify it too.
	if a&(RemoteWrite|RemoteAtomic) != 0 && a&LocalWrite == 0 {
		return fmt.Errorf("%w: %v requires LocalWrite", ErrInvalidArgument, a)
	}
	return nil
}
