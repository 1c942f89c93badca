// Package node assembles a worker as an engine process has it: the
// PhysicalWorker with its own transfer manager, the network transport it
// serves on, and its prefix cache, made and closed in one order. The C
// ABI (kvbm_worker_create), the kvbm command and Go programs build their
// workers here, so that the choice of transport, what is closed when a
// create fails, the one cache per worker and the close order are decided
// in one place.
//
// It is a package of its own because core/cache imports core/worker: the
// assembly of both sits above them.
package node

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/kvbm/kvbm/core/cache"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/kvbmerr"

	// The TCP transport: what "auto" (the default) opens.
	_ "github.com/kvbm/kvbm/core/remote/tcp"
)

// Config configures a node.
type Config struct {
	// Worker configures the worker (its id, device, driver, tiers' places,
	// loopback). Its Network must be nil: the node opens the transport
	// Transport names and serves on it.
	Worker worker.StandaloneConfig
	// Transport names the network transport (remote.Choice): "" takes
	// KVBM_TRANSPORT (unset: "auto", TCP); "loopback" is none, the worker
	// then reaches only its own process.
	Transport string
	// Advertise is the host the TCP transport listens on from the first
	// export and peers dial: the address a P/D role is given. "" takes
	// KVBM_TCP_ADVERTISE, else 127.0.0.1; KVBM_TCP_LISTEN overrides.
	Advertise string
}

// Node is a worker with its transport and its cache. Safe for concurrent
// use.
type Node struct {
	w *worker.PhysicalWorker
	// cache is set once, by EnableCache.
	cache atomic.Pointer[cache.Cache]
}

// New opens the transport, makes the worker and serves it on the
// transport (which listens from the first metadata export, see above); a
// failure closes what was made.
func New(cfg Config) (*Node, error) {
	if cfg.Worker.Network != nil {
		return nil, fmt.Errorf("%w: node: the worker's Network is the node's to open; name it in Transport", kvbmerr.ErrInvalidArgument)
	}
	name, what := cfg.Transport, "transport"
	if name == "" {
		name, what = os.Getenv("KVBM_TRANSPORT"), "KVBM_TRANSPORT"
	}
	network, err := remote.Open(name, remote.OpenOptions{Advertise: cfg.Advertise})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	w, err := worker.NewStandalone(cfg.Worker)
	if err != nil {
		if network != nil {
			network.Close()
		}
		return nil, err
	}
	// The worker serves on the transport from create, but TCP listens
	// only at the first export of its metadata (or here, when
	// KVBM_TCP_LISTEN says so): a worker nobody asked to serve remote
	// peers (one that only offloads locally) listens on nothing, and
	// still reaches the peers whose metadata it imports.
	if network != nil {
		if err := w.ServeNetwork(network); err != nil {
			return nil, errors.Join(err, w.Close())
		}
	}
	return &Node{w: w}, nil
}

// Worker is the node's worker.
func (n *Node) Worker() *worker.PhysicalWorker { return n.w }

// Cache is the node's prefix cache, nil before EnableCache.
func (n *Node) Cache() *cache.Cache { return n.cache.Load() }

// EnableCache makes the node's prefix cache, once: its G1 and G2 must be
// registered (cache.New). cfg.Worker is the node's worker.
func (n *Node) EnableCache(cfg cache.Config) (*cache.Cache, error) {
	if n.cache.Load() != nil {
		return nil, errHasCache
	}
	cfg.Worker = n.w
	c, err := cache.New(cfg)
	if err != nil {
		return nil, err
	}
	if !n.cache.CompareAndSwap(nil, c) {
		_ = c.Close()
		return nil, errHasCache
	}
	return c, nil
}

var errHasCache = fmt.Errorf("%w: the worker has a cache already", kvbmerr.ErrAlreadyExists)

// Close closes the cache (waiting for its calls in flight), then the
// worker: it stops serving and closes its transport and the connections
// to its peers, then waits for transfers in flight and releases its
// transfer manager and object store.
func (n *Node) Close() error {
	var err error
	if c := n.cache.Load(); c != nil {
		err = c.Close()
	}
	return errors.Join(err, n.w.Close())
}
