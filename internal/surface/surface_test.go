// Package surface checks Ratchet's public API: the exported names of each
// public package are those in testdata/surface.golden (so that nothing
// joins the surface by accident), and every exported function, type and
// method is used by a runnable example, so that each has code showing what
// it is for. Example code is a file with a runnable example (an Example
// function with an Output comment) and the tests of the programs in
// examples/, which use the test kit as adopters will. Constants and variables (statuses, codes, sentinel errors,
// defaults) are pinned by the golden file and documented where they are
// declared; methods that satisfy the standard interfaces (Error, Unwrap,
// String, ServeHTTP) count as used when their type is.
package surface

import (
	"flag"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
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

// exampleUses returns the objects the repository's example code refers
// to (see below), as
// "importpath.Name" or "importpath.Type.Method", resolved by the type
// checker. Each example file is checked on its own, so references to
// helpers in its package's other test files go unresolved (and are not
// needed: only the public packages' objects are counted).
func exampleUses(t *testing.T, root string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	// The test files of each package, by directory and package name.
	packages := map[[2]string][]*ast.File{}
	examplesDir := filepath.Join(root, "examples") + string(filepath.Separator)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		key := [2]string{filepath.Dir(path), f.Name.Name}
		packages[key] = append(packages[key], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	uses := map[string]bool{}
	imp := importer.ForCompiler(fset, "source", nil)
	for key, files := range packages {
		// Example code is every function of a file with a runnable
		// example (its helpers and types belong to it), and every test of
		// the example programs, which show the test kit at work.
		var examples []*ast.FuncDecl
		for _, f := range files {
			runnable := strings.HasPrefix(key[0]+string(filepath.Separator), examplesDir)
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") && hasOutput(f, fn) {
					runnable = true
				}
			}
			if !runnable {
				continue
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok {
					examples = append(examples, fn)
				}
			}
		}
		if len(examples) == 0 {
			continue
		}
		// An in-package test package sees unexported names the source
		// importer does not give (export_test.go): errors are expected,
		// and the information on the examples is complete nonetheless.
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Types: map[ast.Expr]types.TypeAndValue{}}
		conf := types.Config{Importer: imp, Error: func(error) {}}
		conf.Check(key[1], fset, files, info) //nolint:errcheck // see above
		for _, fn := range examples {
			ast.Inspect(fn, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					if k := objectKey(info.Uses[id]); k != "" {
						uses[k] = true
					}
				}
				// A value of a type uses the type, named or not (the run a
				// call returns, the outcome a switch reads).
				if e, ok := n.(ast.Expr); ok {
					if named := namedOf(info.Types[e].Type); named != nil {
						uses[objectKey(named.Obj())] = true
					}
				}
				return true
			})
		}
	}
	return uses
}

// namedOf returns the named type of t, through a pointer.
func namedOf(t types.Type) *types.Named {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	named, _ := t.(*types.Named)
	return named
}

// objectKey names a package-level object or a method of a named type.
func objectKey(obj types.Object) string {
	if obj == nil || obj.Pkg() == nil {
		return ""
	}
	if fn, ok := obj.(*types.Func); ok {
		if recv := fn.Signature().Recv(); recv != nil {
			t := recv.Type()
			if p, ok := t.(*types.Pointer); ok {
				t = p.Elem()
			}
			if named, ok := t.(*types.Named); ok {
				return obj.Pkg().Path() + "." + named.Obj().Name() + "." + fn.Name()
			}
			return ""
		}
	}
	if obj.Parent() != obj.Pkg().Scope() {
		return "" // a local, a field or a parameter
	}
	return obj.Pkg().Path() + "." + obj.Name()
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
		path := module + "/" + pkg + "."
		typeUsed := map[string]bool{}
		for _, n := range names {
			if typ, method, ok := strings.Cut(n.id, "."); ok && uses[path+n.id] && !implicit[method] {
				typeUsed[typ] = true // a method of it is called: the type is in use
			}
		}
		for _, n := range names {
			lines = append(lines, pkg+" "+n.id)
			typ, method, isMethod := strings.Cut(n.id, ".")
			switch {
			case n.value:
			case isMethod && implicit[method]:
				if !uses[path+typ] && !typeUsed[typ] {
					unused = append(unused, pkg+"."+n.id)
				}
			case isMethod:
				if !uses[path+n.id] {
					unused = append(unused, pkg+"."+n.id)
				}
			case !uses[path+n.id] && !typeUsed[n.id]:
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
