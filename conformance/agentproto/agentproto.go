// Package agentproto defines the messages between the lab on the host
// (package lab) and the agent inside a lab guest (command agent).
//
// The transport is TCP (port DefaultPort on the guest's address); each
// message is one JSON object on its own line. A connection carries any
// number of request/response pairs in order; the host opens one connection
// per call so that a long Wait never holds up other calls.
package agentproto

// DefaultPort is the TCP port the agent listens on in the guest.
const DefaultPort = 7700

// Op names what a Request asks for.
type Op string

// The operations the agent understands.
const (
	// OpPing answers with the guest's kernel release and hostname.
	OpPing Op = "ping"
	// OpRun runs Argv to completion (bounded by TimeoutMS) and answers with
	// its exit status and output.
	OpRun Op = "run"
	// OpStart starts Argv in the background and answers with its ID.
	OpStart Op = "start"
	// OpWait waits up to TimeoutMS for process ID; Done tells whether it
	// ended. After a Done answer the ID is forgotten.
	OpWait Op = "wait"
	// OpKill sends Signal (default SIGKILL) to process ID's process group.
	OpKill Op = "kill"
	// OpOutput answers with the output of process ID so far.
	OpOutput Op = "output"
	// OpRead answers with the content of the file at Path.
	OpRead Op = "read"
	// OpGlob answers with the content of every regular file matching the
	// glob pattern Path.
	OpGlob Op = "glob"
	// OpWrite writes Data to the file at Path with permissions Mode.
	OpWrite Op = "write"
)

// MaxOutput bounds each of stdout and stderr the agent keeps per process;
// output past it is dropped and the response says Truncated.
const MaxOutput = 16 << 20

// MaxFile bounds what OpRead and OpGlob return per file.
const MaxFile = 64 << 20

// Request is one call from the host.
type Request struct {
	Op        Op       `json:"op"`
	Argv      []string `json:"argv,omitempty"`
	Env       []string `json:"env,omitempty"` // KEY=VALUE, added to the agent's environment
	Dir       string   `json:"dir,omitempty"`
	Stdin     []byte   `json:"stdin,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"` // OpRun: kill after; OpWait: give up after
	ID        uint64   `json:"id,omitempty"`
	Signal    int      `json:"signal,omitempty"`
	Path      string   `json:"path,omitempty"`
	Data      []byte   `json:"data,omitempty"`
	Mode      uint32   `json:"mode,omitempty"`
}

// Response answers one Request. Error is set when the request itself failed
// (bad request, command not found, unknown ID); a command that ran and
// exited non-zero is not an Error.
type Response struct {
	Error      string            `json:"error,omitempty"`
	ID         uint64            `json:"id,omitempty"`
	Done       bool              `json:"done,omitempty"`
	ExitCode   int               `json:"exit_code"` // -1 when ended by a signal
	Signal     string            `json:"signal,omitempty"`
	TimedOut   bool              `json:"timed_out,omitempty"`
	Truncated  bool              `json:"truncated,omitempty"`
	Stdout     []byte            `json:"stdout,omitempty"`
	Stderr     []byte            `json:"stderr,omitempty"`
	DurationNS int64             `json:"duration_ns,omitempty"`
	Data       []byte            `json:"data,omitempty"`
	Files      map[string][]byte `json:"files,omitempty"`
	Release    string            `json:"release,omitempty"`
	Hostname   string            `json:"hostname,omitempty"`
}
