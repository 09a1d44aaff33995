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

// requesterText is the built-in requester-mode scenarios.
//
//go:embed scenarios/requester.txt
var requesterText string

// Builtin returns fresh copies of the built-in responder-mode scenarios.
// They parse at every call so a caller may change them freely.
func Builtin() []*Scenario { return mustParse(responderText) }

// BuiltinRequester returns fresh copies of the built-in requester-mode
// scenarios.
func BuiltinRequester() []*Scenario { return mustParse(requesterText) }

func mustParse(text string) []*Scenario {
	s, err := ParseScenarios(strings.NewReader(text))
	if err != nil {
		panic("probe: the built-in scenarios do not parse: " + err.Error()) // a build error, caught by the tests
	}
	return s
}
