package lab

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// agentName is the agent's file name in a lab's share directory; the guest
// init runs /run/rxego/<agentName>.
const agentName = "rxego-agent"

var agentBuild struct {
	once sync.Once
	path string
	err  error
}

// agentBinary returns the path of a static agent binary: $RXEGO_AGENT if
// set, else one built once per process from this source tree into
// <cacheDir>/bin.
func agentBinary(cacheDir string) (string, error) {
	if p := os.Getenv("RXEGO_AGENT"); p != "" {
		return p, nil
	}
	agentBuild.once.Do(func() {
		agentBuild.path, agentBuild.err = buildAgent(cacheDir)
	})
	return agentBuild.path, agentBuild.err
}

func buildAgent(cacheDir string) (string, error) {
	bin := filepath.Join(cacheDir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	// Build to a private name and rename, so that test binaries of several
	// packages building at once never see a half-written agent.
	tmp, err := os.CreateTemp(bin, agentName+".tmp*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp.Name(), "./conformance/agent")
	cmd.Dir = sourceRoot()
	// GOFLAGS from `go test -race` would ask for cgo; the guest needs a
	// static binary.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building guest agent in %s: %v: %s", cmd.Dir, err, strings.TrimSpace(string(out)))
	}
	final := filepath.Join(bin, agentName)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}

// linkOrCopy makes dst a hard link to src, or a copy when linking fails
// (different file systems).
func linkOrCopy(src, dst string) error {
	os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
