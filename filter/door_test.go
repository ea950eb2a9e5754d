package filter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The filter reaches the index and the decision plugins through dispatch
// only (docs/architecture.md, "The door"): what it names of index and
// scorer directly is the shared-data contract its store implements and the
// vocabulary dispatch's methods take and return. A call into either
// package (a query, a sync, a clock pin, a profile run) belongs behind a
// dispatch.Dispatcher method, where the simulator makes the same call.
func TestFilterReachesIndexAndScorerThroughDispatch(t *testing.T) {
	allowed := map[string][]string{
		"github.com/kvroute/kvroute/index": {
			"Store", "AppendGetter", "ErrNotFound", "ErrCASMismatch", // the store contract (store.go, state.go, report.go)
			"Load",                 // the load counters' type (dispatch.Dispatcher.Loads)
			"DefaultCharsPerToken", // a header-only request's token estimate
		},
		"github.com/kvroute/kvroute/scorer": {
			"Host", "Result", // the candidates and a decision's result, as dispatch takes and returns them
			"ParseRole", "RoleBoth", // a candidate's role, from configuration or pushed state
			"Load", "Handler", // the strategy, built from the configuration at plugin start
		},
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		local := map[string]string{} // import name -> path, for index and scorer
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if _, ok := allowed[path]; !ok {
				continue
			}
			n := filepath.Base(path)
			if imp.Name != nil {
				n = imp.Name.Name
			}
			local[n] = path
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			if path, ok := local[id.Name]; ok && !slices.Contains(allowed[path], sel.Sel.Name) {
				t.Errorf("%s: %s.%s: reach the %s package through a dispatch.Dispatcher method", fset.Position(sel.Pos()), id.Name, sel.Sel.Name, id.Name)
			}
			return true
		})
	}
}

// Test seams are Options given where the filters are built
// (NewVMContextWith), not package variables a test overwrites: no test
// assigns a package-level variable of the production code.
func TestTestsSetNoPackageVariables(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	prodVars := map[string]bool{}
	var tests []*ast.File
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "_test.go") {
			tests = append(tests, f)
			continue
		}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
				for _, s := range g.Specs {
					for _, n := range s.(*ast.ValueSpec).Names {
						prodVars[n.Name] = true
					}
				}
			}
		}
	}
	for _, f := range tests {
		ast.Inspect(f, func(n ast.Node) bool {
			a, ok := n.(*ast.AssignStmt)
			if !ok {
				return true
			}
			for _, l := range a.Lhs {
				// Obj is nil for a name declared in another file: the
				// package's own variables, not a test's locals.
				if id, ok := l.(*ast.Ident); ok && id.Obj == nil && id.Name != "_" && prodVars[id.Name] {
					t.Errorf("%s: a test sets the package variable %s: make it an Options field", fset.Position(id.Pos()), id.Name)
				}
			}
			return true
		})
	}
}
