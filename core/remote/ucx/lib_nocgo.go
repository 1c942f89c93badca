//go:build !cgo

package ucx

import (
	"context"
	"errors"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
)

// Available reports why the UCX transport cannot be used: without cgo
// there is no dlopen.
func Available() error {
	return errors.New("ucx: built without cgo, so libucp cannot be loaded")
}

// Version is "" without cgo.
func Version() string { return "" }

// Transport is the UCX transport; without cgo New always fails.
type Transport struct{}

// New fails: see Available.
func New(Config) (*Transport, error) { return nil, Available() }

// Name is "ucx".
func (*Transport) Name() string { return "ucx" }

// Serve fails: see Available.
func (*Transport) Serve(*transfer.Manager) error { return Available() }

// Endpoint fails: see Available.
func (*Transport) Endpoint() ([]byte, error) { return nil, Available() }

// Connect fails: see Available.
func (*Transport) Connect(context.Context, []byte) (remote.Peer, error) { return nil, Available() }

// Close does nothing.
func (*Transport) Close() error { return nil }

var _ remote.Transport = (*Transport)(nil)

// Resources fails: see Available.
func Resources() ([]string, error) { return nil, Available() }

// Settings fails: see Available.
func Settings() (map[string]string, error) { return nil, Available() }

// Probe fails: see Available.
func (*Transport) Probe() (map[string]string, error) { return nil, Available() }
