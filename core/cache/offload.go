package cache

import (
	"fmt"

	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Offload saves G1 block g1[i], which holds the KV of keys[i], to G2 —
// unless the key is cached or being stored already (dedupe), not admitted
// yet, or no G2 block can be had; the decision per key is returned. The
// copy waits for precondition (the engine's compute event; 0 for none).
// Blocks that land are registered, then written down to G3 and G4 as
// configured; a block that fails is never registered, and the
// notification names the G1 blocks that failed. The engine may reuse the
// G1 blocks once the notification completes.
//
// When G2 blocks must be evicted and written down first, the write-down
// runs before the copy: within this call when a precondition event is
// given (the copy must be ordered after the event as it stands now), in
// the background otherwise.
func (c *Cache) Offload(raw [][]byte, g1 []int, precondition cuda.Event) (*transfer.Notification, []pool.Decision, error) {
	if len(raw) != len(g1) {
		return nil, nil, fmt.Errorf("%w: offload: %d keys but %d G1 block ids", kvbmerr.ErrInvalidArgument, len(raw), len(g1))
	}
	keys, err := keysOf(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("offload: %w", err)
	}
	if err := c.checkG1(g1, false); err != nil {
		return nil, nil, fmt.Errorf("offload: %w", err)
	}
	c.mu.Lock()
	if err := c.begin(); err != nil {
		c.mu.Unlock()
		return nil, nil, err
	}
	ids, ds, err := c.g2.PrepareStore(keys)
	if err != nil {
		c.mu.Unlock()
		c.inflight.Done()
		return nil, nil, fmt.Errorf("offload: %w", err)
	}
	wd := c.planWriteDown()
	c.collectEvents()
	var st blocks // G1 source, G2 destination
	for i, d := range ds {
		switch d {
		case pool.Store:
			st.add(keys[i], g1[i], ids[i])
		case pool.Present, pool.InFlight:
			c.counters.deduped++
		case pool.NotAdmitted:
			c.counters.notAdmitted++
		case pool.NoSpace:
			c.counters.noSpace++
		}
	}
	c.mu.Unlock()
	if len(st.keys) == 0 && wd.empty() {
		c.inflight.Done()
		return transfer.Completed(nil), ds, nil
	}
	var n *transfer.Notification
	if precondition != 0 || wd.empty() {
		c.runWriteDown(wd)
		if n, err = c.w.ExecuteLocalTransfer(worker.G1, worker.G2, st.src, st.dst, transfer.Options{Precondition: precondition}); err != nil {
			c.mu.Lock()
			_ = c.g2.Release(st.dst)
			c.mu.Unlock()
			c.inflight.Done()
			return nil, nil, fmt.Errorf("offload: %w", err)
		}
	}
	return transfer.Go(func() error {
		defer c.inflight.Done()
		var err error
		if n == nil {
			c.runWriteDown(wd)
			n, err = c.w.ExecuteLocalTransfer(worker.G1, worker.G2, st.src, st.dst, transfer.Options{})
		}
		failed, err := failedOf(n, err)
		return c.landed(st, failed, err)
	}), ds, nil
}

// landed registers the offloaded blocks that arrived in G2, releases the
// others, and starts the write-through of what landed.
func (c *Cache) landed(st blocks, failed func(int) bool, err error) error {
	var ok blocks
	var bad []int
	c.mu.Lock()
	for i, k := range st.keys {
		if failed(st.dst[i]) {
			_ = c.g2.Release(st.dst[i : i+1])
			bad = append(bad, st.src[i])
			continue
		}
		if rerr := c.g2.Register([]pool.Key{k}, st.dst[i:i+1]); rerr != nil {
			_ = c.g2.Release(st.dst[i : i+1])
			bad = append(bad, st.src[i])
			err = rerr
			continue
		}
		ok.add(k, st.dst[i], -1)
	}
	c.counters.offloaded += uint64(len(ok.keys))
	c.counters.offloadFailed += uint64(len(bad))
	wt := c.planWriteThrough(ok)
	c.collectEvents()
	c.mu.Unlock()
	if !wt.empty() {
		c.inflight.Add(1)
		go func() {
			defer c.inflight.Done()
			c.runWriteThrough(wt)
		}()
	}
	if len(bad) == 0 {
		return nil
	}
	return transfer.Failed(transfer.LayoutHandle{}, transfer.LayoutHandle{}, bad,
		fmt.Errorf("offload: %d of %d G1 blocks were not saved: %w", len(bad), len(st.keys), err))
}

// writeThrough copies blocks that just landed in G2 to G3 and G4, with the
// G2 blocks pinned while they are read.
type writeThrough struct {
	g3, g4 blocks
	pinned []int
	wd     writeDown
}

func (wt *writeThrough) empty() bool { return len(wt.g3.keys)+len(wt.g4.keys) == 0 && wt.wd.empty() }

// planWriteThrough prepares the write-through of blocks now in G2; callers
// hold c.mu.
func (c *Cache) planWriteThrough(in2 blocks) writeThrough {
	var wt writeThrough
	if len(in2.keys) == 0 {
		return wt
	}
	if c.g3Mode == WriteThrough {
		ids, ds, err := c.g3.PrepareStore(in2.keys)
		if err == nil {
			for i, d := range ds {
				if d == pool.Store {
					wt.g3.add(in2.keys[i], in2.src[i], ids[i])
				}
			}
		}
	}
	if c.g4Mode == WriteThrough {
		for i, k := range in2.keys {
			if !c.g4.has(k) {
				wt.g4.add(k, in2.src[i], -1)
			}
		}
	}
	pinned := setOf(append(append([]int(nil), wt.g3.src...), wt.g4.src...))
	for id := range pinned {
		wt.pinned = append(wt.pinned, id)
	}
	_ = c.g2.Pin(wt.pinned) // registered just now, under the same lock
	wt.wd = c.planWriteDown()
	return wt
}

func (c *Cache) runWriteThrough(wt writeThrough) {
	c.runWriteDown(wt.wd)
	if len(wt.g3.keys) > 0 {
		c.copyDown(wt.g3)
	}
	c.putObjects(worker.G2, wt.g4)
	c.mu.Lock()
	_ = c.g2.Unpin(wt.pinned)
	c.mu.Unlock()
}
