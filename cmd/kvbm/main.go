// Command kvbm tells what kvbm sees on this machine and how fast each of its
// paths is here, and runs its end-to-end demo:
//
//	kvbm info  [-dir DIR] [--json]   library, device backend, GPUs (NVML), NUMA, disk tier, transports
//	kvbm bench [-dir DIR] [--json]   the path benchmarks, each figure beside its baseline
//	kvbm demo  -dir DIR [-blocks N]  G1→G2→G3→G4 and back, layer-wise onboard, handoff, prefix cache
//
// It is a Go program of its own, never linked into libkvbm.so: go-nvml,
// which links NVML's symbols unresolved, lives here and not in the library
// that Python loads with ctypes. Without NVML (no NVIDIA driver) `info`
// says so in one line and goes on. KVBM_DEVICE chooses the device
// (auto|cuda|emulated), KVBM_LOG the log level, as for the library.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvbm/kvbm/core/logging"

	// The UCX transport, selectable with KVBM_TRANSPORT=ucx.
	_ "github.com/kvbm/kvbm/core/remote/ucx"
)

const usage = `usage: kvbm <command> [flags]

commands:
  info    what kvbm sees here: library and ABI version, device backend, GPUs (NVML),
          NUMA nodes, the disk tier's filesystem and O_DIRECT, transports
  bench   the path benchmarks over a small grid, each figure beside its baseline
          measured in the same run (memcpy, plain O_DIRECT), as a table or --json
  demo    the end-to-end flow (what make demo runs)

kvbm <command> -h lists the command's flags.
`

func main() {
	logging.Configure()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit status: 0, 1 when the
// command failed, 2 for a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "info":
		err = infoCommand(args[1:], stdout, stderr)
	case "bench":
		err = benchCommand(args[1:], stdout, stderr)
	case "demo":
		err = demoCommand(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "kvbm: unknown command %q\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "kvbm %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "kvbm %s: FAILED: %v\n", args[0], err)
	return 1
}

// usageError is a bad flag or argument: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// parseFlags parses args into fs; a parse error (already printed by fs) is
// a usageError.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}
