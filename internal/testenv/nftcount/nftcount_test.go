package nftcount

import "testing"

// TestParse reads counters out of nft's JSON and refuses what is not JSON.
func TestParse(t *testing.T) {
	out := []byte(`{"nftables": [{"metainfo": {"version": "1.0.6"}},
		{"counter": {"family": "ip", "name": "seen", "table": "t", "handle": 1, "packets": 12, "bytes": 960}},
		{"counter": {"family": "ip", "name": "marked", "table": "t", "handle": 2, "packets": 3, "bytes": 240}}]}`)
	c, err := Parse(out)
	if err != nil || len(c) != 2 || c["seen"] != 12 || c["marked"] != 3 {
		t.Fatalf("Parse: %v, %v", c, err)
	}
	if _, err := Parse([]byte("Error: no such table")); err == nil {
		t.Error("non-JSON accepted")
	}
}
