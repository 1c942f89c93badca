package remote

import (
	"fmt"
	"os"
	"sort"
	"strings"
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
	// else 127.0.0.1. UCX uses its interface for its tcp transport.
	Advertise string
}

var (
	openersMu sync.Mutex
	openers   = map[string]Opener{}
	preferred = map[string]func() (bool, string){}
)

// Prefer makes auto choose the transport name over TCP where prefer
// says so (UCX where it finds an RDMA network, core/remote/ucx); prefer
// also says why, for the info command. Called when the package is linked in.
func Prefer(name string, prefer func() (ok bool, why string)) {
	openersMu.Lock()
	defer openersMu.Unlock()
	preferred[name] = prefer
}

// AutoWhy says what auto chooses here and why.
func AutoWhy() string {
	name, why := auto()
	return fmt.Sprintf("auto chooses %s%s", name, why)
}

// auto is the transport auto chooses: the first linked in, by name, that
// prefers itself here (Prefer), else tcp; and why, for AutoWhy.
func auto() (name, why string) {
	openersMu.Lock()
	names := make([]string, 0, len(preferred))
	prefs := make(map[string]func() (bool, string), len(preferred))
	for n, f := range preferred {
		if openers[n] != nil {
			names = append(names, n)
			prefs[n] = f
		}
	}
	openersMu.Unlock() // prefer may load a library: not under the lock
	sort.Strings(names)
	var whys []string
	for _, n := range names {
		ok, reason := prefs[n]()
		if ok {
			return n, ": " + reason
		}
		whys = append(whys, fmt.Sprintf("not %s: %s", n, reason))
	}
	if len(whys) == 0 {
		return "tcp", ""
	}
	return "tcp", " (" + strings.Join(whys, "; ") + ")"
}

// Register makes a network transport selectable by name; the TCP and UCX
// packages (core/remote/tcp, core/remote/ucx) register themselves when
// they are linked in.
func Register(name string, open Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	openers[name] = open
}

// Choice is the network transport a name selects: "auto" (UCX where it
// finds an RDMA network, ucx's Prefer; TCP otherwise, whose same-host
// route maps a peer's host memory between processes of one host), "tcp",
// "ucx" (when linked in), or "loopback" (none: workers reach only their
// own process).
//
// Over TCP or shared memory UCX moves nothing faster than the TCP
// transport does, so auto leaves it to the deployments that choose it
// there.
func Choice(name string) (string, error) {
	switch name {
	case "", "auto":
		n, _ := auto()
		return n, nil
	case "loopback":
		return "loopback", nil
	}
	openersMu.Lock()
	defer openersMu.Unlock()
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
