package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/rxego/rxego/internal/demo"
)

func init() {
	register("demo", "a guided tour of RDMA operations between two loopback endpoints", runDemo)
}

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: rxego demo [scenario ...]\n\nscenarios (all by default): %s\n", strings.Join(demo.Names(), ", "))
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, n := range fs.Args() {
		if !contains(demo.Names(), n) {
			return fmt.Errorf("unknown scenario %q (have %s)", n, strings.Join(demo.Names(), ", "))
		}
	}
	t, err := demo.Open(os.Stdout)
	if err != nil {
		return err
	}
	defer t.Close()
	return t.Run(fs.Args()...)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
