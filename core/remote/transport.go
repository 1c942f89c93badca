package remote

import (
	"context"
	"time"

	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
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
// parse or names another process. It is the capability package's
// ErrMalformed (a hello or scope that does not parse), one sentinel for
// both, so that a capability's refusal leaves a transport as it is.
var ErrBadEndpoint = capability.ErrMalformed

// Scope is what a request-scoped capability covers: blocks of some of
// the worker's layouts, read only, until Expires (zero: no end).
type Scope struct {
	Layouts []ScopedLayout
	Expires time.Time
}

// ScopedLayout is the blocks of one layout a Scope covers.
type ScopedLayout struct {
	Layout transfer.LayoutHandle
	Blocks []int
}

// ScopedEndpointer is a Transport whose endpoints can carry a capability
// scoped to some blocks (ScopedEndpoint): its holder reads those blocks
// and nothing else, the server refusing any other range on every request.
type ScopedEndpointer interface {
	ScopedEndpoint(s Scope) ([]byte, error)
}

// Revoker is a ScopedEndpointer that can end the request-scoped
// capabilities it made (RevokeBlocks): those made before the call that
// cover one of the blocks named stop reading them, and the call returns
// once no request they allowed is still reading.
type Revoker interface {
	RevokeBlocks(layouts []ScopedLayout) error
}

// Withdrawer is a transport that keeps state of a served layout (a memory
// registration with the network, revocation state): Withdrawn drops it
// once the layout was withdrawn (transfer.Manager.Withdraw), before its
// memory goes to its next use.
type Withdrawer interface {
	Withdrawn(h transfer.LayoutHandle) error
}

// Joiner is a Peer that carries the capabilities of other peers of the
// same server (request-scoped ones, each covering some blocks), so that
// one imported layout reaches the server through whichever covers a
// transfer's blocks.
type Joiner interface {
	Peer
	// Join takes other's capability over when other reaches the same
	// server, reporting whether it did; other stays the handle to Leave
	// with.
	Join(other Peer) bool
	// Leave closes what Join took of other (or this peer's own when other
	// is this peer) and reports whether nothing is left.
	Leave(other Peer) (empty bool)
}
