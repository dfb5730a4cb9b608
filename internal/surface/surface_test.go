// Package surface checks Ratchet's public API: the exported names of each
// public package are those in testdata/surface.golden (so that nothing
// joins the surface by accident), and every exported function, type and
// method is used by a runnable example, so that each has code showing what
// it is for. Constants and variables (statuses, codes, sentinel errors,
// defaults) are pinned by the golden file and documented where they are
// declared; methods that satisfy the standard interfaces (Error, Unwrap,
// String, ServeHTTP) count as used when their type is.
package surface

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// public lists the packages an adopter imports, relative to the module.
var public = []string{"engine", "engine/enginetest", "api", "worker", "recovery", "steps", "migrations"}

const module = "github.com/ratchet-run/ratchet"

var update = flag.Bool("update", false, "rewrite testdata/surface.golden")

// name is an exported name of a package.
type name struct {
	id    string // "Name", or "Type.Method"
	value bool   // a constant or a variable
}

// exported returns the package's exported names: functions, types,
// constants and variables, and methods of exported types, read from its
// non-test files.
func exported(t *testing.T, dir string) []name {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []name
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					if d.Recv == nil {
						names = append(names, name{id: d.Name.Name})
						continue
					}
					if recv := receiverType(d.Recv.List[0].Type); ast.IsExported(recv) {
						names = append(names, name{id: recv + "." + d.Name.Name})
					}
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.TypeSpec:
							if s.Name.IsExported() {
								names = append(names, name{id: s.Name.Name})
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								if n.IsExported() {
									names = append(names, name{id: n.Name, value: true})
								}
							}
						}
					}
				}
			}
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i].id < names[j].id })
	return names
}

// implicit are methods called through standard interfaces, not by name.
var implicit = map[string]bool{"Error": true, "Unwrap": true, "String": true, "ServeHTTP": true}

func receiverType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return receiverType(x.X)
	case *ast.IndexExpr:
		return receiverType(x.X)
	case *ast.IndexListExpr:
		return receiverType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// exampleUses returns what the repository's runnable examples (Example
// functions with an Output comment) refer to: "importpath.Name" for
// qualified identifiers, ".Name" for any other selector (a method or a
// field, whose type the parser does not know).
func exampleUses(t *testing.T, root string) map[string]bool {
	t.Helper()
	uses := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		imports := map[string]string{}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			name := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = p
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") || !hasOutput(f, fn) {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && imports[id.Name] != "" {
					uses[imports[id.Name]+"."+sel.Sel.Name] = true
				} else {
					uses["."+sel.Sel.Name] = true
				}
				return true
			})
			// Composite literals name fields without a selector.
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if kv, ok := n.(*ast.KeyValueExpr); ok {
					if id, ok := kv.Key.(*ast.Ident); ok {
						uses["."+id.Name] = true
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return uses
}

// hasOutput reports whether fn ends with an Output comment, which makes
// go test run it and check what it prints.
func hasOutput(f *ast.File, fn *ast.FuncDecl) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > fn.Body.Lbrace && cg.End() <= fn.Body.Rbrace {
			text := strings.TrimSpace(cg.Text())
			if strings.HasPrefix(text, "Output:") || strings.HasPrefix(text, "Unordered output:") {
				return true
			}
		}
	}
	return false
}

func TestSurface(t *testing.T) {
	root := filepath.Join("..", "..")
	var lines []string
	uses := exampleUses(t, root)
	var unused []string
	for _, pkg := range public {
		names := exported(t, filepath.Join(root, pkg))
		typeUsed := map[string]bool{}
		for _, n := range names {
			if typ, method, ok := strings.Cut(n.id, "."); ok && uses["."+method] && !implicit[method] {
				typeUsed[typ] = true // a method of it is called: the type is in use
			}
		}
		for _, n := range names {
			lines = append(lines, pkg+" "+n.id)
			typ, method, isMethod := strings.Cut(n.id, ".")
			switch {
			case n.value:
				continue
			case isMethod && implicit[method]:
				if !uses[module+"/"+pkg+"."+typ] && !typeUsed[typ] {
					unused = append(unused, pkg+"."+n.id)
				}
			case isMethod:
				if !uses["."+method] {
					unused = append(unused, pkg+"."+n.id)
				}
			case !uses[module+"/"+pkg+"."+n.id] && !typeUsed[n.id]:
				unused = append(unused, pkg+"."+n.id)
			}
		}
	}
	got := strings.Join(lines, "\n") + "\n"
	golden := filepath.Join("testdata", "surface.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the public surface changed; if that is meant, run go test ./internal/surface -update and review the diff of %s\n%s", golden, diff(string(want), got))
	}
	if len(unused) > 0 {
		t.Errorf("%d exported names are used by no runnable example (an Example function with an Output comment):\n  %s", len(unused), strings.Join(unused, "\n  "))
	}
}

// diff lists the lines only one side has.
func diff(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var out []string
	for l := range g {
		if !w[l] && l != "" {
			out = append(out, "+ "+l)
		}
	}
	for l := range w {
		if !g[l] && l != "" {
			out = append(out, "- "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
