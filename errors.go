package rxego

import (
	"errors"
	"strings"

	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
)

// The errors the verbs return, wrapped with what was wrong: test for them
// with errors.Is. Every error a call of this package returns reads
// "rxego: ...", whichever layer below found the fault.
var (
	// ErrClosed is what calls on a closed Device, and on the PDs, CQs,
	// QPs, SRQs, MRs and windows it made, return, as net.ErrClosed is for
	// connections, and what a second Close, Destroy, Deregister or Dealloc
	// returns (os.File's rule). The zero Device counts as closed. The
	// engine (qp) and package mr return this very error.
	ErrClosed = qp.ErrClosed
	// ErrBusy is what CQ.Close returns while a QP still uses the CQ
	// (verbs: EBUSY from ibv_destroy_cq; destroy the QP first), and
	// QP.Destroy while the QP is attached to a multicast group (EBUSY
	// from ibv_destroy_qp; DetachMcast first).
	ErrBusy = errors.New("rxego: busy")
	// ErrInvalidWR is what PostSend and PostRecv return for a work request
	// the QP's type, state or capabilities do not allow (verbs: EINVAL);
	// nothing of the batch is posted.
	ErrInvalidWR = errors.New("rxego: invalid work request")
	// ErrQueueFull is what PostSend and PostRecv return when the work
	// queue has no room for the batch (verbs: ENOMEM).
	ErrQueueFull = errors.New("rxego: work queue full")
	// ErrInvalidModify is what QP.Modify returns for a transition or an
	// attribute mask ibv_modify_qp refuses (verbs: EINVAL); the QP is
	// unchanged.
	ErrInvalidModify = errors.New("rxego: invalid modify")
	// ErrCQOverrun is what CQ.Poll, CQ.PollWait and CQ.Wait return (wrapped,
	// naming the QPs hit) once a completion arrived while the CQ was full,
	// after the completions it holds are polled; verbs raises
	// IBV_EVENT_CQ_ERR. The completion is lost and the QP that generated
	// it moves to ERR, so its other work completes with WR_FLUSH_ERR;
	// other QPs on the CQ go on. CQ.Err returns it too.
	ErrCQOverrun = errors.New("rxego: completion queue overrun")
	// ErrQPNTaken is what CreateQP returns when the QP number asked for
	// (QPInitAttr.QPN) is in use or reserved.
	ErrQPNTaken = errors.New("rxego: QP number unavailable")
	// ErrInvalidArgument is what memory registration, memory windows and
	// their keys return for a request that names no valid region, key or
	// range (mr.ErrInvalidArgument).
	ErrInvalidArgument = errors.New("rxego: invalid argument")
)

// rootErrs pairs each root error with the error of the layer below that
// it stands for.
var rootErrs = [...]struct{ root, below error }{
	{ErrBusy, qp.ErrBusy},
	{ErrInvalidWR, qp.ErrInvalidWR},
	{ErrQueueFull, qp.ErrQueueFull},
	{ErrInvalidModify, qp.ErrInvalidModify},
	{ErrCQOverrun, qp.ErrCQOverrun},
	{ErrQPNTaken, qp.ErrQPNTaken},
	{ErrInvalidArgument, mr.ErrInvalidArgument},
}

// apiError is an error of a layer below as the API returns it: its text
// says "rxego:" where the layer's said its own name, and errors.Is finds
// both the root's error and the layer's.
type apiError struct {
	msg  string
	root error // the root error it stands for, or nil
	err  error
}

func (e *apiError) Error() string { return e.msg }

// Unwrap returns the root error (if any) and the layer's error.
func (e *apiError) Unwrap() []error {
	if e.root == nil {
		return []error{e.err}
	}
	return []error{e.root, e.err}
}

// apiErr returns err as the API returns it (see apiError); nil stays nil.
func apiErr(err error) error {
	if err == nil {
		return nil
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return err // already the API's
	}
	var root error
	msg := err.Error()
	for _, m := range rootErrs {
		if errors.Is(err, m.below) {
			root = m.root
			msg = strings.Replace(msg, m.below.Error(), strings.TrimPrefix(m.root.Error(), "rxego: "), 1)
			break
		}
	}
	for _, p := range []string{"qp: ", "mr: "} {
		msg = strings.ReplaceAll(msg, ": "+p, ": ")
		if strings.HasPrefix(msg, p) {
			msg = msg[len(p):]
		}
	}
	if !strings.HasPrefix(msg, "rxego: ") {
		msg = "rxego: " + msg
	}
	if root == nil && msg == err.Error() {
		return err
	}
	return &apiError{msg: msg, root: root, err: err}
}
