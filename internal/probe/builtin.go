package probe

import (
	_ "embed"
	"strings"
)

// responderText is the built-in responder-mode scenarios, in the format
// users write their own in.
//
//go:embed scenarios/responder.txt
var responderText string

// Builtin returns fresh copies of the built-in responder-mode scenarios.
// They parse at every call so a caller may change them freely.
func Builtin() []*Scenario {
	s, err := ParseScenarios(strings.NewReader(responderText))
	if err != nil {
		panic("probe: the built-in scenarios do not parse: " + err.Error()) // a build error, caught by the tests
	}
	return s
}
