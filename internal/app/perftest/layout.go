package perftest

// layout is perftest's buffer arithmetic (perftest_resources.h), shared by
// both sides once they have agreed on the cycle buffer (page size) and the
// cache line size: rxego lays out its own buffer the same way and uses the
// same rules to know where the peer's bytes are.
//
// One buffer serves all QPs: QP i sends from (and reads or fetches into)
// buf(i) in the first half and exposes vaddr(i) in the second half. With
// messages of at most half a page, successive BW work requests walk
// through slots of INC(size) bytes and wrap after a page.
type layout struct {
	ctxSize   int // the size the buffer was allocated for (ctx->size)
	cycle     int // cycle buffer: the larger page size
	cacheLine int // the larger cache line size
	numQPs    int
}

// inc is INC(size, cache_line_size): the stride between slots.
func (l layout) inc(size int) int {
	if size > l.cacheLine {
		return (size + l.cacheLine - 1) / l.cacheLine * l.cacheLine
	}
	return l.cacheLine
}

// buffSize is BUFF_SIZE(ctx->size, cycle_buffer): one QP's share of a half.
func (l layout) buffSize() int { return max(l.ctxSize, l.cycle) }

// total is the size of the whole buffer (ctx->buff_size).
func (l layout) total() int { return l.inc(l.buffSize()) * 2 * l.numQPs }

// buf is the offset of QP i's local region.
func (l layout) buf(i int) int { return i * l.buffSize() }

// vaddr is the offset of QP i's remotely accessible region: what the key
// record announces.
func (l layout) vaddr(i int) int { return (l.numQPs + i) * l.buffSize() }

// recvBase is the offset of QP i's first receive (ctx_set_recv_wqes uses
// send_qp_buff_size, which is INC(BUFF_SIZE), not BUFF_SIZE).
func (l layout) recvBase(i int) int { return (l.numQPs + i) * l.inc(l.buffSize()) }

// cycles reports whether BW work requests of size walk through slots.
func (l layout) cycles(size int) bool { return size <= l.cycle/2 }

// slots is how many slots BW work requests of size walk through.
func (l layout) slots(size int) int {
	if !l.cycles(size) {
		return 1
	}
	return l.cycle / l.inc(size)
}

// slot is the offset, from a region's start, of the k-th BW work request
// of size (increase_loc_addr and increase_rem_addr: wrap after slots).
func (l layout) slot(k, size int) int {
	return k % l.slots(size) * l.inc(size)
}

// recvOffsets returns, for a SEND BW receiver, the offset of the receive
// buffer each of iters messages lands in on QP i: rxDepth receives posted
// up front walking through the slots, then (after ctx_set_recv_wqes
// resets the address) one repost per completion while fewer than iters
// are posted, walking again from the base (run_iter_bw_server). A latency
// test posts every receive at the base.
func (l layout) recvOffsets(i, size, rxDepth, iters int, lat bool) []int {
	base := l.recvBase(i)
	walk := !lat && l.cycles(size)
	out := make([]int, 0, iters)
	addr := base
	for j := 0; j < rxDepth && len(out) < iters; j++ {
		out = append(out, addr)
		if walk {
			addr += l.inc(size)
			if (j+1)%l.slots(size) == 0 {
				addr = base
			}
		}
	}
	addr = base
	posted := rxDepth
	for len(out) < iters && posted+1 <= iters {
		out = append(out, addr)
		posted++
		if walk {
			addr += l.inc(size)
			if (posted+1)%l.slots(size) == 0 {
				addr = base
			}
		}
	}
	return out
}
