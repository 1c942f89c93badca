package transfer

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
)

// Descriptor is what another instance needs to address a layout: its
// handle, storage kind, device, shape and region bases. Workers export
// descriptors as metadata and import those of their peers.
type Descriptor struct {
	Handle LayoutHandle
	Kind   storage.Kind
	Device int
	Config layout.Config
	Shape  Shape
	Bases  []uint64
}

// Describe returns the descriptor of a layout registered here.
func (m *Manager) Describe(h LayoutHandle) (Descriptor, error) {
	e, err := m.lookup(h)
	if err != nil {
		return Descriptor{}, err
	}
	return describe(e), nil
}

func describe(e *entry) Descriptor {
	regions := e.layout.Regions()
	bases := make([]uint64, len(regions))
	for i, r := range regions {
		bases[i] = r.Addr
	}
	return Descriptor{
		Handle: e.handle, Kind: e.kind, Device: e.device, Config: e.layout.Config(),
		Shape: Shape{Kind: e.layout.Kind(), BlockDim: e.layout.BlockDim()}, Bases: bases,
	}
}

func (d Descriptor) equal(o Descriptor) bool {
	return d.Handle == o.Handle && d.Kind == o.Kind && d.Device == o.Device && d.Config == o.Config &&
		d.Shape == o.Shape && slices.Equal(d.Bases, o.Bases)
}

// Attachment is a remote layout made reachable by a Transport.
type Attachment struct {
	e     *entry
	owner *Manager // the exporting manager, which owns the memory
}

// Transport makes other workers' layouts reachable from this manager, so
// that ExecuteTransfer can read and write them like local ones.
type Transport interface {
	// Attach resolves a descriptor exported by another worker.
	Attach(d Descriptor) (Attachment, error)
}

// Import makes the layouts of another worker usable as transfer sources
// and destinations under their own handles. Importing a handle again
// replaces the earlier import.
func (m *Manager) Import(t Transport, descs []Descriptor) ([]LayoutHandle, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: import needs a transport", ErrInvalidArgument)
	}
	atts := make([]Attachment, len(descs))
	for i, d := range descs {
		if d.Handle.Worker == m.cfg.WorkerID {
			return nil, fmt.Errorf("%w: layout %v belongs to this worker (%x); only remote layouts are imported",
				ErrInvalidArgument, d.Handle, m.cfg.WorkerID)
		}
		a, err := t.Attach(d)
		if err != nil {
			return nil, fmt.Errorf("import layout %v: %w", d.Handle, err)
		}
		atts[i] = a
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	handles := make([]LayoutHandle, len(descs))
	for i, a := range atts {
		imported := *a.e
		imported.owned = nil // the exporting worker owns the memory
		imported.owner = a.owner
		m.entries[descs[i].Handle] = &imported
		handles[i] = descs[i].Handle
	}
	return handles, nil
}

// Loopback is the in-process transport: workers in one process reach each
// other's memory directly. It stands in for a network data plane in tests
// and single-process deployments. Transfers on an imported layout hold the
// exporting manager open: its Close waits for them, and once it is closed
// they are refused.
type Loopback struct {
	mu       sync.RWMutex
	managers map[uint64]*Manager
}

// NewLoopback makes an empty loopback transport.
func NewLoopback() *Loopback { return &Loopback{managers: map[uint64]*Manager{}} }

// Add makes a manager's layouts reachable through the transport.
func (l *Loopback) Add(m *Manager) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.managers[m.WorkerID()]; dup {
		return fmt.Errorf("%w: loopback: worker %x is already attached", ErrAlreadyExists, m.WorkerID())
	}
	l.managers[m.WorkerID()] = m
	return nil
}

// Remove detaches a manager.
func (l *Loopback) Remove(m *Manager) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.managers[m.WorkerID()] == m {
		delete(l.managers, m.WorkerID())
	}
}

// Attach finds the exporting manager's layout and checks that the
// descriptor still matches it.
func (l *Loopback) Attach(d Descriptor) (Attachment, error) {
	l.mu.RLock()
	m, ok := l.managers[d.Handle.Worker]
	l.mu.RUnlock()
	if !ok {
		return Attachment{}, fmt.Errorf("%w: loopback: no worker %x attached", ErrNotFound, d.Handle.Worker)
	}
	e, err := m.lookup(d.Handle)
	if err != nil {
		return Attachment{}, fmt.Errorf("loopback: %w", err)
	}
	if !describe(e).equal(d) {
		return Attachment{}, fmt.Errorf("%w: loopback: descriptor of %v does not match the exporting worker's layout",
			ErrInvalidArgument, d.Handle)
	}
	return Attachment{e: e, owner: m}, nil
}
