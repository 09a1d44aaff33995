// Package nftcount reads named nftables counters from `nft -j list
// counters` output, for the tests that drop or mark packets with nftables
// and count what the rules did.
package nftcount

import (
	"encoding/json"
	"fmt"
)

// Parse returns the packet count of every named counter in the JSON that
// `nft -j list counters ...` prints.
func Parse(out []byte) (map[string]uint64, error) {
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name    string `json:"name"`
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("nft -j: %w", err)
	}
	c := map[string]uint64{}
	for _, o := range doc.Nftables {
		if o.Counter != nil {
			c[o.Counter.Name] = o.Counter.Packets
		}
	}
	return c, nil
}
