// Command rxego is the command-line face of rxego, a user-space RoCEv2
// stack: a guided demo, drop-in peers for rdma-core's pingpong and
// perftest tools, and a packet trace reader.
//
// Each subcommand lives in its own file and registers itself in init.
// Exit status: 0 on success and for -h, 1 when a run fails, 2 for a
// command line rxego cannot use (with a one-line hint).
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(args []string) error
	// cTool marks the name of a C tool (ibv_rc_pingpong, ib_write_bw,
	// rping, ...): it takes that tool's flags exactly, so that a tutorial's
	// command line runs with "rxego " in front.
	cTool bool
}

var commands = map[string]command{}

// register adds a subcommand; called from the init function of each
// subcommand's file.
func register(name, summary string, run func(args []string) error) {
	add(name, command{summary: summary, run: run})
}

// registerCTool adds the command named after a C tool, which takes that
// tool's flags exactly; summary names the tool it stands in for.
func registerCTool(name, summary string, run func(args []string) error) {
	add(name, command{summary: summary, run: run, cTool: true})
}

// add puts c in commands under name. A name taken twice is a programming
// error (two files' init functions claim one command, and which one ran
// would depend on file order), so it panics at start-up, naming it.
func add(name string, c command) {
	if _, dup := commands[name]; dup {
		panic("rxego: command " + strconv.Quote(name) + " registered twice")
	}
	commands[name] = c
}

func init() {
	register("version", "print rxego's version (module version and VCS revision)", runVersion)
	register("help", "print a command's usage: rxego help COMMAND", runHelp)
}

// usage lists the commands on w.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: rxego <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	tools := []string{"mckey", "rping", "ucmatose", "udaddy"} // commands under their C names already
	for _, n := range names {
		if commands[n].cTool {
			tools = append(tools, n)
			continue
		}
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nthe C tools' names, each taking that tool's flags exactly (put \"rxego \" in front")
	fmt.Fprintln(w, "of a tutorial's command line):")
	sort.Strings(tools)
	line := " "
	for _, n := range tools {
		if len(line)+1+len(n) > 78 {
			fmt.Fprintln(w, line)
			line = " "
		}
		line += " " + n
	}
	fmt.Fprintln(w, line)
	fmt.Fprintln(w, "\nrun 'rxego <command> -h' for a command's flags")
}

// runHelp prints the usage of the command named, or the list of commands.
func runHelp(args []string) error {
	if len(args) == 0 {
		usage(os.Stdout)
		return nil
	}
	c, ok := commands[args[0]]
	if !ok || args[0] == "help" {
		return &unknownCommandError{args[0]}
	}
	return c.run([]string{"-h"})
}

// runVersion prints the module version and the VCS revision the binary
// was built from, as debug.ReadBuildInfo reports them.
func runVersion(args []string) error {
	if len(args) > 0 {
		if len(args) == 1 && isHelp(args[0]) {
			fmt.Println("usage: rxego version\n\nPrints the module version, the VCS revision and time the binary was built from, and the Go version.")
			return nil
		}
		return usageErrorf("version takes no arguments")
	}
	fmt.Println(versionString())
	return nil
}

// versionString is "rxego VERSION (REVISION TIME[, modified]) GOVERSION".
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "rxego (no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, at, mod string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				mod = ", modified"
			}
		}
	}
	out := "rxego " + v
	if rev != "" {
		out += fmt.Sprintf(" (%s %s%s)", rev, at, mod)
	}
	return out + " " + bi.GoVersion
}

func isHelp(a string) bool { return a == "-h" || a == "--help" || a == "-help" }

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name := os.Args[1]
	if isHelp(name) {
		usage(os.Stdout)
		return
	}
	if name == "--version" || name == "-version" {
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "rxego: %v\ntry 'rxego help'\n", &unknownCommandError{name})
		os.Exit(2)
	}
	os.Exit(exitCode(os.Stderr, name, c.run(os.Args[2:])))
}

// exitCode reports err (if any) on w for command name and returns the exit
// status: 0 for nil or a help request, 2 for a usage error (with a hint),
// 1 otherwise.
func exitCode(w io.Writer, name string, err error) int {
	if err == nil || errors.Is(err, errHelp) {
		return 0
	}
	fmt.Fprintf(w, "rxego %s: %s\n", name, trimPrefixes(err.Error(), name))
	if h := hint(err); h != "" {
		fmt.Fprintf(w, "hint: %s\n", h)
	}
	if errors.As(err, new(*unknownCommandError)) {
		fmt.Fprintln(w, "try 'rxego help' for the list of commands")
		return 2
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(w, "try 'rxego %s -h'\n", name)
		return 2
	}
	return 1
}

// unknownCommandError names a command rxego does not have.
type unknownCommandError struct{ name string }

func (e *unknownCommandError) Error() string { return fmt.Sprintf("unknown command %q", e.name) }

// libraryPrefix is the prefix the library behind a command puts on its
// errors, where it is not the command's name.
func libraryPrefix(name string) string {
	switch {
	case name == "perf" || strings.HasPrefix(name, "ib_"):
		return "perftest: "
	case name == "ucmatose":
		return "cmatose: "
	case name == "pingpong" || strings.HasPrefix(name, "ibv_"):
		return "pingpong: "
	}
	return ""
}

// trimPrefixes drops a leading "rxego: ", "NAME: " or the command's
// library prefix from msg: the line already starts with "rxego NAME: ",
// and the libraries prefix their own errors for their callers.
func trimPrefixes(msg, name string) string {
	for changed := true; changed; {
		changed = false
		for _, p := range []string{"rxego: ", name + ": ", libraryPrefix(name)} {
			if p == "" {
				continue
			}
			if strings.HasPrefix(msg, p) {
				msg, changed = msg[len(p):], true
			}
		}
	}
	return msg
}

// hint says what to do about some errors the user can fix.
func hint(err error) string {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return ""
	}
	var fe *flagListenError
	if errors.As(err, &fe) {
		return "another program listens on this TCP port; give " + fe.flag + " another port (HOST:0 takes any free one)"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && strings.HasPrefix(oe.Net, "tcp") {
		return "another program listens on this TCP port; end it or pick another port with -p (on both sides)"
	}
	// The device's UDP socket (package transport binds it itself).
	return "another rxego, or the kernel's rdma_rxe (a rxe device on this address's interface), " +
		"holds UDP port 4791 on this address; give rxego another local address (on loopback any other 127.x.y.z works), " +
		"or remove the rxe device (rdma link delete rxe0)"
}
