// Package transfer moves blocks between registered layouts: the layout
// registry, the strategy for each pair of storage kinds, the executors
// (host memcpy pool, device streams, disk I/O, two-hop bounce) and the
// notifications that report each transfer's completion.
package transfer

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
)

// Config configures a Manager.
type Config struct {
	// WorkerID is the 64-bit id in every handle this manager issues.
	WorkerID uint64
	// Device is the CUDA device ordinal of this worker.
	Device int
	// Driver does all device work; required.
	Driver cuda.Driver
	// DiskDir is where disk layouts create their files; required for
	// disk layouts, never defaulted.
	DiskDir string
	// DiskName, when set, names the disk layout's file in DiskDir, which
	// then outlives the process (a persistent G3: disk_persist.go); "": a
	// file with no name, gone with the process.
	DiskName string
	// HostWorkers bounds the goroutines doing host memcpy (default
	// GOMAXPROCS, at least 2).
	HostWorkers int
	// DiskWorkers bounds the disk requests in flight (default 8): disk
	// I/O waits on the device, and NVMe wants a queue deep enough.
	DiskWorkers int
	// StreamsPerDirection is the size of each device stream pool (default 4).
	StreamsPerDirection int
	// BounceBlocks is the number of blocks in each internal bounce buffer
	// used for two-hop transfers without a caller bounce (default 16).
	BounceBlocks int
	// RemoteDeadline bounds each operation on a peer's memory (default
	// DefaultRemoteDeadline): a dead, frozen or unreachable peer fails the
	// transfer's blocks within it.
	RemoteDeadline time.Duration
	// NetWorkers bounds the remote operations in flight (default 4), each
	// on its own connection to the peer.
	NetWorkers int
	// PrivateHost allocates host layouts as private memory instead of
	// shared memory files (the default), so that no peer on this host can
	// map them: peers then reach them through the transport's socket.
	PrivateHost bool
	// StagingBuffers bounds the pinned staging buffers (4 MiB each) that
	// serve peers' requests on device memory (default
	// DefaultStagingBuffers: 64 MiB): a request that finds all in use
	// waits for one, at most RemoteDeadline. A few are kept idle; the
	// others are freed once unused for a while.
	StagingBuffers int
}

// entry is one registered layout and the storage behind it.
type entry struct {
	handle LayoutHandle
	layout *layout.Layout
	kind   storage.Kind
	device int
	disk   *storage.DiskFile // kind Disk
	crc    *checksums        // kind Disk
	owned  []io.Closer       // released on Unregister (not for imported layouts)
	// remote reaches the memory of a layout imported from another
	// process (nil otherwise).
	remote RemoteMemory
	// owner is the exporting manager of an imported layout (nil for local
	// ones): transfers on it hold that manager open.
	owner *Manager
	// gate counts the transfers on memory its owner registered
	// (RegisterExternal), which Withdraw waits for (nil otherwise).
	gate *inflightGate
	// leaveWith ends a transfer through gate that held the registering
	// manager only: made once, so that such a transfer's release allocates
	// nothing (nil for imports: their manager is another).
	leaveWith func()
}

// Manager is the transfer manager of one worker. Safe for concurrent use.
type Manager struct {
	cfg  Config
	drv  cuda.Driver
	host *hostPool // memcpy
	disk *hostPool // disk requests
	net  *hostPool // remote operations
	h2d  *streamPool
	d2h  *streamPool
	d2d  *streamPool
	// events are the completion events of device transfers, reused.
	events freeList[cuda.Event]

	mu      sync.RWMutex
	entries map[LayoutHandle]*entry
	nextID  uint16
	// withdrawn are the handles Withdraw took out, with its reason: a
	// lookup of one says why it is gone, and its id is not given again
	// while another is free; withdrawnOrder, oldest first, is the order
	// their ids are given again in once none is (an engine that sleeps and
	// wakes 65,535 times).
	withdrawn      map[LayoutHandle]string
	withdrawnOrder []LayoutHandle
	// view is a copy of entries that lookups read without the lock (every
	// transfer looks up two layouts; layouts change rarely): replaced,
	// never changed, under mu after each change of entries. nil once
	// closed: it is the registry's closed flag.
	view atomic.Pointer[entryView]

	bounce   bouncePool
	stages   stagePool // pinned staging of Serve
	inflight *inflightGate
	done     func() // inflight.leave, bound once
	counters counters
}

// NewManager starts a manager; Close stops it.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Driver == nil {
		return nil, fmt.Errorf("%w: transfer manager needs a cuda.Driver", ErrInvalidArgument)
	}
	if cfg.HostWorkers <= 0 {
		cfg.HostWorkers = max(2, runtime.GOMAXPROCS(0))
	}
	if cfg.DiskWorkers <= 0 {
		cfg.DiskWorkers = 8
	}
	if cfg.StreamsPerDirection <= 0 {
		cfg.StreamsPerDirection = 4
	}
	if cfg.BounceBlocks <= 0 {
		cfg.BounceBlocks = 16
	}
	if cfg.RemoteDeadline <= 0 {
		cfg.RemoteDeadline = DefaultRemoteDeadline
	}
	if cfg.NetWorkers <= 0 {
		cfg.NetWorkers = 4
	}
	if cfg.StagingBuffers <= 0 {
		cfg.StagingBuffers = DefaultStagingBuffers
	}
	m := &Manager{
		cfg:     cfg,
		drv:     cfg.Driver,
		host:    newHostPool(cfg.HostWorkers),
		disk:    newHostPool(cfg.DiskWorkers),
		net:     newHostPool(cfg.NetWorkers),
		entries: make(map[LayoutHandle]*entry),
		nextID:  1,
	}
	m.h2d = newStreamPool(cfg.Driver, cfg.Device, cfg.StreamsPerDirection)
	m.d2h = newStreamPool(cfg.Driver, cfg.Device, cfg.StreamsPerDirection)
	m.d2d = newStreamPool(cfg.Driver, cfg.Device, cfg.StreamsPerDirection)
	m.bounce.m = m
	m.inflight = newInflight()
	m.done = m.inflight.leave
	m.view.Store(&entryView{}) // open, nothing registered
	m.events = freeList[cuda.Event]{
		make:    func() (cuda.Event, error) { return cfg.Driver.EventCreate(cfg.Device) },
		destroy: cfg.Driver.EventDestroy,
	}
	m.stages = newStagePool(cfg.StagingBuffers, func() (*storage.Memory, error) {
		s, err := storage.AllocPinned(cfg.Driver, cfg.Device, stageBytes)
		if err != nil {
			return nil, fmt.Errorf("allocate pinned staging: %w", err)
		}
		return s, nil
	}, (*storage.Memory).Close)
	return m, nil
}

// WorkerID is the worker id in this manager's handles.
func (m *Manager) WorkerID() uint64 { return m.cfg.WorkerID }

// Close waits for transfers in flight, then releases every layout this
// manager allocated, its streams and its workers.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closedLocked() {
		m.mu.Unlock()
		return nil
	}
	entries := m.entries
	m.entries = map[LayoutHandle]*entry{}
	m.view.Store(nil)
	m.mu.Unlock()

	m.inflight.closeAndWait()
	var errs []error
	for _, e := range entries {
		errs = append(errs, e.release())
	}
	errs = append(errs, m.bounce.close(), m.stages.close(), m.events.close(), m.h2d.close(), m.d2h.close(), m.d2d.close())
	m.host.close()
	m.disk.close()
	m.net.close()
	return errors.Join(errs...)
}

func (e *entry) release() error {
	var errs []error
	for i := len(e.owned) - 1; i >= 0; i-- {
		errs = append(errs, e.owned[i].Close())
	}
	return errors.Join(errs...)
}

// hold marks a transfer on the given layouts in flight, with this manager
// and with the exporting managers of imported ones, so that their Close
// waits for it; it fails once one of them is closed. release ends it.
func (m *Manager) hold(entries ...*entry) (release func(), err error) {
	if err := m.begin(); err != nil {
		return nil, err
	}
	if gated(entries) {
		return m.holdGated(entries)
	}
	return m.holdOwners(entries)
}

// holdOwners is hold after the manager's gate: the exporting managers.
func (m *Manager) holdOwners(entries []*entry) (release func(), err error) {
	var owners []*Manager // other managers whose exported layouts move
	for _, e := range entries {
		if e == nil || e.owner == nil || e.owner == m || slices.Contains(owners, e.owner) {
			continue
		}
		if err := e.owner.begin(); err != nil {
			m.inflight.leave()
			for _, o := range owners {
				o.inflight.leave()
			}
			return nil, fmt.Errorf("%w: layout %v: the worker that exported it (%x) is closed", ErrClosed, e.handle, e.owner.WorkerID())
		}
		owners = append(owners, e.owner)
	}
	if owners == nil {
		return m.done, nil // no closure to allocate: most transfers hold only this manager
	}
	return func() {
		m.inflight.leave()
		for _, o := range owners {
			o.inflight.leave()
		}
	}, nil
}

// begin marks a transfer in flight; it fails once the manager is closed.
func (m *Manager) begin() error {
	if !m.inflight.enter() {
		return ErrClosed
	}
	return nil
}

func (m *Manager) lookup(h LayoutHandle) (*entry, error) {
	view := m.view.Load()
	if view == nil {
		return nil, ErrClosed
	}
	var e *entry
	var ok bool
	if h.Worker == m.cfg.WorkerID {
		e, ok = view.local[uint64(h.Layout)]
	} else {
		e, ok = view.imported[h]
	}
	if !ok {
		return nil, m.missing(h)
	}
	return e, nil
}

// published makes the lookups see entries as they are now; the caller
// holds mu and has just changed them.
func (m *Manager) published() {
	if m.closedLocked() {
		return
	}
	view := &entryView{local: map[uint64]*entry{}, imported: map[LayoutHandle]*entry{}}
	for h, e := range m.entries {
		if h.Worker == m.cfg.WorkerID {
			view.local[uint64(h.Layout)] = e
		} else {
			view.imported[h] = e
		}
	}
	m.view.Store(view)
}

// closedLocked reports whether Close began; the caller holds mu.
func (m *Manager) closedLocked() bool { return m.view.Load() == nil }

// entryView is the lookups' copy of the registry: this worker's own
// layouts by layout id (a map of integers hashes faster than one of
// handles), imported ones by handle.
type entryView struct {
	local    map[uint64]*entry
	imported map[LayoutHandle]*entry
}

// insert registers e under a fresh handle of this worker.
func (m *Manager) insert(e *entry) (LayoutHandle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closedLocked() {
		return LayoutHandle{}, ErrClosed
	}
	tries := 1 << 16
	if len(m.entries)+len(m.withdrawn) >= 1<<16-1 {
		tries = 0 // every id is registered or withdrawn: reuse the oldest withdrawn one
	}
	for range tries {
		id := m.nextID
		m.nextID++
		if m.nextID == 0 {
			m.nextID = 1
		}
		h := LayoutHandle{Worker: m.cfg.WorkerID, Layout: id}
		_, taken := m.entries[h]
		if _, gone := m.withdrawn[h]; !taken && !gone {
			e.handle = h
			m.entries[h] = e
			m.published()
			return h, nil
		}
	}
	for len(m.withdrawnOrder) > 0 { // the id withdrawn longest ago
		h := m.withdrawnOrder[0]
		m.withdrawnOrder = m.withdrawnOrder[1:]
		if _, gone := m.withdrawn[h]; !gone {
			continue
		}
		delete(m.withdrawn, h)
		e.handle = h
		m.entries[h] = e
		m.published()
		return h, nil
	}
	return LayoutHandle{}, fmt.Errorf("worker %x has no free layout id (65535 registered)", m.cfg.WorkerID)
}

// Layout returns the layout and storage kind registered under h.
func (m *Manager) Layout(h LayoutHandle) (*layout.Layout, storage.Kind, error) {
	e, err := m.lookup(h)
	if err != nil {
		return nil, 0, err
	}
	return e.layout, e.kind, nil
}

// Handles lists every registered handle, local and imported.
func (m *Manager) Handles() []LayoutHandle {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]LayoutHandle, 0, len(m.entries))
	for h := range m.entries {
		out = append(out, h)
	}
	return out
}

// Unregister removes a layout and releases what the manager allocated for
// it. The caller makes sure no transfer uses it.
func (m *Manager) Unregister(h LayoutHandle) error {
	m.mu.Lock()
	e, ok := m.entries[h]
	delete(m.entries, h)
	m.published()
	m.mu.Unlock()
	if !ok {
		return m.missing(h)
	}
	return e.release()
}
