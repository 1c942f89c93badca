package cache

import (
	"context"

	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
)

// blocks is a list of keys with the block each is read from and, for
// layout-to-layout copies, the block it is written to.
type blocks struct {
	keys     []pool.Key
	src, dst []int
}

func (b *blocks) add(k pool.Key, src, dst int) {
	b.keys = append(b.keys, k)
	b.src = append(b.src, src)
	b.dst = append(b.dst, dst)
}

// writeDown is what must be written to lower tiers before blocks the pools
// evicted are reused: G3 blocks to G4 first (G2 blocks may be about to
// overwrite them), then G2 blocks to G3 and to G4.
type writeDown struct {
	g3ToG4, g2ToG3, g2ToG4 blocks
}

func (wd *writeDown) empty() bool {
	return len(wd.g3ToG4.keys)+len(wd.g2ToG3.keys)+len(wd.g2ToG4.keys) == 0
}

// planWriteDown turns the victims the pools reported into write-down work,
// allocating G3 blocks for G2's victims (which may evict G3 blocks in
// turn); callers hold c.mu.
func (c *Cache) planWriteDown() writeDown {
	var wd writeDown
	for i := 0; i < len(c.victims); i++ { // G3's evictions extend the queue
		v := c.victims[i]
		switch {
		case v.tier == worker.G2 && c.g3Mode == WriteBack:
			ids, ds, err := c.g3.PrepareStore([]pool.Key{v.key})
			switch {
			case err == nil && ds[0] == pool.Store:
				wd.g2ToG3.add(v.key, v.id, ids[0])
			case err == nil && (ds[0] == pool.Present || ds[0] == pool.InFlight):
			case c.g4 != nil && c.g4Mode != WriteOff:
				// G3 has no block to spare (all held by transfers): the
				// block goes one tier further down rather than nowhere.
				if !c.g4.has(v.key) {
					wd.g2ToG4.add(v.key, v.id, -1)
				}
			default:
				c.counters.writeDownFailed++ // lost from every tier
			}
		case v.tier == worker.G2 && c.g4Mode == WriteBack && c.g3Mode == WriteOff:
			if !c.g4.has(v.key) {
				wd.g2ToG4.add(v.key, v.id, -1)
			}
		case v.tier == worker.G3 && c.g4Mode == WriteBack:
			if !c.g4.has(v.key) {
				wd.g3ToG4.add(v.key, v.id, -1)
			}
		}
	}
	c.victims = c.victims[:0]
	return wd
}

// runWriteDown does the work, in order, and records what landed. Blocks
// that fail are lost from the lower tier, which only costs a later miss.
func (c *Cache) runWriteDown(wd writeDown) {
	c.putObjects(worker.G3, wd.g3ToG4)
	if len(wd.g2ToG3.keys) > 0 {
		c.copyDown(wd.g2ToG3)
	}
	c.putObjects(worker.G2, wd.g2ToG4)
}

// copyDown copies G2 blocks to the G3 blocks prepared for them and
// registers those that landed.
func (c *Cache) copyDown(b blocks) {
	failed, _ := c.startCopy(worker.G2, worker.G3, b.src, b.dst)()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range b.keys {
		if failed(b.dst[i]) {
			_ = c.g3.Release(b.dst[i : i+1])
			c.counters.writeDownFailed++
			continue
		}
		if c.g3.Register([]pool.Key{k}, b.dst[i:i+1]) == nil {
			c.journalStored(k, b.dst[i])
		}
		c.counters.writtenDown++
	}
	c.collectEvents()
}

// failedOf waits for a transfer that started (err == nil) and tells which
// destination blocks failed, and why.
func failedOf(n *transfer.Notification, err error) (func(dstID int) bool, error) {
	if err == nil {
		if err = n.Wait(context.Background()); err == nil {
			return func(int) bool { return false }, nil
		}
		if ids := n.FailedBlocks(); len(ids) > 0 {
			set := setOf(ids)
			return func(id int) bool { return set[id] }, err
		}
	}
	return func(int) bool { return true }, err
}

// putObjects writes blocks of tier t to the object store and remembers
// those that landed.
func (c *Cache) putObjects(t worker.Tier, b blocks) {
	if len(b.keys) == 0 {
		return
	}
	results := c.w.PutBlocks(context.Background(), objectKeys(b.keys), t, b.src)
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range results {
		if r.Err != nil {
			c.counters.g4PutFailures++
			c.counters.writeDownFailed++
			continue
		}
		c.g4.add(b.keys[i])
		c.record(pool.Stored, b.keys[i])
		c.counters.g4Puts++
		c.counters.writtenDown++
	}
}

func setOf(ids []int) map[int]bool {
	m := make(map[int]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}
