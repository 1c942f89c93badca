// Command floors checks the house rules of the module's import graph that
// the compiler does not (docs/architecture.md, "Floors"): nothing in cuda/
// or internal/ imports core/; the pure packages reach nothing of the
// operating system, even through the standard library; the capability
// package opens no socket; and no function of the library is longer than
// a reader can hold (80 lines), no module of the Python package longer
// than 600. make vet runs it; it prints every breach and exits 1 if there
// is one.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

const module = "github.com/kvbm/kvbm"

// pure are the packages that must not reach the operating system, and what
// they must not reach.
var pure = map[string][]string{
	"./core/layout":            {"os", "time", "net", "syscall"},
	"./core/pool":              {"os", "time", "net", "syscall"},
	"./core/handoff":           {"os", "time", "net", "syscall"},
	"./core/loadplan":          {"os", "time", "net", "syscall"},
	"./kvbmerr":                {"os", "time", "net", "syscall", "context"},
	"./core/remote/capability": {"net"},
}

// library is where the 80-line limit holds (cmd/ and tests are not the
// library).
var library = []string{"capi", "core", "cuda", "internal", "kvbmerr"}

const maxLines = 80

func main() {
	var breaches []string
	for _, floor := range []string{"./cuda/...", "./internal/..."} {
		for pkg, imports := range goList("{{.ImportPath}}:{{join .Imports \" \"}}", floor) {
			for _, imp := range imports {
				if strings.HasPrefix(imp, module+"/core/") {
					breaches = append(breaches, pkg+" imports "+imp+" (a floor up)")
				}
			}
		}
	}
	for pkg, banned := range pure {
		deps := goList("{{.ImportPath}}", "-deps", pkg)
		for _, b := range banned {
			if _, ok := deps[b]; ok {
				breaches = append(breaches, pkg+" depends on "+b)
			}
		}
	}
	for _, dir := range library {
		breaches = append(breaches, longFunctions(dir)...)
	}
	breaches = append(breaches, longModules("python/kvbmgo")...)
	slices.Sort(breaches)
	for _, b := range breaches {
		fmt.Fprintln(os.Stderr, "floors:", b)
	}
	if len(breaches) > 0 {
		os.Exit(1)
	}
}

// goList runs go list with format and args; the result maps each line's
// text before the first ':' to the fields after it.
func goList(format string, args ...string) map[string][]string {
	out, err := exec.Command("go", append([]string{"list", "-f", format}, args...)...).Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "floors: go list", args, err)
		os.Exit(2)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, rest, _ := strings.Cut(line, ":")
		m[name] = strings.Fields(rest)
	}
	return m
}

// longFunctions names the functions of the non-test Go files under dir
// longer than maxLines.
func longFunctions(dir string) []string {
	var long []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxLines {
				long = append(long, fmt.Sprintf("%s: %s is %d lines (at most %d)", path, fd.Name.Name, n, maxLines))
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "floors:", err)
		os.Exit(2)
	}
	return long
}

// maxModuleLines bounds a module of the Python package: past it, a module
// holds more than one idea.
const maxModuleLines = 600

// longModules lists the Python modules under dir longer than maxModuleLines.
func longModules(dir string) []string {
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".py") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := strings.Count(string(b), "\n"); n > maxModuleLines {
			out = append(out, fmt.Sprintf("%s is %d lines (the most is %d)", path, n, maxModuleLines))
		}
		return nil
	})
	if err != nil {
		out = append(out, fmt.Sprintf("walk %s: %v", dir, err))
	}
	return out
}
