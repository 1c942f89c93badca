package remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Loopback is the in-process transport: workers of one process reach each
// other's memory directly. Its endpoint names the process, so that
// metadata from another process is refused rather than read as local
// addresses. Transfers on an imported layout hold the exporting manager
// open: its Close waits for them, and once it is closed they are refused.
type Loopback struct {
	mu       sync.RWMutex
	managers map[uint64]*transfer.Manager
}

// processToken tells this process's loopback endpoints from others'.
var processToken = func() [16]byte {
	var t [16]byte
	_, _ = rand.Read(t[:])
	return t
}()

// NewLoopback makes an empty loopback transport.
func NewLoopback() *Loopback { return &Loopback{managers: map[uint64]*transfer.Manager{}} }

// Name is "loopback".
func (l *Loopback) Name() string { return "loopback" }

// Add makes a manager's layouts reachable through the transport.
func (l *Loopback) Add(m *transfer.Manager) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.managers[m.WorkerID()]; dup {
		return fmt.Errorf("%w: loopback: worker %x is already attached", kvbmerr.ErrAlreadyExists, m.WorkerID())
	}
	l.managers[m.WorkerID()] = m
	return nil
}

// Remove detaches a manager.
func (l *Loopback) Remove(m *transfer.Manager) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.managers[m.WorkerID()] == m {
		delete(l.managers, m.WorkerID())
	}
}

// Serve adds m.
func (l *Loopback) Serve(m *transfer.Manager) error { return l.Add(m) }

// Endpoint is this process's token: a loopback reaches its own process.
func (l *Loopback) Endpoint() ([]byte, error) { return processToken[:], nil }

// Local reports whether endpoint was published by a loopback of this
// process.
func (l *Loopback) Local(endpoint []byte) bool {
	return bytes.Equal(endpoint, processToken[:])
}

// Connect returns the peer of a loopback endpoint of this process.
func (l *Loopback) Connect(_ context.Context, endpoint []byte) (Peer, error) {
	if len(endpoint) != len(processToken) {
		return nil, fmt.Errorf("%w: loopback endpoint is %d bytes, want %d", ErrBadEndpoint, len(endpoint), len(processToken))
	}
	if !l.Local(endpoint) {
		return nil, fmt.Errorf("%w: the loopback endpoint belongs to another process; use a network transport (KVBM_TRANSPORT)",
			ErrBadEndpoint)
	}
	return loopbackPeer{l}, nil
}

// Close does nothing: workers leave with Remove.
func (l *Loopback) Close() error { return nil }

// Attach finds the exporting manager of d's layout in this process.
func (l *Loopback) Attach(d transfer.Descriptor) (transfer.Attachment, error) {
	l.mu.RLock()
	m, ok := l.managers[d.Handle.Worker]
	l.mu.RUnlock()
	if !ok {
		return transfer.Attachment{}, fmt.Errorf("%w: loopback: no worker %x attached", transfer.ErrNotFound, d.Handle.Worker)
	}
	return transfer.Attachment{Exporter: m}, nil
}

type loopbackPeer struct{ *Loopback }

func (loopbackPeer) Close() error { return nil }

var _ Transport = (*Loopback)(nil)
