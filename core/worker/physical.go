package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
)

// PhysicalConfig configures a PhysicalWorker.
type PhysicalConfig struct {
	// Manager executes the transfers; required.
	Manager *transfer.Manager
	// Handles of tiers already registered with Manager (optional; tiers
	// can also be registered later, once each).
	Handles Handles
	// Rank is the worker's rank under its leader, for object keys.
	Rank int
	// Objects is the G4 store, or nil.
	Objects object.Store
	// Loopback, when set, serves the worker's layouts to workers of this
	// process and reaches theirs directly.
	Loopback *remote.Loopback
	// Network, when set, serves the worker's layouts to other processes
	// and reaches theirs (TCP or UCX). The worker closes it.
	Network remote.Transport
}

// PhysicalWorker executes transfers with its own transfer manager. Safe
// for concurrent use.
type PhysicalWorker struct {
	m        *transfer.Manager
	rank     int
	objects  object.Store
	loopback *remote.Loopback
	network  remote.Transport

	mu      sync.RWMutex
	handles Handles
	// remote maps (instance, tier) to the instance's handle, from
	// ConnectRemote.
	remote map[remoteTier]transfer.LayoutHandle
	// peers are the network connections made by imports, by worker id.
	peers map[uint64]remote.Peer
	// members are the peers ConnectRemote made for an instance that
	// joined another (request-scoped ones, remote.Joiner): they leave it
	// at DisconnectRemote.
	members map[InstanceID]remote.Peer
	// lent is set by UnregisterG1 (withdraw.go).
	lent *lentG1
	// g1Change orders G1's registrations and unregistrations: G1 is not
	// registered again while its withdrawal still waits for transfers.
	g1Change sync.Mutex

	// owned is set by NewStandalone: Close closes m.
	owned bool
	// g3PersistID: G3 is persistent, its journal for this id (standalone.go).
	g3PersistID string
}

type remoteTier struct {
	instance InstanceID
	tier     Tier
}

var _ Worker = (*PhysicalWorker)(nil)

// A host tier's block is lent to the object store, which reads a G4 get
// straight into it.
var _ object.HostBlockIO = (*transfer.BlockIO)(nil)

// NewPhysical makes a worker over a transfer manager.
func NewPhysical(cfg PhysicalConfig) (*PhysicalWorker, error) {
	if cfg.Manager == nil {
		return nil, fmt.Errorf("physical worker: a transfer manager is required")
	}
	w := &PhysicalWorker{m: cfg.Manager, rank: cfg.Rank, objects: cfg.Objects,
		remote: map[remoteTier]transfer.LayoutHandle{}, peers: map[uint64]remote.Peer{}, members: map[InstanceID]remote.Peer{}}
	if err := w.serve(cfg.Loopback, cfg.Network); err != nil {
		return nil, err
	}
	for _, t := range []Tier{G1, G2, G3} {
		if h := cfg.Handles.get(t); h != nil {
			if err := w.SetHandle(t, *h); err != nil {
				return nil, errors.Join(err, w.leave())
			}
		}
	}
	return w, nil
}

// Manager is the worker's transfer manager.
func (w *PhysicalWorker) Manager() *transfer.Manager { return w.m }

// Rank is the worker's rank.
func (w *PhysicalWorker) Rank() int { return w.rank }

// Counters returns the totals of every path the worker's transfers took,
// indexed by transfer.Path.
func (w *PhysicalWorker) Counters() [transfer.NumPaths]transfer.PathCounters { return w.m.Counters() }

// Handles returns the registered tiers' handles.
func (w *PhysicalWorker) Handles() Handles {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.handles
}

// SetHandle names the layout that serves as tier t; each tier is set once.
func (w *PhysicalWorker) SetHandle(t Tier, h transfer.LayoutHandle) error {
	if !t.valid() {
		return fmt.Errorf("%w: tier %v has no layout", kvbmerr.ErrInvalidArgument, t)
	}
	if _, _, err := w.m.Layout(h); err != nil {
		return fmt.Errorf("set %v: %w", t, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	slot := w.handles.slot(t)
	if *slot != nil {
		return fmt.Errorf("%w: %v is already registered as %v", ErrAlreadyExists, t, **slot)
	}
	*slot = &h
	return nil
}

// ErrAlreadyExists is returned when a tier or handle is set twice.
var ErrAlreadyExists = kvbmerr.ErrAlreadyExists

// RegisterG1 registers the engine's KV cache tensors (device pointers, one
// per layer for LayerSeparate, one for FullyContiguous) as G1; after
// UnregisterG1, again, with the config and shape it had.
func (w *PhysicalWorker) RegisterG1(cfg layout.Config, shape transfer.Shape, ptrs []uint64) (transfer.LayoutHandle, error) {
	w.g1Change.Lock()
	defer w.g1Change.Unlock()
	if err := w.checkG1Back(layoutShape{cfg, shape}); err != nil {
		return transfer.LayoutHandle{}, fmt.Errorf("register G1: %w", err)
	}
	return w.register(G1, func() (transfer.LayoutHandle, error) {
		return w.m.RegisterExternal(storage.Device, cfg, shape, ptrs)
	})
}

// RegisterG1Host registers host memory the engine owns as G1 — the tier
// the prefix cache loads into and saves from — for engines whose working
// KV lives in host memory (SGLang's HiCache host pool), pinning it in place
// (or using it as its owner pinned it).
func (w *PhysicalWorker) RegisterG1Host(cfg layout.Config, shape transfer.Shape, ptrs []uint64) (transfer.LayoutHandle, error) {
	w.g1Change.Lock()
	defer w.g1Change.Unlock()
	if err := w.checkG1Back(layoutShape{cfg, shape}); err != nil {
		return transfer.LayoutHandle{}, fmt.Errorf("register G1: %w", err)
	}
	return w.register(G1, func() (transfer.LayoutHandle, error) {
		return w.m.RegisterExternal(storage.Pinned, cfg, shape, ptrs)
	})
}

// RegisterG2 registers host memory the engine owns (its host KV pool) as
// G2, pinning it with the driver: transfers then read and write it in
// place, with no copy into memory of the worker's own.
func (w *PhysicalWorker) RegisterG2(cfg layout.Config, shape transfer.Shape, ptrs []uint64) (transfer.LayoutHandle, error) {
	return w.register(G2, func() (transfer.LayoutHandle, error) {
		return w.m.RegisterExternal(storage.Pinned, cfg, shape, ptrs)
	})
}

// AllocateG2 allocates pinned host memory for G2.
func (w *PhysicalWorker) AllocateG2(cfg layout.Config, shape transfer.Shape) (transfer.LayoutHandle, error) {
	return w.register(G2, func() (transfer.LayoutHandle, error) {
		return w.m.AllocateLayout(storage.Pinned, cfg, shape)
	})
}

// AllocateG3 allocates a disk file for G3.
func (w *PhysicalWorker) AllocateG3(cfg layout.Config, shape transfer.Shape) (transfer.LayoutHandle, error) {
	return w.register(G3, func() (transfer.LayoutHandle, error) {
		return w.m.AllocateLayout(storage.Disk, cfg, shape)
	})
}

func (w *PhysicalWorker) register(t Tier, make func() (transfer.LayoutHandle, error)) (transfer.LayoutHandle, error) {
	if h := w.Handles().get(t); h != nil {
		return transfer.LayoutHandle{}, fmt.Errorf("%w: %v is already registered as %v", ErrAlreadyExists, t, *h)
	}
	h, err := make()
	if err != nil {
		return transfer.LayoutHandle{}, fmt.Errorf("register %v: %w", t, err)
	}
	if err := w.SetHandle(t, h); err != nil {
		return transfer.LayoutHandle{}, errors.Join(err, w.m.Unregister(h))
	}
	return h, nil
}

// handle resolves a tier to its handle; role names it in errors.
func (w *PhysicalWorker) handle(t Tier, role string) (transfer.LayoutHandle, error) {
	if t == G4 {
		return transfer.LayoutHandle{}, fmt.Errorf("%w: %s tier G4 is object storage, not a layout; use the object operations",
			kvbmerr.ErrUnsupported, role)
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	h := w.handles.get(t)
	if h == nil && t == G1 && w.lent != nil {
		return transfer.LayoutHandle{}, fmt.Errorf("%w: %s layout: %s", transfer.ErrWithdrawn, role, w.g1Missing())
	}
	if h == nil {
		return transfer.LayoutHandle{}, fmt.Errorf("%w: %s layout %v is not registered", transfer.ErrNotFound, role, t)
	}
	return *h, nil
}

// ExportMetadata encodes every registered tier's layout with its tier.
// The metadata is a read-write capability: whoever holds it may read and
// write the layouts (ExportReadOnlyMetadata for one that reads only).
func (w *PhysicalWorker) ExportMetadata() ([]byte, error) { return w.exportMetadata(false) }

// ExportReadOnlyMetadata is ExportMetadata with a read-only capability:
// its holder may read the layouts (a decode pulling from a prefill),
// its writes are refused by this worker's server.
func (w *PhysicalWorker) ExportReadOnlyMetadata() ([]byte, error) { return w.exportMetadata(true) }

func (w *PhysicalWorker) exportMetadata(readOnly bool) ([]byte, error) {
	eps, err := w.exportEndpoints(readOnly)
	if err != nil {
		return nil, fmt.Errorf("export metadata: %w", err)
	}
	md := Metadata{WorkerID: w.m.WorkerID(), Endpoints: eps}
	hs := w.Handles()
	for _, t := range []Tier{G1, G2, G3} {
		if h := hs.get(t); h != nil {
			d, err := w.m.Describe(*h)
			if err != nil {
				return nil, fmt.Errorf("export %v: %w", t, err)
			}
			md.Layouts = append(md.Layouts, LogicalDescriptor{Tier: t, Descriptor: d})
		}
	}
	return md.Encode()
}

// ImportMetadata decodes another worker's metadata and makes its layouts
// reachable through the worker's transport.
func (w *PhysicalWorker) ImportMetadata(b []byte) ([]transfer.LayoutHandle, error) {
	md, err := DecodeMetadata(b)
	if err != nil {
		return nil, err
	}
	hs, _, err := w.importDecoded(md)
	return hs, err
}

// importDecoded connects to md's worker and imports its layouts; made is
// the network peer connected (connect).
func (w *PhysicalWorker) importDecoded(md Metadata) (hs []transfer.LayoutHandle, made remote.Peer, err error) {
	if md.WorkerID == w.m.WorkerID() {
		return nil, nil, fmt.Errorf("%w: metadata of worker %x is this worker's own", kvbmerr.ErrInvalidArgument, md.WorkerID)
	}
	a, made, err := w.connect(md)
	if err != nil {
		return nil, nil, fmt.Errorf("import metadata of worker %x: %w", md.WorkerID, err)
	}
	if hs, err = w.m.Import(a, md.descriptors()); err != nil && made != nil {
		w.mu.Lock()
		if j, ok := w.peers[md.WorkerID].(remote.Joiner); ok && j != made && j.Leave(made) {
			delete(w.peers, md.WorkerID)
		}
		w.mu.Unlock()
	}
	return hs, made, err
}

// ExecuteLocalTransfer copies blocks between two of this worker's tiers.
func (w *PhysicalWorker) ExecuteLocalTransfer(src, dst Tier, srcIDs, dstIDs []int, opts transfer.Options) (*transfer.Notification, error) {
	sh, err := w.handle(src, "source")
	if err != nil {
		return nil, err
	}
	dh, err := w.handle(dst, "destination")
	if err != nil {
		return nil, err
	}
	return w.m.ExecuteTransfer(sh, srcIDs, dh, dstIDs, opts)
}

// ExecuteLayerwiseOnboard copies G2 blocks to G1 one layer at a time on one
// stream, recording events[L] after layer L (seed 001's layer-wise
// onboard). len(events) must equal the number of layers; the manager
// validates the whole request.
func (w *PhysicalWorker) ExecuteLayerwiseOnboard(srcIDs, dstIDs []int, events []cuda.Event, stream *cuda.Stream) (*transfer.Notification, error) {
	g2, err := w.handle(G2, "source")
	if err != nil {
		return nil, err
	}
	g1, err := w.handle(G1, "destination")
	if err != nil {
		return nil, err
	}
	return w.m.ExecuteLayerwiseOnboard(g2, srcIDs, g1, dstIDs, events, stream)
}

// ExecuteRemoteOnboard pulls a remote layout's blocks, or objects, into
// tier dst.
func (w *PhysicalWorker) ExecuteRemoteOnboard(src RemoteDescriptor, dst Tier, dstIDs []int, opts transfer.Options) (*transfer.Notification, error) {
	dh, err := w.handle(dst, "destination")
	if err != nil {
		return nil, err
	}
	if src.Handle != nil {
		return w.m.ExecuteTransfer(*src.Handle, src.BlockIDs, dh, dstIDs, opts)
	}
	return w.objectTransfer(src.Keys, dst, dh, dstIDs, false)
}

// ExecuteRemoteOffload pushes blocks of tier src to a remote layout or to
// objects.
func (w *PhysicalWorker) ExecuteRemoteOffload(src Tier, srcIDs []int, dst RemoteDescriptor, opts transfer.Options) (*transfer.Notification, error) {
	sh, err := w.handle(src, "source")
	if err != nil {
		return nil, err
	}
	if dst.Handle != nil {
		return w.m.ExecuteTransfer(sh, srcIDs, *dst.Handle, dst.BlockIDs, opts)
	}
	return w.objectTransfer(dst.Keys, src, sh, srcIDs, true)
}

// objectTransfer runs a put (offload) or get (onboard) in the background;
// the notification fails with the block ids whose objects failed.
func (w *PhysicalWorker) objectTransfer(keys []object.Key, t Tier, h transfer.LayoutHandle, ids []int, put bool) (*transfer.Notification, error) {
	if w.objects == nil {
		return nil, fmt.Errorf("%w: no object store configured", kvbmerr.ErrUnsupported)
	}
	bio, err := w.m.BlockIO(h)
	if err != nil {
		return nil, err
	}
	if err := checkObjectBlocks(keys, bio.NumBlocks(), ids, !put); err != nil {
		return nil, err
	}
	return w.m.Go(func() error {
		return objectFailure(h, ids, w.storeBlocks(context.Background(), keys, bio, ids, put), put)
	})
}

func objectFailure(h transfer.LayoutHandle, ids []int, results []object.Result, put bool) error {
	var failed transfer.Failures
	for i, r := range results {
		failed.Add(r.Err, ids[i])
	}
	first := failed.First()
	if first == nil {
		return nil
	}
	verb := "download"
	if put {
		verb = "upload"
	}
	err := fmt.Errorf("%d of %d blocks failed to %s, first: %w", failed.Len(), len(results), verb, first)
	return transfer.Failed(transfer.LayoutHandle{}, h, failed.Blocks(), err)
}

// ConnectRemote imports an instance's metadata — exactly one item — and
// remembers its handles by tier.
func (w *PhysicalWorker) ConnectRemote(instance InstanceID, metadata [][]byte) error {
	if len(metadata) != 1 {
		return fmt.Errorf("%w: a physical worker connects with exactly 1 metadata item, got %d",
			kvbmerr.ErrInvalidArgument, len(metadata))
	}
	md, err := DecodeMetadata(metadata[0])
	if err != nil {
		return err
	}
	_, made, err := w.importDecoded(md)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, scoped := made.(remote.Joiner); scoped {
		w.members[instance] = made
	}
	for _, l := range md.Layouts {
		w.remote[remoteTier{instance, l.Tier}] = l.Handle
	}
	return nil
}

// HasRemoteMetadata reports whether the instance was connected.
func (w *PhysicalWorker) HasRemoteMetadata(instance InstanceID) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	for k := range w.remote {
		if k.instance == instance {
			return true
		}
	}
	return false
}

// ExecuteRemoteOnboardForInstance pulls blocks of a connected instance's
// tier into local tier dst.
func (w *PhysicalWorker) ExecuteRemoteOnboardForInstance(instance InstanceID, remote Tier, srcIDs []int, dst Tier, dstIDs []int,
	opts transfer.Options) (*transfer.Notification, error) {
	w.mu.RLock()
	h, ok := w.remote[remoteTier{instance, remote}]
	w.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: no remote %v handle for instance %x", transfer.ErrNotFound, remote, uint64(instance))
	}
	return w.ExecuteRemoteOnboard(RemoteLayout(h, srcIDs), dst, dstIDs, opts)
}

// HasBlocks asks the object store; without one, nothing is found.
func (w *PhysicalWorker) HasBlocks(ctx context.Context, keys []object.Key) []object.Presence {
	if w.objects == nil {
		out := make([]object.Presence, len(keys))
		for i, k := range keys {
			out[i] = object.Presence{Key: k}
		}
		return out
	}
	return w.objects.HasBlocks(ctx, keys)
}

// PutBlocks stores blocks of tier src under keys.
func (w *PhysicalWorker) PutBlocks(ctx context.Context, keys []object.Key, src Tier, blockIDs []int) []object.Result {
	return w.objectBlocks(ctx, keys, src, blockIDs, true)
}

// GetBlocks loads objects into blocks of tier dst.
func (w *PhysicalWorker) GetBlocks(ctx context.Context, keys []object.Key, dst Tier, blockIDs []int) []object.Result {
	return w.objectBlocks(ctx, keys, dst, blockIDs, false)
}

func (w *PhysicalWorker) objectBlocks(ctx context.Context, keys []object.Key, t Tier, ids []int, put bool) []object.Result {
	fail := func(err error) []object.Result {
		out := make([]object.Result, len(keys))
		for i, k := range keys {
			out[i] = object.Result{Key: k, Err: err}
		}
		return out
	}
	if w.objects == nil {
		return fail(fmt.Errorf("%w: no object store configured", kvbmerr.ErrUnsupported))
	}
	h, err := w.handle(t, "object")
	if err != nil {
		return fail(err)
	}
	bio, err := w.m.BlockIO(h)
	if err != nil {
		return fail(err)
	}
	if err := checkObjectBlocks(keys, bio.NumBlocks(), ids, !put); err != nil {
		return fail(err)
	}
	return w.storeBlocks(ctx, keys, bio, ids, put)
}

// checkObjectBlocks refuses a put or get before anything starts, with the
// errors of a transfer (and so the statuses of kvbm_worker_transfer): a key
// count that differs from the block count, a block id beyond the layout
// (ErrOutOfRange), and a destination block named twice — two objects
// landing in one block would leave it holding whichever finished last. A
// source block may be stored under several keys.
func checkObjectBlocks(keys []object.Key, numBlocks int, ids []int, dst bool) error {
	if len(keys) != len(ids) {
		return fmt.Errorf("%w: %d object keys but %d block ids", kvbmerr.ErrInvalidArgument, len(keys), len(ids))
	}
	role := "source"
	var seen map[int]int
	if dst {
		role, seen = "destination", make(map[int]int, len(ids))
	}
	for i, id := range ids {
		if id < 0 || id >= numBlocks {
			return fmt.Errorf("%w: %s block id %d (index %d) out of range [0, %d)", kvbmerr.ErrOutOfRange, role, id, i, numBlocks)
		}
		if seen == nil {
			continue
		}
		if j, dup := seen[id]; dup {
			return fmt.Errorf("%w: %s block id %d appears twice (indices %d and %d)", kvbmerr.ErrInvalidArgument, role, id, j, i)
		}
		seen[id] = i
	}
	return nil
}

// storeBlocks puts blocks of bio under keys, or gets them into bio.
func (w *PhysicalWorker) storeBlocks(ctx context.Context, keys []object.Key, bio object.BlockIO, ids []int, put bool) []object.Result {
	if put {
		return w.objects.PutBlocksWithLayout(ctx, keys, bio, ids)
	}
	return w.objects.GetBlocksWithLayout(ctx, keys, bio, ids)
}
