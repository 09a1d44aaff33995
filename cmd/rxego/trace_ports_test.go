package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/transport/pcaptap"
)

// TestTracePortsPerQP records, with pcaptap, two devices (two shards)
// writing over 8 QP pairs, and checks with `rxego trace --json` on the
// capture, every ICRC (which covers the port) good, that with
// DefaultSourcePorts each QP's packets leave from one UDP source port in
// 0xC000-0xFFFF, the ports differing between QPs, and that by default on
// loopback every packet leaves from 4791.
func TestTracePortsPerQP(t *testing.T) {
	t.Run("source ports", func(t *testing.T) { tracePorts(t, rxego.DefaultSourcePorts) })
	t.Run("loopback default", func(t *testing.T) { tracePorts(t, 0) })
}

func tracePorts(t *testing.T, sourcePorts int) {
	const nqp = 8
	path := filepath.Join(t.TempDir(), "ports.pcapng")
	w, err := pcaptap.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	a := testaddr.Open(t, &rxego.Options{Shards: 2, SourcePorts: sourcePorts, Tap: w})
	b := testaddr.Open(t, &rxego.Options{Shards: 2, SourcePorts: sourcePorts})
	var qps [2][]*rxego.QP
	var mrs [2]*rxego.MR
	var cqs [2]*rxego.CQ
	for s, d := range []*rxego.Device{a, b} {
		pd, _ := d.AllocPD()
		cqs[s], _ = d.CreateCQ(2 * nqp)
		mrs[s], _ = pd.RegMR(make([]byte, nqp*2048), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
		for range nqp {
			q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cqs[s], RecvCQ: cqs[s], Caps: rxego.Caps{MaxSendWR: 2, MaxRecvWR: 2}})
			if err != nil {
				t.Fatal(err)
			}
			qps[s] = append(qps[s], q)
		}
	}
	for i := range nqp {
		if err := qps[0][i].Connect(rxego.RemoteQP{Addr: b.Addr(), QPN: qps[1][i].Num()}, nil); err != nil {
			t.Fatal(err)
		}
		if err := qps[1][i].Connect(rxego.RemoteQP{Addr: a.Addr(), QPN: qps[0][i].Num()}, nil); err != nil {
			t.Fatal(err)
		}
		// Each QP its own bytes: QPs of different shards write at once.
		off := uint64(i * 2048)
		if err := qps[0][i].PostSend(rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, RemoteAddr: mrs[1].IOVA() + off, RKey: mrs[1].RKey(),
			SGL: []rxego.SGE{{Addr: mrs[0].IOVA() + off, Length: 2048, LKey: mrs[0].LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]rxego.WC, nqp)
	for got := 0; got < nqp; {
		n, err := cqs[0].PollWait(ctx, wcs)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	a.Close()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := traceTo(&out, []string{"--json", path}); err != nil {
		t.Fatal(err)
	}
	type rec struct {
		SrcPort uint16 `json:"src_port"`
		DstPort uint16 `json:"dst_port"`
		DQPN    uint32 `json:"dqpn"`
		ICRCOK  bool   `json:"icrc_ok"`
		Src     string `json:"src"`
	}
	portOf := map[uint32]uint16{}
	ports := map[uint16]bool{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r rec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if !r.ICRCOK {
			t.Errorf("bad ICRC: %s", sc.Text())
		}
		if r.Src != a.Addr().Addr().String() {
			continue // what a received
		}
		if sourcePorts == 0 && r.SrcPort != rxego.DefaultPort || sourcePorts > 0 && r.SrcPort < 0xC000 || r.DstPort != rxego.DefaultPort {
			t.Errorf("packet to QP %d from port %d to %d", r.DQPN, r.SrcPort, r.DstPort)
		}
		if p, ok := portOf[r.DQPN]; ok && p != r.SrcPort {
			t.Errorf("QP %d's packets from ports %d and %d", r.DQPN, p, r.SrcPort)
		}
		portOf[r.DQPN] = r.SrcPort
		ports[r.SrcPort] = true
	}
	if len(portOf) != nqp || sourcePorts > 0 && len(ports) < 4 || sourcePorts == 0 && len(ports) != 1 {
		t.Errorf("%d QPs' packets from %d ports: %v", len(portOf), len(ports), portOf)
	}
	t.Logf("source ports by destination QP: %v", portOf)
}
