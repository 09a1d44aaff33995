package probe

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/bth"
)

// Needs is what a scenario needs the peer's QP to offer: the C tool the
// peer runs decides it (ib_write_bw registers its buffer for remote
// writes only, ib_read_bw for reads, ib_atomic_bw for atomics;
// ib_send_bw's allows no remote access but its QPs have receives posted;
// ibv_uc_pingpong's QP is unreliable connected, with receives posted).
type Needs string

// What scenarios can need.
const (
	NeedsWrite  Needs = "write"
	NeedsRead   Needs = "read"
	NeedsAtomic Needs = "atomic"
	NeedsSend   Needs = "send"
	NeedsUC     Needs = "uc"
)

// Scenario is one scripted exchange on one of the peer's QPs, and the rule
// it checks. Scenarios are data: Builtin parses them from the same text
// format users write (see ParseScenarios and docs/probe.md).
type Scenario struct {
	Name     string
	Rule     string // where the rule is written: IBTA Vol. 1 section or compliance statement, Annex A17
	Requires string // what the rule requires, in a sentence
	Needs    Needs
	// StartPSN, when set, is the first PSN of the QP (the PSN the probe
	// announces in the handshake); otherwise the run picks one.
	StartPSN *uint32
	// Optional says the rule binds only devices that implement an
	// optional feature: a peer that does not behave so gets "not
	// applicable" rather than "deviates".
	Optional bool
	// Requester says the scenario probes the peer's requester: the peer
	// runs the client and the probe answers it (see Requester).
	Requester bool
	Steps     []Step
}

// StepKind says what a Step does.
type StepKind uint8

// Step kinds.
const (
	StepSend StepKind = iota + 1
	StepExpect
	StepWait
	StepImpair // requester mode: how the probe mistreats one of the peer's packets
)

// Impairments of requester mode, applied to the peer's packet at PSN
// +At (its first copy).
const (
	ImpairDrop         = "drop"          // lose it: the packets after it meet a PSN sequence error NAK
	ImpairWithhold     = "withhold"      // accept it but send no ACK: the peer's ACK timer must fire
	ImpairWithholdMany = "withhold-many" // send no ACK for it or its copies until Count copies came (or 5 s; 9T for a longer T)
	ImpairRNR          = "rnr"           // answer it with an RNR NAK carrying Timer
	ImpairGhostAck     = "ghost-ack"     // acknowledge a PSN 100 past it instead of it
	ImpairAckTwice     = "ack-twice"     // send its ACK twice
	ImpairCEAck        = "ce-ack"        // send its ACK marked ECN CE
	ImpairCEData       = "ce-data"       // send the READ response to it marked ECN CE
	// ImpairCNP starts a train of Count CNPs to the peer's QP, Every
	// apart, After the packet arrived, and acknowledges the QP's packets
	// coalesced so that the peer sends at its own pace (see Requester).
	ImpairCNP = "cnp"
)

// Bounds of a CNP train (ImpairCNP): the probe's CNPs are packets like
// any other, within the run's gap and packet budget.
const (
	maxCNPTrain  = 1000
	maxCNPWindow = 2 * time.Second
)

var impairments = map[string]bool{ImpairDrop: true, ImpairWithhold: true, ImpairWithholdMany: true, ImpairRNR: true,
	ImpairGhostAck: true, ImpairAckTwice: true, ImpairCEAck: true, ImpairCEData: true, ImpairCNP: true}

// RKey choices of a Send step.
const (
	RKeyPeer = "peer" // the rkey the handshake gave
	RKeyBad  = "bad"  // the peer's rkey with its key byte changed
)

// Step is one line of a scenario: a packet to send, a response to expect,
// or a pause.
type Step struct {
	Kind StepKind
	Line int // line in the scenario text, for messages

	// Send: the opcode (by name) and fields; PSN is relative to the QP's
	// start PSN, nil for "the next one".
	Op      bth.Opcode
	RawOp   *uint8 // byte 0 of the BTH after encoding (reserved opcodes)
	PSN     *int
	Len     int     // payload bytes (WRITE, SEND) or DMA length (READ)
	DMALen  *int    // RETH DMA length when it must differ from the message's
	RKey    string  // RKeyPeer, RKeyBad or a number
	VAOff   int64   // from the peer's announced address
	Addr    *uint64 // an absolute address instead
	TVer    uint8
	PKey    *uint16 // instead of the default P_Key
	AckReq  bool
	BadICRC bool
	BadUDP  bool // a wrong UDP checksum (sent on a raw socket)
	CE      bool // IP ECN Congestion Experienced
	Add     uint64
	Compare uint64

	// Expect: the response kind and fields; PSN and PSNHi bound the
	// response's PSN (relative); Timer is an RNR NAK's timer; Save names
	// an atomic ACK's original value, Orig checks it (OrigPlus added).
	Expect   string
	PSNHi    *int
	Timer    *int
	Save     string
	Orig     string
	OrigPlus uint64
	Pre      bool // a precondition: failing it makes the verdict inconclusive
	Coalesce bool // plain ACKs below the wanted PSN may come first

	// Wait: how long.
	Wait time.Duration

	// Impair (requester mode): what to do to the peer's packet at PSN +At.
	Impair string
	At     int
	// Requester expectations: Min and Max bound a retransmission's delay
	// ("T" is the peer's ACK timeout, 4.096 us x 2^14 for the C tools;
	// "rnr" the RNR timer's time; or a duration, optionally "NT");
	// Count is a number of retries (or of CNPs).
	Min, Max string
	Count    *int
	// Every is how far apart a CNP train's CNPs are and After how long
	// after the packet at +At it starts; Window how long each of the two
	// windows is whose packet rates "expect slower" compares.
	Every, After, Window time.Duration
}

// Expectation kinds and the AETH each needs.
var expectKinds = map[string]bool{
	"ack": true, "nak-seq": true, "nak-inv": true, "nak-rae": true, "nak-rop": true, "nak-fatal": true, "rnr": true,
	"read-resp": true, "read-first": true, "read-middle": true, "read-last": true, "read-only": true,
	"atomic-ack": true, "cnp": true, "none": true,
	// requester mode
	"go-back": true, "retransmit": true, "retries": true, "no-retransmit": true, "slower": true,
	// a pingpong server's answer: a message of its own, sent once it
	// received one (proof of delivery), or none within the wait
	"peer-send": true, "no-peer-send": true,
}

// sendOps are the opcode names a Send step accepts.
var sendOps = map[string]bth.Opcode{
	"write-first": bth.RCWriteFirst, "write-middle": bth.RCWriteMiddle, "write-last": bth.RCWriteLast,
	"write-only": bth.RCWriteOnly, "write-only-imm": bth.RCWriteOnlyImm,
	"send-first": bth.RCSendFirst, "send-middle": bth.RCSendMiddle, "send-last": bth.RCSendLast,
	"send-only": bth.RCSendOnly, "read": bth.RCReadRequest,
	"cmp-swap": bth.RCCompareSwap, "fetch-add": bth.RCFetchAdd, "ack": bth.RCAck,
	"uc-write-only": bth.UCWriteOnly,
	"uc-send-first": bth.UCSendFirst, "uc-send-middle": bth.UCSendMiddle, "uc-send-last": bth.UCSendLast,
	"uc-send-only": bth.UCSendOnly,
}

// ParseScenarios reads scenarios in the probe's text format:
//
//	scenario NAME
//	rule TEXT
//	requires TEXT
//	needs write|read|atomic|send|uc
//	start-psn N
//	optional
//	send OP [psn=+N] [len=N] [dmalen=N] [rkey=peer|bad|N] [va=+N] [addr=N] [ackreq]
//	     [icrc=bad] [udpcsum=bad] [ce] [add=N] [cmp=N] [opcode=N] [tver=N] [pkey=N]
//	expect KIND [psn=+N[..+M]] [timer=N] [save=NAME] [orig=NAME[+N]] [pre] [coalesce]
//	wait DURATION
//	impair KIND at=N [timer=N] [count=N] [after=D] [every=D]   (requester mode)
//	expect slower window=D                                     (requester mode)
//	end
//
// '#' starts a comment. Every error names its line.
func ParseScenarios(r io.Reader) ([]*Scenario, error) {
	var out []*Scenario
	var cur *Scenario
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		word, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		bad := func(f string, a ...any) error {
			return fmt.Errorf("probe: scenario line %d: %s", n, fmt.Sprintf(f, a...))
		}
		if word == "scenario" {
			if cur != nil {
				return nil, bad("scenario %q not ended", cur.Name)
			}
			if rest == "" || strings.ContainsAny(rest, " \t") {
				return nil, bad("scenario needs one name without spaces")
			}
			cur = &Scenario{Name: rest, Needs: NeedsWrite}
			continue
		}
		if cur == nil {
			return nil, bad("%q outside a scenario", word)
		}
		var err error
		switch word {
		case "end":
			err = cur.Validate()
			if err == nil {
				out = append(out, cur)
			}
			cur = nil
		case "rule":
			cur.Rule = rest
		case "requires":
			cur.Requires = rest
		case "needs":
			switch Needs(rest) {
			case NeedsWrite, NeedsRead, NeedsAtomic, NeedsSend, NeedsUC:
				cur.Needs = Needs(rest)
			default:
				err = fmt.Errorf("needs %q: want write, read, atomic, send or uc", rest)
			}
		case "optional":
			cur.Optional = true
		case "mode":
			switch rest {
			case "responder":
			case "requester":
				cur.Requester = true
			default:
				err = fmt.Errorf("mode %q: want responder or requester", rest)
			}
		case "start-psn":
			var v uint64
			v, err = strconv.ParseUint(rest, 0, 24)
			p := uint32(v)
			cur.StartPSN = &p
		case "send", "expect", "wait", "impair":
			var st Step
			st, err = parseStep(word, rest)
			st.Line = n
			cur.Steps = append(cur.Steps, st)
		default:
			err = fmt.Errorf("unknown keyword %q", word)
		}
		if err != nil {
			return nil, bad("%v", err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("probe: scenario %q has no end", cur.Name)
	}
	return out, nil
}

// Validate checks that s can run: a name, a rule, steps, and bounds.
func (s *Scenario) Validate() error {
	switch {
	case s.Name == "":
		return fmt.Errorf("a scenario without a name")
	case s.Rule == "" || s.Requires == "":
		return fmt.Errorf("scenario %s: needs a rule and what it requires", s.Name)
	case len(s.Steps) == 0:
		return fmt.Errorf("scenario %s: no steps", s.Name)
	}
	sends := 0
	for _, st := range s.Steps {
		if (st.Kind == StepImpair || st.Kind == StepExpect && requesterExpect[st.Expect]) != s.Requester && st.Kind != StepWait &&
			!(s.Requester && st.Kind == StepExpect && st.Expect == "cnp") {
			return fmt.Errorf("scenario %s line %d: %s does not belong in a %s-mode scenario", s.Name, st.Line, stepWord(st), map[bool]string{false: "responder", true: "requester"}[s.Requester])
		}
		if st.Kind == StepSend {
			sends++
		}
		if st.Kind == StepWait && (st.Wait <= 0 || st.Wait > 10*time.Second) {
			return fmt.Errorf("scenario %s line %d: wait %v outside (0, 10s]", s.Name, st.Line, st.Wait)
		}
		if err := st.checkRate(); err != nil {
			return fmt.Errorf("scenario %s line %d: %v", s.Name, st.Line, err)
		}
	}
	if err := s.checkTrain(); err != nil {
		return err
	}
	if sends > maxSendsPerScenario {
		return fmt.Errorf("scenario %s: %d packets, at most %d", s.Name, sends, maxSendsPerScenario)
	}
	return nil
}

// checkRate checks the fields of a CNP train and of the rate it is
// judged by: a train has a count and a spacing within bounds, a rate
// comparison a window.
func (st Step) checkRate() error {
	switch {
	case st.Kind == StepImpair && st.Impair == ImpairCNP:
		if st.Count == nil || *st.Count < 1 || *st.Count > maxCNPTrain {
			return fmt.Errorf("impair cnp needs count=N, 1..%d", maxCNPTrain)
		}
		if st.Every <= 0 || st.Every > time.Second {
			return fmt.Errorf("impair cnp needs every=D, in (0, 1s]")
		}
		if st.After < 0 || st.After > maxCNPWindow {
			return fmt.Errorf("impair cnp: after=%v outside [0, %v]", st.After, maxCNPWindow)
		}
	case st.Kind == StepExpect && st.Expect == "slower":
		if st.Window <= 0 || st.Window > maxCNPWindow {
			return fmt.Errorf("expect slower needs window=D, in (0, %v]", maxCNPWindow)
		}
	}
	return nil
}

// RunsAlone says the scenario runs only as the one scenario of its run
// (--only NAME, -q 1): a CNP train needs a long stream from the peer,
// much longer than the other requester scenarios' (-n 20), and would
// load the host and the peer while their timers are measured.
func (s *Scenario) RunsAlone() bool {
	for _, st := range s.Steps {
		if st.Kind == StepImpair && st.Impair == ImpairCNP {
			return true
		}
	}
	return false
}

// checkTrain checks that a rate comparison has a CNP train to judge,
// one longer than its window (the window after the CNPs ends at the
// last one), and that the train starts a window after its packet or
// later, so that the window before it can be full.
func (s *Scenario) checkTrain() error {
	var train, slower *Step
	for i, st := range s.Steps {
		switch {
		case st.Kind == StepImpair && st.Impair == ImpairCNP:
			train = &s.Steps[i]
		case st.Kind == StepExpect && st.Expect == "slower":
			slower = &s.Steps[i]
		}
	}
	switch {
	case slower == nil:
		return nil
	case train == nil:
		return fmt.Errorf("scenario %s line %d: expect slower needs an impair cnp", s.Name, slower.Line)
	case time.Duration(*train.Count)*train.Every <= slower.Window:
		return fmt.Errorf("scenario %s line %d: %d CNPs %v apart last no longer than the window %v", s.Name, train.Line, *train.Count, train.Every, slower.Window)
	case train.After < slower.Window:
		return fmt.Errorf("scenario %s line %d: after=%v is shorter than the window %v before the CNPs", s.Name, train.Line, train.After, slower.Window)
	}
	return nil
}

// rateWindow is the window of the scenario's "expect slower", 0 without.
func (s *Scenario) rateWindow() time.Duration {
	for _, st := range s.Steps {
		if st.Kind == StepExpect && st.Expect == "slower" {
			return st.Window
		}
	}
	return 0
}

// requesterExpect are the expectations of requester mode.
var requesterExpect = map[string]bool{"go-back": true, "retransmit": true, "retries": true, "no-retransmit": true, "slower": true}

// stepWord names a step's kind as the format writes it.
func stepWord(st Step) string {
	switch st.Kind {
	case StepSend:
		return "send"
	case StepExpect:
		return "expect " + st.Expect
	case StepImpair:
		return "impair"
	}
	return "wait"
}

// parseStep parses a send, expect or wait line's arguments.
func parseStep(word, rest string) (Step, error) {
	f := strings.Fields(rest)
	if len(f) == 0 {
		return Step{}, fmt.Errorf("%s needs an argument", word)
	}
	switch word {
	case "wait":
		d, err := time.ParseDuration(f[0])
		return Step{Kind: StepWait, Wait: d}, err
	case "impair":
		if !impairments[f[0]] {
			return Step{}, fmt.Errorf("unknown impairment %q", f[0])
		}
		st := Step{Kind: StepImpair, Impair: f[0]}
		return st, parseFields(&st, f[1:])
	case "send":
		op, ok := sendOps[f[0]]
		if !ok {
			return Step{}, fmt.Errorf("unknown packet %q", f[0])
		}
		st := Step{Kind: StepSend, Op: op, RKey: RKeyPeer}
		return st, parseFields(&st, f[1:])
	}
	if !expectKinds[f[0]] {
		return Step{}, fmt.Errorf("unknown response %q", f[0])
	}
	st := Step{Kind: StepExpect, Expect: f[0]}
	return st, parseFields(&st, f[1:])
}

// parseFields fills st from key=value and flag words.
func parseFields(st *Step, words []string) error {
	for _, w := range words {
		k, v, hasV := strings.Cut(w, "=")
		num := func(bits int) (uint64, error) {
			x, err := strconv.ParseUint(v, 0, bits)
			if err != nil {
				return 0, fmt.Errorf("%s=%q: %v", k, v, err)
			}
			return x, nil
		}
		var err error
		var x uint64
		switch {
		case k == "psn" && hasV:
			lo, hi, rng := strings.Cut(v, "..")
			var a int
			if a, err = relPSN(lo); err == nil {
				st.PSN = &a
			}
			if rng && err == nil {
				var b int
				if b, err = relPSN(hi); err == nil {
					st.PSNHi = &b
				}
			}
		case k == "len" && hasV:
			x, err = num(31)
			st.Len = int(x)
		case k == "dmalen" && hasV:
			x, err = num(32)
			d := int(x)
			st.DMALen = &d
		case k == "rkey" && hasV:
			if v != RKeyPeer && v != RKeyBad {
				_, err = num(32)
			}
			st.RKey = v
		case k == "va" && hasV:
			st.VAOff, err = strconv.ParseInt(v, 0, 64)
		case k == "addr" && hasV:
			x, err = num(64)
			st.Addr = &x
		case k == "tver" && hasV:
			x, err = num(4)
			st.TVer = uint8(x)
		case k == "pkey" && hasV:
			x, err = num(16)
			pk := uint16(x)
			st.PKey = &pk
		case k == "icrc" && v == "bad":
			st.BadICRC = true
		case k == "udpcsum" && v == "bad":
			st.BadUDP = true
		case k == "add" && hasV:
			st.Add, err = num(64)
		case k == "cmp" && hasV:
			st.Compare, err = num(64)
		case k == "opcode" && hasV:
			x, err = num(8)
			b := uint8(x)
			st.RawOp = &b
		case k == "timer" && hasV:
			x, err = num(5)
			t := int(x)
			st.Timer = &t
		case k == "at" && hasV:
			x, err = num(16)
			st.At = int(x)
		case k == "count" && hasV:
			x, err = num(16)
			c := int(x)
			st.Count = &c
		case (k == "every" || k == "after" || k == "window") && hasV:
			d, perr := time.ParseDuration(v)
			if perr != nil {
				return fmt.Errorf("%s=%q: want a duration", k, v)
			}
			switch k {
			case "every":
				st.Every = d
			case "after":
				st.After = d
			default:
				st.Window = d
			}
		case (k == "min" || k == "max") && hasV:
			if _, err = parseDelay(v, 0, 0); err == nil {
				if k == "min" {
					st.Min = v
				} else {
					st.Max = v
				}
			}
		case k == "save" && hasV:
			st.Save = v
		case k == "orig" && hasV:
			name, plus, ok := strings.Cut(v, "+")
			st.Orig = name
			if ok {
				st.OrigPlus, err = strconv.ParseUint(plus, 0, 64)
			}
		case w == "ackreq":
			st.AckReq = true
		case w == "ce":
			st.CE = true
		case w == "pre":
			st.Pre = true
		case w == "coalesce":
			st.Coalesce = true
		default:
			return fmt.Errorf("unknown field %q", w)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseDelay evaluates a delay bound: a duration, "T" or "NT" (multiples
// of the ACK timeout t), or "rnr" (the RNR timer's time r).
func parseDelay(v string, t, r time.Duration) (time.Duration, error) {
	if v == "rnr" {
		return r, nil
	}
	if n, ok := strings.CutSuffix(v, "T"); ok {
		m := 1.0
		if n != "" {
			var err error
			if m, err = strconv.ParseFloat(n, 64); err != nil || m < 0 {
				return 0, fmt.Errorf("delay %q: want a duration, T, NT or rnr", v)
			}
		}
		return time.Duration(m * float64(t)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("delay %q: want a duration, T, NT or rnr", v)
	}
	return d, nil
}

// relPSN parses "+N" or "-N" (relative to the QP's start PSN).
func relPSN(s string) (int, error) {
	if s == "" || (s[0] != '+' && s[0] != '-') {
		return 0, fmt.Errorf("psn %q: want +N or -N, relative to the start PSN", s)
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= -(1<<23) || v >= 1<<23 {
		return 0, fmt.Errorf("psn %q: want a relative PSN within half the 24-bit space", s)
	}
	return v, nil
}
