package cache

import (
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
)

// A persistent G3 (worker.StandaloneConfig.G3PersistID): its file outlives
// the process, and the journal (journal.go) says which key each block
// holds. A new cache over it takes the blocks the journal names out of
// G3's free list at once, then vouches for them one by one in the
// background: a block is read back and its layers checked against the
// checksums recorded when it was written (transfer.BlockIO verifies
// them); only then is its key registered in G3 (a STORED event, a hit
// from then on). A block that fails is freed and its record dropped:
// never a hit.

// persist is the cache's persistent-G3 state; callers hold c.mu.
type persist struct {
	j  *journal
	g3 transfer.LayoutHandle
	// cleared: Reset ran; blocks not vouched for yet are not restored.
	cleared bool
}

// openPersist opens G3's journal for id and claims the blocks it names;
// the returned list is what restore vouches for. Callers hold no lock (the
// cache is not shared yet).
func (c *Cache) openPersist(id string, g3 transfer.LayoutHandle) ([]int, map[int]journalEntry, error) {
	named, reused, err := c.m.DiskNamed(g3)
	if err != nil {
		return nil, nil, err
	}
	if !named {
		return nil, nil, fmt.Errorf("%w: cache: a persistent G3 id is set but the G3 file has no name", transfer.ErrInvalidArgument)
	}
	l, _, err := c.m.Layout(g3)
	if err != nil {
		return nil, nil, err
	}
	cfg := l.Config()
	shape := journalShape{Blocks: uint32(cfg.NumBlocks), Layers: uint32(cfg.NumLayers), BlockBytes: uint64(cfg.BlockSize())}
	j, reset, err := openJournal(c.m.DiskDir(), id, shape)
	if err != nil {
		return nil, nil, err
	}
	if !reused && len(j.live) > 0 { // a new file: the journal vouches for nothing in it
		if err := j.clear(); err != nil {
			return nil, nil, err
		}
		reset = true
	}
	c.persist = &persist{j: j, g3: g3}
	ids := make([]int, 0, len(j.live))
	entries := make(map[int]journalEntry, len(j.live))
	for block, e := range j.live {
		if err := c.m.RestoreDiskChecksums(g3, block, e.crcs); err != nil {
			continue // another layer count: not this layout's (the header would have said)
		}
		ids = append(ids, block)
		entries[block] = e
	}
	sort.Ints(ids)
	if err := c.g3.Claim(ids); err != nil {
		return nil, nil, fmt.Errorf("cache: persistent G3: %w", err)
	}
	slog.Info("kvbm: persistent G3", "dir", c.m.DiskDir(), "blocks_to_verify", len(ids), "started_afresh", reset)
	return ids, entries, nil
}

// restore vouches for the claimed blocks (openPersist), in the background:
// each is read back with its checksums checked, then registered in G3.
func (c *Cache) restore(ids []int, entries map[int]journalEntry) {
	defer c.inflight.Done()
	bio, err := c.m.BlockIO(c.persist.g3)
	if err != nil {
		c.refuse(ids, err)
		return
	}
	buf := make([]byte, bio.BlockSize())
	for i, id := range ids {
		if !c.roomForEvents() {
			c.refuse(ids[i:], transfer.ErrClosed)
			return
		}
		err := bio.ReadBlock(id, buf)
		c.mu.Lock()
		if err == nil && c.persist.cleared {
			err = fmt.Errorf("the cache was reset")
		}
		if err == nil {
			err = c.g3.Register([]pool.Key{entries[id].key}, []int{id})
		}
		if err != nil {
			c.counters.g3Refused++
			_ = c.g3.Release([]int{id})
			_ = c.persist.j.removed(id, entries[id].key)
			slog.Warn("kvbm: persistent G3: a block is not restored", "block", id, "err", err)
		} else {
			c.counters.g3Restored++
		}
		c.collectEvents()
		c.mu.Unlock()
	}
}

// roomForEvents waits until the event queue is at most half full, so that
// the STORED event of a restored block is not dropped (an engine drains
// events once a step, and one that takes no steps yet drains none: the
// restore then waits for it); false once the cache is closed.
func (c *Cache) roomForEvents() bool {
	for {
		c.mu.Lock()
		c.collectEvents()
		closed, full := c.closed, c.events.Cap() > 0 && c.events.Len() >= c.events.Cap()/2
		c.mu.Unlock()
		if closed || !full {
			return !closed
		}
		time.Sleep(restoreWait)
	}
}

// restoreWait is how long a restore waits for the engine to drain events.
const restoreWait = 10 * time.Millisecond

// refuse frees claimed blocks that were not vouched for.
func (c *Cache) refuse(ids []int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.g3.Release(ids)
	c.counters.g3Refused += uint64(len(ids))
	slog.Warn("kvbm: persistent G3: blocks not restored", "blocks", len(ids), "err", err)
}

// journalStored records that G3 block id holds k, as it was just written;
// callers hold c.mu.
func (c *Cache) journalStored(k pool.Key, id int) {
	if c.persist == nil {
		return
	}
	crcs, err := c.m.DiskChecksums(c.persist.g3, id)
	if err == nil {
		err = c.persist.j.stored(id, k, crcs)
	}
	if err != nil {
		slog.Warn("kvbm: persistent G3: journal", "block", id, "err", err)
	}
}

// journalRemoved records that G3 block id no longer holds k; callers hold
// c.mu.
func (c *Cache) journalRemoved(k pool.Key, id int) {
	if c.persist == nil {
		return
	}
	if err := c.persist.j.removed(id, k); err != nil {
		slog.Warn("kvbm: persistent G3: journal", "block", id, "err", err)
	}
}

// journalCleared records that G3 holds nothing; callers hold c.mu.
func (c *Cache) journalCleared() {
	if c.persist == nil {
		return
	}
	c.persist.cleared = true
	if err := c.persist.j.clear(); err != nil {
		slog.Warn("kvbm: persistent G3: journal", "err", err)
	}
}
