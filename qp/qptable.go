package qp

// qpTable maps QP numbers to an engine's QPs. Every received packet looks
// its QP up, so the lookup is on the hottest path there is; with thousands
// of QPs a hash map's groups no longer stay in the CPU's caches, and the
// lookup cost a cache miss or two per packet (4% of the machine's samples
// with 10,000 QPs). Numbers are handed out in sequence (Engine.Create, the
// device's blocks), so a two-level table indexed by the number's bits is
// dense: a page of qpPage pointers holds a run of consecutive numbers,
// and 10,000 QPs fill three pages (96 KiB) that the lookups walk in order.
type qpTable struct {
	pages [1 << (24 - qpPageBits)]*qpTablePage // by the number's high bits
	n     int
}

// qpTablePage holds the QPs of qpPage consecutive numbers.
type qpTablePage struct {
	qps [qpPage]*QP
	n   int // QPs in qps
}

// qpPageBits is how many low bits of a QP number index a page.
const (
	qpPageBits = 12
	qpPage     = 1 << qpPageBits
)

// get returns QP n, or nil.
func (t *qpTable) get(n uint32) *QP {
	if n > 0xffffff {
		return nil
	}
	p := t.pages[n>>qpPageBits]
	if p == nil {
		return nil
	}
	return p.qps[n&(qpPage-1)]
}

// set makes q QP n, in place of any QP n had.
func (t *qpTable) set(n uint32, q *QP) {
	p := t.pages[n>>qpPageBits]
	if p == nil {
		p = new(qpTablePage)
		t.pages[n>>qpPageBits] = p
	}
	if p.qps[n&(qpPage-1)] == nil {
		p.n++
		t.n++
	}
	p.qps[n&(qpPage-1)] = q
}

// del frees number n, and its page once the page holds no QP.
func (t *qpTable) del(n uint32) {
	p := t.pages[n>>qpPageBits]
	if p == nil || p.qps[n&(qpPage-1)] == nil {
		return
	}
	p.qps[n&(qpPage-1)] = nil
	p.n--
	t.n--
	if p.n == 0 {
		t.pages[n>>qpPageBits] = nil
	}
}

// len returns how many QPs the table holds.
func (t *qpTable) len() int { return t.n }

// all calls f for every QP, in number order, while f returns true. f may
// delete the QP it is given.
func (t *qpTable) all(f func(*QP) bool) {
	for i := range t.pages {
		p := t.pages[i]
		if p == nil {
			continue
		}
		for _, q := range &p.qps {
			if q != nil && !f(q) {
				return
			}
		}
	}
}
