package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// CoordinatedWorker is the leader's view of one worker: which handles it
// has, and the handles of remote workers (by remote leader and rank) it can
// pull from. The inner worker executes; this type only routes. Safe for
// concurrent use.
type CoordinatedWorker struct {
	inner Worker
	rank  int
	host  InstanceID

	mu     sync.RWMutex
	local  Handles
	remote map[remoteWorker]Handles
}

type remoteWorker struct {
	leader InstanceID
	rank   int
}

var _ ObjectBlockOps = (*CoordinatedWorker)(nil)

// NewCoordinated wraps a worker with rank rank, hosted by instance host.
func NewCoordinated(inner Worker, rank int, host InstanceID) *CoordinatedWorker {
	return &CoordinatedWorker{inner: inner, rank: rank, host: host, remote: map[remoteWorker]Handles{}}
}

// Rank is the worker's rank.
func (c *CoordinatedWorker) Rank() int { return c.rank }

// HostInstance is the instance hosting the worker.
func (c *CoordinatedWorker) HostInstance() InstanceID { return c.host }

// Inner is the wrapped worker.
func (c *CoordinatedWorker) Inner() Worker { return c.inner }

// SetLocal records the handle of local tier t; a second set of the same
// tier is an error.
func (c *CoordinatedWorker) SetLocal(t Tier, h transfer.LayoutHandle) error {
	if !t.valid() {
		return fmt.Errorf("%w: tier %v has no layout", kvbmerr.ErrInvalidArgument, t)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	slot := c.local.slot(t)
	if *slot != nil {
		return fmt.Errorf("%w: %v handle was already set (%v)", ErrAlreadyExists, t, **slot)
	}
	*slot = &h
	return nil
}

// Local returns the handle of local tier t, if set.
func (c *CoordinatedWorker) Local(t Tier) (transfer.LayoutHandle, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if h := c.local.get(t); h != nil {
		return *h, true
	}
	return transfer.LayoutHandle{}, false
}

// ApplyLayoutResponse records the local handles named in the metadata the
// worker returned after configuring its layouts. A tier already set to the
// same handle is fine; set to another is an error, and nothing is applied.
func (c *CoordinatedWorker) ApplyLayoutResponse(response []byte) error {
	md, err := DecodeMetadata(response)
	if err != nil {
		return fmt.Errorf("apply layout response: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next := c.local
	for _, l := range md.Layouts {
		slot := next.slot(l.Tier)
		if *slot != nil && **slot != l.Handle {
			return fmt.Errorf("%w: apply layout response: %v is %v, the response says %v",
				ErrAlreadyExists, l.Tier, **slot, l.Handle)
		}
		h := l.Handle
		*slot = &h
	}
	c.local = next
	return nil
}

// ImportRemoteMetadata imports a remote worker's metadata into the inner
// worker and records its handles under (remote leader, rank).
func (c *CoordinatedWorker) ImportRemoteMetadata(leader InstanceID, rank int, metadata []byte) error {
	md, err := DecodeMetadata(metadata)
	if err != nil {
		return fmt.Errorf("import metadata of leader %x rank %d: %w", uint64(leader), rank, err)
	}
	if _, err := c.inner.ImportMetadata(metadata); err != nil {
		return fmt.Errorf("import metadata of leader %x rank %d: %w", uint64(leader), rank, err)
	}
	var hs Handles
	for _, l := range md.Layouts {
		h := l.Handle
		*hs.slot(l.Tier) = &h
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remote[remoteWorker{leader, rank}] = hs
	return nil
}

// ResolveRemoteHandle returns the handle of tier t of the remote worker.
func (c *CoordinatedWorker) ResolveRemoteHandle(leader InstanceID, rank int, t Tier) (transfer.LayoutHandle, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	hs, ok := c.remote[remoteWorker{leader, rank}]
	if !ok || hs.get(t) == nil {
		return transfer.LayoutHandle{}, false
	}
	return *hs.get(t), true
}

// HasRemoteMetadata reports whether the remote worker's metadata was
// imported.
func (c *CoordinatedWorker) HasRemoteMetadata(leader InstanceID, rank int) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.remote[remoteWorker{leader, rank}]
	return ok
}

// TransferFromRemote pulls blocks of the remote worker's tier src into
// local tier dst.
func (c *CoordinatedWorker) TransferFromRemote(leader InstanceID, rank int, src Tier, srcIDs []int, dst Tier, dstIDs []int,
	opts transfer.Options) (*transfer.Notification, error) {
	if !c.HasRemoteMetadata(leader, rank) {
		return nil, fmt.Errorf("%w: no metadata imported for leader %x rank %d", transfer.ErrNotFound, uint64(leader), rank)
	}
	h, ok := c.ResolveRemoteHandle(leader, rank, src)
	if !ok {
		return nil, fmt.Errorf("%w: leader %x rank %d has no %v layout", transfer.ErrNotFound, uint64(leader), rank, src)
	}
	return c.inner.ExecuteRemoteOnboard(RemoteLayout(h, srcIDs), dst, dstIDs, opts)
}

// HasBlocks asks the inner worker's object store.
func (c *CoordinatedWorker) HasBlocks(ctx context.Context, keys []object.Key) []object.Presence {
	return c.inner.HasBlocks(ctx, keys)
}

// PutBlocks stores blocks of tier src through the inner worker.
func (c *CoordinatedWorker) PutBlocks(ctx context.Context, keys []object.Key, src Tier, blockIDs []int) []object.Result {
	return c.inner.PutBlocks(ctx, keys, src, blockIDs)
}

// GetBlocks loads objects into tier dst through the inner worker.
func (c *CoordinatedWorker) GetBlocks(ctx context.Context, keys []object.Key, dst Tier, blockIDs []int) []object.Result {
	return c.inner.GetBlocks(ctx, keys, dst, blockIDs)
}
