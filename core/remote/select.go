package remote

import (
	"fmt"
	"os"
	"sort"
	"sync"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Opener makes a network transport, or says why it cannot (a library that
// does not load, say).
type Opener func(OpenOptions) (Transport, error)

// OpenOptions are what the one who assembles a worker tells its transport.
type OpenOptions struct {
	// Advertise is the host a TCP transport listens on (from the first
	// export) and names in its metadata; "" takes KVBM_TCP_ADVERTISE,
	// else 127.0.0.1. Other transports ignore it.
	Advertise string
}

var (
	openersMu sync.Mutex
	openers   = map[string]Opener{}
)

// Register makes a network transport selectable by name; the TCP and UCX
// packages (core/remote/tcp, core/remote/ucx) register themselves when
// they are linked in.
func Register(name string, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	openers[name] = open
}

// Choice is the network transport a name selects: "auto" (TCP, whose
// same-host route maps a peer's host memory between processes of one
// host), "tcp",
// "ucx" (when linked in), or "loopback" (none: workers reach only their
// own process).
//
// auto does not pick UCX even where it loads: with the UCX this project is
// tested on (Debian's 1.13) a peer reads memory the engine or the manager
// allocated through messages the exporter answers, slower than the TCP
// transport, and an importer that dies with such requests queued can make
// UCX abort the exporting process (ucp_request.inl "Endpoint timeout").
// UCX is for deployments that choose it, with a UCX build (KVBM_UCX_LIB)
// that reaches their memory one-sided (RDMA, CUDA). Opening "ucx" is
// refused (ucx.ErrLateWrites) unless KVBM_UCX_ACCEPT_LATE_WRITES=1: it
// cannot promise that no byte of a failed operation lands after its
// notification completed.
func Choice(name string) (string, error) {
	openersMu.Lock()
	defer openersMu.Unlock()
	switch name {
	case "", "auto":
		return "tcp", nil
	case "loopback":
		return "loopback", nil
	}
	if _, ok := openers[name]; !ok {
		names := []string{"auto", "loopback"}
		for n := range openers {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", fmt.Errorf("%w: transport %q is not one of %v", kvbmerr.ErrInvalidArgument, name, names)
	}
	return name, nil
}

// Open makes the network transport name selects (nil for "loopback").
func Open(name string, opts OpenOptions) (Transport, error) {
	choice, err := Choice(name)
	if err != nil || choice == "loopback" {
		return nil, err
	}
	openersMu.Lock()
	open := openers[choice]
	openersMu.Unlock()
	if open == nil { // "auto" chose TCP, which this program does not link in
		return nil, fmt.Errorf("%w: transport %s is not linked into this program (import core/remote/%s)",
			kvbmerr.ErrUnsupported, choice, choice)
	}
	t, err := open(opts)
	if err != nil {
		return nil, fmt.Errorf("transport %s: %w", choice, err)
	}
	return t, nil
}

// FromEnv is Open(KVBM_TRANSPORT).
func FromEnv() (Transport, error) { return Open(os.Getenv("KVBM_TRANSPORT"), OpenOptions{}) }

// EnvChoice is Choice(KVBM_TRANSPORT).
func EnvChoice() (string, error) { return Choice(os.Getenv("KVBM_TRANSPORT")) }

// Status says, for each network transport linked in, why it cannot open
// (nil when it can): what the info command reports.
func Status() map[string]error {
	openersMu.Lock()
	defer openersMu.Unlock()
	out := make(map[string]error, len(openers))
	for name, open := range openers {
		t, err := open(OpenOptions{})
		if err == nil {
			t.Close()
		}
		out[name] = err
	}
	return out
}
