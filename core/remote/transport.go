package remote

import (
	"context"

	"github.com/kvbm/kvbm/core/kvbmerr"
	"github.com/kvbm/kvbm/core/transfer"
)

// Transport is one way for workers to reach each other's memory. A worker
// holds one per way it offers.
type Transport interface {
	// Name identifies the transport in metadata and in the info call:
	// "loopback", "tcp" or "ucx".
	Name() string
	// Serve makes m's layouts reachable by peers; a transport serves one
	// manager.
	Serve(m *transfer.Manager) error
	// Endpoint is what peers need to connect and reach the layouts
	// registered so far, opaque to everyone but this transport; asked at
	// each metadata export (a transport that keys memory registrations
	// registers new layouts then).
	Endpoint() ([]byte, error)
	// Connect reaches the worker that published endpoint, within ctx.
	Connect(ctx context.Context, endpoint []byte) (Peer, error)
	// Close stops serving and closes every peer; operations in flight on
	// them fail.
	Close() error
}

// ReadOnlyEndpointer is a Transport whose endpoints can carry a
// narrower capability: the holder of ReadOnlyEndpoint may read the
// worker's layouts and never write them (the server refuses).
type ReadOnlyEndpointer interface {
	ReadOnlyEndpoint() ([]byte, error)
}

// Peer is a connected worker whose layouts can be attached.
type Peer interface {
	transfer.Attacher
	// Close ends the connection; operations in flight fail.
	Close() error
}

// ErrPeerUnavailable is wrapped by every error of a peer that died, froze,
// went silent or cannot be reached: the blocks of the operation failed and
// the peer must be connected again (by importing its metadata) before it
// is used.
var ErrPeerUnavailable = kvbmerr.New(kvbmerr.IO, "peer unavailable")

// ErrBadEndpoint is wrapped by errors about an endpoint that does not
// parse or names another process.
var ErrBadEndpoint = kvbmerr.New(kvbmerr.InvalidArgument, "bad transport endpoint")
