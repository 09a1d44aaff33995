package setupcheck

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// notInstalled are programs the Go code may run that setup.sh rightly
// does not install, each with the reason.
var notInstalled = map[string]string{
	"go":                  "the Go toolchain: a prerequisite of the whole project (README)",
	"chromium-browser":    "an alternative name tried after chromium, which setup installs",
	"google-chrome":       "an alternative name tried after chromium, which setup installs",
	"/nonexistent/binary": "the guest agent's test of a program that is not there",
}

// mustFind are programs the scan must see, or the scan itself is broken.
var mustFind = []string{"ip", "nft", "ethtool", "tcpdump", "tshark", "mergecap", "qemu-system-x86_64",
	"chromium", "setpriv", "ibv_rc_pingpong", "rping", "rdma"}

// TestSetupInstallsEveryProgram fails when the Go code runs a program
// that conformance/setup.sh does not install and check with command -v.
func TestSetupInstallsEveryProgram(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	found, err := scan(root, "github.com/rxego/rxego")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "conformance/setup.sh"))
	if err != nil {
		t.Fatal(err)
	}
	listed, err := setupPrograms(string(script))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `command -v "$p"`) {
		t.Error(`setup.sh does not check its programs with command -v "$p"`)
	}
	for _, p := range mustFind {
		if _, ok := found[p]; !ok {
			t.Errorf("the scan did not find %q, which the code runs: the scanner misses a form of call", p)
		}
	}
	names := make([]string, 0, len(found))
	for p := range found {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if _, ok := notInstalled[p]; ok || listed[p] {
			continue
		}
		t.Errorf("%s runs %q, which conformance/setup.sh does not install: add its Debian package to pkgs and %q to programs",
			found[p][0], p, p)
	}
	t.Logf("programs the Go code runs: %s", strings.Join(names, " "))
}

// TestScanFinds runs the scanner over a fixture with every form of call
// it follows, to show it sees each (and only the programs there are).
func TestScanFinds(t *testing.T) {
	found, err := scan("testdata/fixture", "example.com/fixture")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for p := range found {
		got = append(got, p)
	}
	sort.Strings(got)
	want := []string{"alt1", "alt2", "argvfield", "closure", "constprog", "direct", "ip", "lookpath",
		"netnsarg", "netnsvar", "viactx", "viawrapper", "viawrapper2", "wrapargv"}
	if !slices.Equal(got, want) {
		t.Fatalf("scan found %v\nwant %v", got, want)
	}
}

// setupPrograms returns the names in setup.sh's programs=( ... ) array.
func setupPrograms(script string) (map[string]bool, error) {
	m := regexp.MustCompile(`(?ms)^programs=\((.*?)\)`).FindStringSubmatch(script)
	if m == nil {
		return nil, fmt.Errorf("conformance/setup.sh has no programs=( ... ) array")
	}
	out := map[string]bool{}
	for _, line := range strings.Split(m[1], "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, f := range strings.Fields(line) {
			out[f] = true
		}
	}
	return out, nil
}

// The scanner: it type-checks every package of the module from source
// (imports from outside the module become empty packages; the errors
// that causes are ignored) and follows program names through calls.

type progParam struct {
	index int
	argv  bool // the program is the first element of a []string or variadic parameter
}

type paramRef struct {
	fn    string // function key
	index int
}

type elem struct {
	expr   ast.Expr
	spread *paramRef // a parameter spread here (argv...)
}

type pkgFiles struct {
	name  string
	files []*ast.File
	tests []*ast.File // in-package tests
	xtest []*ast.File // package name_test
}

type scanner struct {
	fset     *token.FileSet
	pkgs     map[string]*pkgFiles // by import path
	imported map[string]*types.Package
	wrappers map[string][]progParam
	found    map[string][]string

	unitState // of the package being analysed
}

// unitState is what the scanner knows of one type-checked package.
type unitState struct {
	files  []*ast.File
	info   *types.Info
	params map[*types.Var]paramRef
	inits  map[*types.Var]ast.Expr
	ranges map[*types.Var]ast.Expr
}

// scan returns the programs the Go code under root (module path module)
// runs, each with the places it is named.
func scan(root, module string) (map[string][]string, error) {
	s := &scanner{fset: token.NewFileSet(), pkgs: map[string]*pkgFiles{}, imported: map[string]*types.Package{},
		wrappers: map[string][]progParam{}, found: map[string][]string{}}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(s.fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		ip := module
		if rel != "." {
			ip += "/" + filepath.ToSlash(rel)
		}
		p := s.pkgs[ip]
		if p == nil {
			p = &pkgFiles{}
			s.pkgs[ip] = p
		}
		switch pn := f.Name.Name; {
		case strings.HasSuffix(pn, "_test"):
			p.xtest = append(p.xtest, f)
		case strings.HasSuffix(name, "_test.go"):
			p.name = pn
			p.tests = append(p.tests, f)
		default:
			p.name = pn
			p.files = append(p.files, f)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(s.pkgs))
	for ip := range s.pkgs {
		paths = append(paths, ip)
	}
	sort.Strings(paths)
	type unit struct {
		path  string
		files []*ast.File
	}
	var units []unit
	for _, ip := range paths {
		p := s.pkgs[ip]
		if all := append(slices.Clone(p.files), p.tests...); len(all) > 0 {
			units = append(units, unit{ip, all})
		}
		if len(p.xtest) > 0 {
			units = append(units, unit{ip + "_test", p.xtest})
		}
	}
	states := make([]unitState, len(units))
	for i, u := range units {
		states[i] = s.prepare(u.path, u.files)
	}
	// Wrappers found in one pass make calls to them count in the next.
	for n := -1; n != s.nwrappers(); {
		n = s.nwrappers()
		for i := range states {
			s.unitState = states[i]
			for _, f := range states[i].files {
				ast.Inspect(f, s.visit)
			}
		}
	}
	return s.found, nil
}

func (s *scanner) nwrappers() int {
	n := 0
	for _, w := range s.wrappers {
		n += len(w)
	}
	return n
}

// Import implements types.Importer: the module's packages from source,
// others as empty packages.
func (s *scanner) Import(path string) (*types.Package, error) {
	if p, ok := s.imported[path]; ok {
		return p, nil
	}
	if pf, ok := s.pkgs[path]; ok && len(pf.files) > 0 {
		p, _ := s.check(path, pf.files, nil)
		s.imported[path] = p
		return p, nil
	}
	name := filepath.Base(path)
	if majorVersion.MatchString(name) {
		name = filepath.Base(filepath.Dir(path))
	}
	p := types.NewPackage(path, strings.ReplaceAll(name, "-", "_"))
	p.MarkComplete()
	s.imported[path] = p
	return p, nil
}

// majorVersion matches a module path's major version suffix (/v2).
var majorVersion = regexp.MustCompile(`^v[0-9]+$`)

func (s *scanner) check(path string, files []*ast.File, info *types.Info) (*types.Package, error) {
	conf := types.Config{Importer: s, Error: func(error) {}, FakeImportC: true}
	return conf.Check(path, s.fset, files, info)
}

// prepare type-checks one package and records its parameters, variables'
// first values and range variables.
func (s *scanner) prepare(path string, files []*ast.File) unitState {
	s.unitState = unitState{files: files, info: &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}},
		params: map[*types.Var]paramRef{}, inits: map[*types.Var]ast.Expr{}, ranges: map[*types.Var]ast.Expr{}}
	s.check(path, files, s.info)
	for _, f := range files {
		ast.Inspect(f, s.collect)
	}
	return s.unitState
}

// collect records parameters, variables' first values and range variables.
func (s *scanner) collect(n ast.Node) bool {
	switch n := n.(type) {
	case *ast.FuncDecl:
		if fn, ok := s.info.Defs[n.Name].(*types.Func); ok {
			s.addParams(funcKey(fn), n.Type)
		}
	case *ast.AssignStmt:
		for i, l := range n.Lhs {
			id, ok := l.(*ast.Ident)
			if !ok || len(n.Rhs) != len(n.Lhs) {
				continue
			}
			v, ok := s.info.Defs[id].(*types.Var)
			if !ok {
				continue
			}
			s.inits[v] = n.Rhs[i]
			if lit, ok := n.Rhs[i].(*ast.FuncLit); ok {
				s.addParams(varKey(s.fset, v), lit.Type)
			}
		}
	case *ast.ValueSpec:
		for i, id := range n.Names {
			if v, ok := s.info.Defs[id].(*types.Var); ok && i < len(n.Values) {
				s.inits[v] = n.Values[i]
				if lit, ok := n.Values[i].(*ast.FuncLit); ok {
					s.addParams(varKey(s.fset, v), lit.Type)
				}
			}
		}
	case *ast.RangeStmt:
		if id, ok := n.Value.(*ast.Ident); ok {
			if v, ok := s.info.Defs[id].(*types.Var); ok {
				s.ranges[v] = n.X
			}
		}
	}
	return true
}

func (s *scanner) addParams(key string, ft *ast.FuncType) {
	i := 0
	for _, f := range ft.Params.List {
		if len(f.Names) == 0 {
			i++
			continue
		}
		for _, id := range f.Names {
			if v, ok := s.info.Defs[id].(*types.Var); ok {
				s.params[v] = paramRef{key, i}
			}
			i++
		}
	}
}

func funcKey(fn *types.Func) string {
	key := fn.Name()
	if fn.Pkg() != nil {
		key = fn.Pkg().Path() + "." + key
	}
	if sig, ok := fn.Type().(*types.Signature); ok && sig.Recv() != nil {
		t := sig.Recv().Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := t.(*types.Named); ok && n.Obj().Pkg() != nil {
			key = n.Obj().Pkg().Path() + "." + n.Obj().Name() + "." + fn.Name()
		}
	}
	return key
}

func varKey(fset *token.FileSet, v *types.Var) string {
	return "closure@" + fset.Position(v.Pos()).String()
}

// visit looks at calls and Argv fields.
func (s *scanner) visit(n ast.Node) bool {
	switch n := n.(type) {
	case *ast.CallExpr:
		s.call(n)
	case *ast.KeyValueExpr:
		if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Argv" {
			s.cmdline(s.expand(n.Value, 0), 0)
		}
	}
	return true
}

func (s *scanner) call(c *ast.CallExpr) {
	var key string
	switch fun := c.Fun.(type) {
	case *ast.SelectorExpr:
		if x, ok := fun.X.(*ast.Ident); ok {
			if pn, ok := s.info.Uses[x].(*types.PkgName); ok && pn.Imported().Path() == "os/exec" {
				switch fun.Sel.Name {
				case "Command":
					s.cmdline(s.args(c, 0), 0)
				case "CommandContext":
					s.cmdline(s.args(c, 1), 0)
				case "LookPath":
					if len(c.Args) == 1 {
						s.prog(c.Args[0], 0)
					}
				}
				return
			}
		}
		if fn, ok := s.info.Uses[fun.Sel].(*types.Func); ok {
			key = funcKey(fn)
		}
	case *ast.Ident:
		switch o := s.info.Uses[fun].(type) {
		case *types.Func:
			key = funcKey(o)
		case *types.Var:
			key = varKey(s.fset, o)
		}
	}
	for _, w := range s.wrappers[key] {
		switch {
		case !w.argv:
			if w.index < len(c.Args) && !(c.Ellipsis.IsValid() && w.index == len(c.Args)-1) {
				s.prog(c.Args[w.index], 0)
			}
		case s.variadicAt(c, w.index):
			s.cmdline(s.args(c, w.index), 0)
		case w.index < len(c.Args):
			s.cmdline(s.expand(c.Args[w.index], 0), 0)
		}
	}
}

// variadicAt reports whether parameter i of c's callee is its variadic one.
func (s *scanner) variadicAt(c *ast.CallExpr, i int) bool {
	var obj types.Object
	switch fun := c.Fun.(type) {
	case *ast.SelectorExpr:
		obj = s.info.Uses[fun.Sel]
	case *ast.Ident:
		obj = s.info.Uses[fun]
	}
	if obj == nil {
		return false
	}
	sig, ok := obj.Type().Underlying().(*types.Signature)
	return ok && sig.Variadic() && i == sig.Params().Len()-1
}

// args returns c's arguments from i on, a final spread expanded.
func (s *scanner) args(c *ast.CallExpr, from int) []elem {
	var out []elem
	for i := from; i < len(c.Args); i++ {
		if c.Ellipsis.IsValid() && i == len(c.Args)-1 {
			return append(out, s.expand(c.Args[i], 0)...)
		}
		out = append(out, elem{expr: c.Args[i]})
	}
	return out
}

// expand returns the elements of a []string expression, as far as known.
func (s *scanner) expand(e ast.Expr, depth int) []elem {
	if depth > 8 {
		return nil
	}
	switch e := e.(type) {
	case *ast.CompositeLit:
		out := make([]elem, len(e.Elts))
		for i, x := range e.Elts {
			out[i] = elem{expr: x}
		}
		return out
	case *ast.Ident:
		v, ok := s.info.Uses[e].(*types.Var)
		if !ok {
			return nil
		}
		if ref, ok := s.params[v]; ok {
			return []elem{{spread: &ref}}
		}
		if init, ok := s.inits[v]; ok {
			return s.expand(init, depth+1)
		}
	case *ast.CallExpr:
		if id, ok := e.Fun.(*ast.Ident); ok && id.Name == "append" && len(e.Args) > 0 {
			out := s.expand(e.Args[0], depth+1)
			if len(out) == 0 || out[len(out)-1].spread != nil {
				return out
			}
			for i, a := range e.Args[1:] {
				if e.Ellipsis.IsValid() && i == len(e.Args)-2 {
					return append(out, s.expand(a, depth+1)...)
				}
				out = append(out, elem{expr: a})
			}
			return out
		}
	}
	return nil
}

// cmdline handles a command line: its first element is a program, and
// `ip netns exec NS PROG ...` runs PROG too.
func (s *scanner) cmdline(argv []elem, depth int) {
	if len(argv) == 0 {
		return
	}
	if ref := argv[0].spread; ref != nil {
		s.addWrapper(*ref, true)
		return
	}
	s.prog(argv[0].expr, depth)
	if s.str(argv[0].expr) == "ip" && len(argv) >= 5 && argv[1].spread == nil && argv[2].spread == nil &&
		s.str(argv[1].expr) == "netns" && s.str(argv[2].expr) == "exec" && argv[4].spread == nil {
		s.prog(argv[4].expr, depth)
	} else if s.str(argv[0].expr) == "ip" && len(argv) >= 5 && argv[4].spread != nil {
		s.addWrapper(*argv[4].spread, true)
	}
}

// str returns e's constant string value, or "".
func (s *scanner) str(e ast.Expr) string {
	if e == nil {
		return ""
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			v, _ := strconv.Unquote(e.Value)
			return v
		}
	case *ast.Ident:
		if c, ok := s.info.Uses[e].(*types.Const); ok && c.Val().Kind() == constant.String {
			return constant.StringVal(c.Val())
		}
	}
	return ""
}

// prog records the program(s) e names, or the wrapper whose parameter it is.
func (s *scanner) prog(e ast.Expr, depth int) {
	if depth > 8 {
		return
	}
	if v := s.str(e); v != "" {
		pos := s.fset.Position(e.Pos())
		if at := fmt.Sprintf("%s:%d", pos.Filename, pos.Line); !slices.Contains(s.found[v], at) {
			s.found[v] = append(s.found[v], at)
		}
		return
	}
	switch e := e.(type) {
	case *ast.Ident:
		v, ok := s.info.Uses[e].(*types.Var)
		if !ok {
			return
		}
		if ref, ok := s.params[v]; ok {
			s.addWrapper(ref, false)
		} else if x, ok := s.ranges[v]; ok {
			for _, el := range s.expand(x, depth+1) {
				if el.expr != nil {
					s.prog(el.expr, depth+1)
				}
			}
		} else if init, ok := s.inits[v]; ok {
			s.prog(init, depth+1)
		}
	case *ast.IndexExpr:
		if lit, ok := e.Index.(*ast.BasicLit); ok && lit.Value == "0" {
			if el := s.expand(e.X, depth+1); len(el) > 0 {
				s.cmdline(el[:1], depth+1)
			}
		}
	}
}

func (s *scanner) addWrapper(ref paramRef, argv bool) {
	p := progParam{ref.index, argv}
	if !slices.Contains(s.wrappers[ref.fn], p) {
		s.wrappers[ref.fn] = append(s.wrappers[ref.fn], p)
	}
}
