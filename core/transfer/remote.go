package transfer

import (
	"context"
	"fmt"
	"slices"
	"time"

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

// Equal reports whether two descriptors name the same layout, shape and
// memory.
func (d Descriptor) Equal(o Descriptor) bool {
	return d.Handle == o.Handle && d.Kind == o.Kind && d.Device == o.Device && d.Config == o.Config &&
		d.Shape == o.Shape && slices.Equal(d.Bases, o.Bases)
}

// RemoteOp is one contiguous copy between a peer's memory (Remote, an
// address inside one region of the peer's layout) and host memory of this
// process (Local).
type RemoteOp struct{ Remote, Local, Size uint64 }

// RemoteMemory moves bytes of a layout that lives in another process. It
// is what a transport implements for its peers; the transfer manager plans
// the copies, validates them and reports failures by block.
type RemoteMemory interface {
	// Read copies each op's bytes from the peer's layout h into local host
	// memory. It returns once every byte is in place or with an error; it
	// gives up when ctx ends.
	Read(ctx context.Context, h LayoutHandle, ops []RemoteOp) error
	// Write copies each op's bytes from local host memory into the peer's
	// layout h.
	Write(ctx context.Context, h LayoutHandle, ops []RemoteOp) error
}

// OpSizer is a RemoteMemory whose operations cost a fixed amount each
// (a request and an answer through the peer), so that a transfer moves
// more in larger ones: OpBytes is the size it prefers (0: none). A
// transfer's operations are then between chunkBytes and OpBytes, sized so
// that every net worker gets one, and at least a block each; otherwise
// about chunkBytes.
type OpSizer interface {
	OpBytes() uint64
}

// Attachment is a remote layout made reachable by a transport: either the
// exporting manager itself, when it lives in this process and its memory
// can be used directly, or a RemoteMemory that reaches another process.
// Exactly one is set.
type Attachment struct {
	Exporter *Manager
	Memory   RemoteMemory
}

// Attacher resolves descriptors exported by other workers; transports
// implement it for their peers.
type Attacher interface {
	Attach(d Descriptor) (Attachment, error)
}

// DefaultRemoteDeadline bounds each remote operation when the manager's
// Config does not say otherwise.
const DefaultRemoteDeadline = 30 * time.Second

// RemoteDeadline is how long one remote operation may take before its
// blocks fail.
func (m *Manager) RemoteDeadline() time.Duration { return m.cfg.RemoteDeadline }

// Import makes the layouts of another worker usable as transfer sources
// and destinations under their own handles. Importing a handle again
// replaces the earlier import.
func (m *Manager) Import(a Attacher, descs []Descriptor) ([]LayoutHandle, error) {
	if a == nil {
		return nil, fmt.Errorf("%w: import needs a transport", ErrInvalidArgument)
	}
	entries := make([]*entry, len(descs))
	for i, d := range descs {
		if d.Handle.Worker == m.cfg.WorkerID {
			return nil, fmt.Errorf("%w: layout %v belongs to this worker (%x); only remote layouts are imported",
				ErrInvalidArgument, d.Handle, m.cfg.WorkerID)
		}
		att, err := a.Attach(d)
		if err != nil {
			return nil, fmt.Errorf("import layout %v: %w", d.Handle, err)
		}
		if entries[i], err = attached(d, att); err != nil {
			return nil, fmt.Errorf("import layout %v: %w", d.Handle, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closedLocked() {
		return nil, ErrClosed
	}
	handles := make([]LayoutHandle, len(descs))
	for i, e := range entries {
		m.entries[descs[i].Handle] = e
		handles[i] = descs[i].Handle
	}
	m.published()
	return handles, nil
}

// attached makes the entry of an imported layout.
func attached(d Descriptor, a Attachment) (*entry, error) {
	switch {
	case (a.Exporter == nil) == (a.Memory == nil):
		return nil, fmt.Errorf("%w: a transport attachment names exactly one of an exporter and a remote memory", ErrInvalidArgument)
	case a.Exporter != nil:
		e, err := a.Exporter.lookup(d.Handle)
		if err != nil {
			return nil, err
		}
		if !describe(e).Equal(d) {
			return nil, fmt.Errorf("%w: descriptor of %v does not match the exporting worker's layout", ErrInvalidArgument, d.Handle)
		}
		imported := *e
		imported.owned = nil // the exporting worker owns the memory
		imported.owner = a.Exporter
		imported.leaveWith = nil // it leaves the exporter's manager, not the importer's
		return &imported, nil
	}
	l, err := layout.New(d.Config, d.Shape.Kind, d.Shape.BlockDim, d.Bases)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return &entry{handle: d.Handle, layout: l, kind: d.Kind, device: d.Device, remote: a.Memory}, nil
}

// Hold marks work on this manager's memory in flight, for a transport
// that serves it to peers: Close waits until release is called, and once
// the manager is closed Hold fails.
func (m *Manager) Hold() (release func(), err error) {
	if err := m.begin(); err != nil {
		return nil, err
	}
	return m.done, nil
}
