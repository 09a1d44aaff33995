package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// The command line follows the C tools rxego stands in for, which parse
// with GNU getopt_long: short options cluster (-vV), take their value
// attached or apart (-s64, -s 64), long options take --name=value or
// --name value, and operands may sit among the options. Go's flag package
// already reads -name and --name alike; parseArgs adds the clustering and
// the operands in between, and alias adds the C tools' long spellings.
// This keeps every existing single-dash rxego flag (-timeout 3s) working,
// which a GNU-only flag library (pflag) would turn into a cluster of
// short options, and adds no dependency.

// errHelp is what a command returns after printing its usage for -h.
var errHelp = flag.ErrHelp

// usageError is a command line rxego cannot use: main prints it with a
// hint to run -h, and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usageErrorf returns a usageError.
func usageErrorf(format string, a ...any) error {
	return &usageError{fmt.Sprintf(format, a...)}
}

// aliases maps a flag set to its long aliases: alias name -> flag name.
// Guarded by aliasMu: commands run concurrently in tests. A flag set's
// own map is written and read by the goroutine that builds and parses it.
var (
	aliasMu sync.Mutex
	aliases = map[*flag.FlagSet]map[string]string{}
)

// aliasesOf returns fs's aliases (alias name -> flag name), making the
// map when create is set.
func aliasesOf(fs *flag.FlagSet, create bool) map[string]string {
	aliasMu.Lock()
	defer aliasMu.Unlock()
	m := aliases[fs]
	if m == nil && create {
		m = map[string]string{}
		aliases[fs] = m
	}
	return m
}

// alias makes each name in longs another spelling of the flag name.
func alias(fs *flag.FlagSet, name string, longs ...string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("alias of undefined flag " + name)
	}
	m := aliasesOf(fs, true)
	for _, l := range longs {
		fs.Var(f.Value, l, "same as -"+name)
		m[l] = name
	}
}

// isBool reports whether f takes no value.
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// expandShort rewrites getopt-style short options into Go flag's form:
// "-vV" becomes "-v -V", "-s64" becomes "-s=64". An argument that names a
// defined flag as a whole (-timeout), or that holds a letter that is not
// a flag, is left for flag.Parse.
func expandShort(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	valueNext := false // the previous argument is a flag that takes this one as value
	for i, a := range args {
		if valueNext {
			out = append(out, a)
			valueNext = false
			continue
		}
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			out = append(out, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil || strings.HasPrefix(a, "--") || len(a) == 2 {
			out = append(out, a)
			valueNext = f != nil && !hasValue && !isBool(f)
			continue
		}
		exp, next, ok := cluster(fs, a[1:])
		if !ok {
			out = append(out, a)
			continue
		}
		out = append(out, exp...)
		valueNext = next
	}
	return out
}

// cluster expands the letters of one getopt cluster; next reports that
// its last option takes the following argument as value.
func cluster(fs *flag.FlagSet, letters string) (out []string, next, ok bool) {
	for j := 0; j < len(letters); j++ {
		f := fs.Lookup(letters[j : j+1])
		if f == nil {
			return nil, false, false
		}
		if isBool(f) {
			out = append(out, "-"+f.Name)
			continue
		}
		if rest := letters[j+1:]; rest != "" {
			return append(out, "-"+f.Name+"="+strings.TrimPrefix(rest, "=")), false, true
		}
		return append(out, "-"+f.Name), true, true
	}
	return out, false, true
}

// parseArgs parses args into fs as getopt_long would (see above) and
// returns the operands. -h and --help print the usage on stdout and
// return errHelp; a flag error returns a one-line usageError.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard) // flag's own usage dump on errors is replaced by a hint
	rest := expandShort(fs, args)
	var operands []string
	for {
		err := fs.Parse(rest)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.Usage()
			return nil, errHelp
		}
		if err != nil {
			return nil, &usageError{asTyped(err.Error(), args)}
		}
		if fs.NArg() == 0 {
			return operands, nil
		}
		// flag stops at the first operand, or after "--": everything
		// after "--" is an operand.
		consumed := len(rest) - fs.NArg()
		if consumed > 0 && rest[consumed-1] == "--" {
			return append(operands, fs.Args()...), nil
		}
		operands = append(operands, fs.Arg(0))
		rest = fs.Args()[1:]
	}
}

// asTyped rewrites the flag package's "-name" in msg with the spelling
// the user typed ("--name"): flag reports every flag with one dash.
func asTyped(msg string, args []string) string {
	const undefined = "flag provided but not defined: -"
	name, ok := strings.CutPrefix(msg, undefined)
	if !ok {
		return msg
	}
	for _, a := range args {
		if n, _, _ := strings.Cut(a, "="); n == "--"+name {
			return undefined + "-" + name
		}
	}
	return msg
}

// printFlags writes fs's flags as "-s, --size N  usage", one entry per
// flag with its long aliases, in name order.
func printFlags(fs *flag.FlagSet) {
	w := fs.Output()
	long := map[string][]string{}
	for l, n := range aliasesOf(fs, false) {
		long[n] = append(long[n], l)
	}
	var lines []string
	fs.VisitAll(func(f *flag.Flag) {
		if _, isAlias := aliasesOf(fs, false)[f.Name]; isAlias {
			return
		}
		names := []string{dash(f.Name)}
		ls := long[f.Name]
		sort.Strings(ls)
		for _, l := range ls {
			names = append(names, dash(l))
		}
		head := "  " + strings.Join(names, ", ")
		if arg, _ := flag.UnquoteUsage(f); arg != "" && !isBool(f) {
			head += " " + arg
		}
		_, usage := flag.UnquoteUsage(f)
		if def := f.DefValue; def != "" && def != "0" && def != "0s" && def != "false" && !isBool(f) {
			usage += fmt.Sprintf(" (default %s)", quoteIfString(f, def))
		}
		lines = append(lines, head+"\n    \t"+strings.ReplaceAll(usage, "\n", "\n    \t"))
	})
	fmt.Fprintln(w, strings.Join(lines, "\n"))
}

// dash is "-n" for a one-letter flag and "--name" for a longer one, as
// the C tools print them.
func dash(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

func quoteIfString(f *flag.Flag, def string) string {
	if arg, _ := flag.UnquoteUsage(f); arg == "string" {
		return strconv.Quote(def)
	}
	return def
}

// parseFlags is parseArgs for a command that takes no operands: one is a
// usage error, as is a flag named in positives that was given a number
// below 1.
func parseFlags(fs *flag.FlagSet, args []string, positives ...string) error {
	operands, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(operands) > 0 {
		return usageErrorf("unexpected argument %q", operands[0])
	}
	return positive(fs, positives...)
}

// positive checks that each named flag given on the command line holds a
// number of at least 1: counts, sizes and depths where 0 would otherwise
// silently mean "the default".
func positive(fs *flag.FlagSet, names ...string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		name := f.Name
		if n, ok := aliasesOf(fs, false)[name]; ok {
			name = n
		}
		for _, want := range names {
			if name != want || err != nil {
				continue
			}
			if v, perr := strconv.ParseInt(f.Value.String(), 0, 64); perr != nil || v < 1 {
				err = usageErrorf("%s %s: must be at least 1", dash(f.Name), f.Value)
			}
		}
	})
	return err
}

// inRange checks that v lies in [lo, hi] for the flag spelled name.
func inRange(name string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return usageErrorf("%s %d: want %d to %d", dash(name), v, lo, hi)
	}
	return nil
}
