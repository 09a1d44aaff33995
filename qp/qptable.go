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
	// pages, by the number's high bits, grown to the highest page in use
	// (an engine with a few QPs holds a pointer or two, not the 4,096 a
	// whole 24-bit space needs).
	pages []*qpTablePage
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
	i := int(n >> qpPageBits)
	if i >= len(t.pages) || t.pages[i] == nil {
		return nil
	}
	return t.pages[i].qps[n&(qpPage-1)]
}

// set makes q QP n (below 2^24), in place of any QP n had.
func (t *qpTable) set(n uint32, q *QP) {
	i := int(n >> qpPageBits)
	if i >= len(t.pages) {
		t.pages = append(t.pages, make([]*qpTablePage, i+1-len(t.pages))...)
	}
	p := t.pages[i]
	if p == nil {
		p = new(qpTablePage)
		t.pages[i] = p
	}
	if p.qps[n&(qpPage-1)] == nil {
		p.n++
		t.n++
	}
	p.qps[n&(qpPage-1)] = q
}

// del frees number n, and its page once the page holds no QP.
func (t *qpTable) del(n uint32) {
	i := int(n >> qpPageBits)
	if i >= len(t.pages) || t.pages[i] == nil || t.pages[i].qps[n&(qpPage-1)] == nil {
		return
	}
	p := t.pages[i]
	p.qps[n&(qpPage-1)] = nil
	p.n--
	t.n--
	if p.n == 0 {
		t.pages[i] = nil
	}
}

// len returns how many QPs the table holds.
func (t *qpTable) len() int { return t.n }

// all calls f for every QP, in number order, while f returns true. f may
// delete the QP it is given.
func (t *qpTable) all(f func(*QP) bool) {
	for i := 0; i < len(t.pages); i++ {
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
