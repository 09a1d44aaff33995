package rsocket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// TestConnDataLayout checks struct rs_conn_data's bytes: big-endian
// fields at rsocket.c's offsets.
func TestConnDataLayout(t *testing.T) {
	d := connData{version: 1, flags: flagIOMap, credits: 384, iomapSize: scaleOf(200),
		targetSGL: sge{addr: 0x1122334455667788, key: 0xaabbccdd, length: 2},
		dataBuf:   sge{addr: 0x0102030405060708, key: 0x11223344, length: 65536}}
	want := []byte{1, 2, 0x01, 0x80, 0, 0, 0, 0x80,
		0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 2,
		1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 1, 0, 0}
	got := d.marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("marshal:\n got %x\nwant %x", got, want)
	}
	back, err := parseConnData(append(got, make([]byte, 16)...)) // REP padding
	if err != nil || back != d {
		t.Fatalf("parse: %+v, %v", back, err)
	}
	if valueOf(back.iomapSize) != 128 || valueOf(scaleOf(512)) != 512 || valueOf(scaleOf(100)) != 100 {
		t.Fatalf("iomap scale: 200 -> %d, 512 -> %d, 100 -> %d", valueOf(back.iomapSize), valueOf(scaleOf(512)), valueOf(scaleOf(100)))
	}
}

// TestConnDataBad: private data that is no rsocket v1's is refused with
// an error naming the field.
func TestConnDataBad(t *testing.T) {
	good := connData{version: 1, credits: 16, targetSGL: sge{length: 2}, dataBuf: sge{length: 4096}}.marshal()
	for name, mut := range map[string]func([]byte) []byte{
		"short":     func(b []byte) []byte { return b[:39] },
		"version 2": func(b []byte) []byte { b[0] = 2; return b },
		"no credits": func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[2:], 0)
			return b
		},
		"empty buffer": func(b []byte) []byte { clear(b[36:40]); return b },
	} {
		if _, err := parseConnData(mut(bytes.Clone(good))); !errors.Is(err, errBadConnData) {
			t.Errorf("%s: %v, want errBadConnData", name, err)
		}
	}
}

// TestMsgFormat: the op in the top 3 bits, the datum in the lower 29.
func TestMsgFormat(t *testing.T) {
	m := msgSet(opSGL, 0x1ffff)
	if m != 0x8001ffff || msgOp(m) != opSGL || msgData(m) != 0x1ffff {
		t.Fatalf("msgSet(SGL, 0x1ffff) = %#x", m)
	}
	if m := msgSet(opCtrl, ctrlShutdown); m != 0xe0000002 {
		t.Fatalf("SHUTDOWN = %#x", m)
	}
}

// TestConfigErrors: bad settings and addresses are refused with an error
// that names them, and nothing is created.
func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{SendBuffer: -1}, {RecvQueue: -5}, {KeepAlive: -1}, {IOMapSize: 1 << 16}, {RecvBuffer: 2 << 30}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	o, err := (&Config{RecvBuffer: 5001, RecvQueue: 3, SendQueue: 1 << 20, Inline: -1}).withDefaults()
	if err != nil || o.RecvBuffer != 5000 || o.RecvQueue != minQueue || o.SendQueue != maxQueue || o.Inline != 0 || o.SendBuffer != defaultBuffer {
		t.Errorf("clamping: %+v, %v", o, err)
	}
	p := newPair(t, nil)
	if _, err := Listen(p.srv, "10.9.9.9:7471", nil); err == nil || !strings.Contains(err.Error(), "not the device's address") {
		t.Errorf("Listen on another address: %v", err)
	}
	if _, err := Dial(p.cli, "nohostport", nil); err == nil {
		t.Error("Dial without a port succeeded")
	}
	if _, err := Listen(p.srv, ":7471", &Config{SendQueue: -1}); err == nil {
		t.Error("Listen with a negative queue succeeded")
	}
}
