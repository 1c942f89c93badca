// Package datadriven runs test scripts in the style of
// cockroachdb/datadriven, which etcd-io/raft uses. A script is a sequence
// of cases:
//
//	# comments and blank lines, kept as they are
//	command arg key=value
//	----
//	expected output, one or more lines, ended by a blank line or the file's end
//
// Run the tests with -rewrite to replace every expected output with the
// actual one.
package datadriven

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata scripts")

// scriptCase is one command of a script and its expected output.
type scriptCase struct {
	pos      string   // file:line of the command
	preamble []string // comment and blank lines before the command
	cmd      Command
	want     string
}

// Command is a parsed command line: a name, then words and key=value pairs.
type Command struct {
	Line string
	Name string
	Args []string
}

// parseScript splits a script into its cases and whatever follows the last one.
func parseScript(t *testing.T, path string) (cases []scriptCase, trailer []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var pending []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			pending = append(pending, line)
			continue
		}
		pos := fmt.Sprintf("%s:%d", path, i+1)
		require.Less(t, i+1, len(lines), "%s: command without ----", pos)
		require.Equal(t, "----", lines[i+1], "%s: command must be followed by ----", pos)
		fields := strings.Fields(line)
		c := scriptCase{pos: pos, preamble: pending, cmd: Command{Line: line, Name: fields[0], Args: fields[1:]}}
		pending = nil
		var out []string
		for i += 2; i < len(lines) && lines[i] != ""; i++ {
			out = append(out, lines[i])
		}
		c.want = strings.Join(out, "\n")
		cases = append(cases, c)
	}
	return cases, pending
}

// RunScripts runs every script in dir, one subtest per file, through the
// handler for each command. newState makes the state one script shares.
func RunScripts[S any](t *testing.T, dir string, newState func() S, handlers map[string]func(S, *testing.T, Command) string) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			cases, trailer := parseScript(t, path)
			state := newState()
			var b strings.Builder
			for _, c := range cases {
				h, ok := handlers[c.cmd.Name]
				require.True(t, ok, "%s: unknown command %q", c.pos, c.cmd.Name)
				got := strings.TrimRight(h(state, t, c.cmd), "\n")
				require.NotContains(t, got, "\n\n", "%s: output must not contain blank lines", c.pos)
				if *rewrite {
					for _, p := range c.preamble {
						b.WriteString(p + "\n")
					}
					b.WriteString(c.cmd.Line + "\n----\n")
					if got != "" {
						b.WriteString(got + "\n")
					}
					b.WriteString("\n")
					continue
				}
				require.Equal(t, c.want, got, "%s: %s", c.pos, c.cmd.Line)
			}
			if *rewrite {
				for _, p := range trailer {
					b.WriteString(p + "\n")
				}
				out := strings.TrimRight(b.String(), "\n") + "\n"
				require.NoError(t, os.WriteFile(path, []byte(out), 0o644))
			}
		})
	}
}

// Arg returns the value of key=value, and whether it was given.
func (c Command) Arg(key string) (string, bool) {
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// Word returns the i-th argument that is not a key=value pair.
func (c Command) Word(t *testing.T, i int) string {
	t.Helper()
	n := 0
	for _, a := range c.Args {
		if strings.Contains(a, "=") {
			continue
		}
		if n == i {
			return a
		}
		n++
	}
	t.Fatalf("%q: missing argument %d", c.Line, i)
	return ""
}

// Words returns the arguments that are not key=value pairs.
func (c Command) Words() []string {
	var out []string
	for _, a := range c.Args {
		if !strings.Contains(a, "=") {
			out = append(out, a)
		}
	}
	return out
}
