package ladder_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxego/rxego/internal/app/ladder"
	"github.com/rxego/rxego/internal/app/trace"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the captures")

// captures lists the captures with golden ladders: the real rxe traffic in
// testdata/pcaps and rxego's own recordings of loss, RNR and CNPs.
func captures(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob("../../../testdata/pcaps/*.pcap*")
	own, _ := filepath.Glob("testdata/rxego_*.pcapng")
	files = append(files, own...)
	if len(files) < 20 || len(own) != 3 {
		t.Fatalf("captures missing: %d in all, %d of rxego's own", len(files), len(own))
	}
	return files
}

// analyse reads a capture into a Trace.
func analyse(t *testing.T, path string) *ladder.Trace {
	t.Helper()
	b := ladder.NewBuilder()
	if err := trace.ReadFile(path, b.Add); err != nil {
		t.Fatal(err)
	}
	return b.Finish()
}

// TestGolden draws every capture's ladders in full, and the congestion
// recording folded to 40 rows, and compares them with the golden files
// (times in them are relative to each capture's first packet).
func TestGolden(t *testing.T) {
	for _, path := range captures(t) {
		name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		variants := map[string]ladder.TextOptions{name + ".txt": {}}
		if name == "rxego_cnp" {
			variants[name+".folded.txt"] = ladder.TextOptions{RowOptions: ladder.RowOptions{MaxRows: 40}}
		}
		for golden, o := range variants {
			t.Run(golden, func(t *testing.T) {
				var out bytes.Buffer
				if err := ladder.WriteText(&out, analyse(t, path), o); err != nil {
					t.Fatal(err)
				}
				checkGolden(t, filepath.Join("testdata", "golden", golden), out.Bytes())
			})
		}
	}
}

// checkGolden compares got with the golden file, or rewrites it with
// -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s differs at line %d:\ngot  %q\nwant %q\n(go test -update rewrites it)", path, i+1, g, w)
			}
		}
	}
}
