package cache

import (
	"fmt"
	"sync"

	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Config configures a Cache.
type Config struct {
	// Worker executes the transfers; its G1 and G2 must be registered, G3
	// and an object store are used when present. Required.
	Worker *worker.PhysicalWorker
	// AdmitAfter is G2's admission policy: offload a key once it has been
	// seen this many times (offered or looked up for a load); 0 or 1:
	// always.
	AdmitAfter int
	// G3 and G4 say when blocks are written down to those tiers.
	G3, G4 WriteMode
	// MaxEvents bounds the stored/removed events not yet drained; 0 means
	// 65,536.
	MaxEvents int
	// PresenceCache bounds the G4 keys remembered as present; 0 means
	// 65,536.
	PresenceCache int
}

// Cache is a worker's tiered prefix cache. Safe for concurrent use.
type Cache struct {
	w        *worker.PhysicalWorker
	m        *transfer.Manager
	g1Blocks int
	g1Layers int
	g3Mode   WriteMode
	g4Mode   WriteMode

	mu sync.Mutex
	g2 *pool.Pool
	g3 *pool.Pool // nil without G3
	g4 *presence  // nil without an object store
	// victims are the blocks the pools evicted during the current call
	// that must be written down before their blocks are reused.
	victims  []victim
	events   pool.EventQueue
	drained  []pool.Event // scratch for collectEvents
	counters counters
	closed   bool
	// persist is set for a persistent G3 (persist.go).
	persist *persist
	// rates are the loads' measured throughput (rates.go); blockBytes the
	// bytes of a G1 block.
	rates      loadRates
	blockBytes int

	// inflight counts background work; Close waits for it.
	inflight sync.WaitGroup
}

type victim struct {
	tier worker.Tier
	key  pool.Key
	id   int
}

// New makes the cache of a worker whose G1 and G2 are registered.
func New(cfg Config) (*Cache, error) {
	if cfg.Worker == nil {
		return nil, fmt.Errorf("%w: cache: a worker is required", kvbmerr.ErrInvalidArgument)
	}
	w := cfg.Worker
	m := w.Manager()
	hs := w.Handles()
	if hs.G1 == nil || hs.G2 == nil {
		return nil, fmt.Errorf("%w: cache: register G1 and G2 before making the cache", transfer.ErrNotFound)
	}
	g1, _, err := m.Layout(*hs.G1)
	if err != nil {
		return nil, fmt.Errorf("cache: G1: %w", err)
	}
	c := &Cache{w: w, m: m, g1Blocks: g1.Config().NumBlocks, g1Layers: g1.Config().NumLayers,
		blockBytes: g1.Config().BlockSize(), events: pool.NewEventQueue(max(cfg.MaxEvents, 0))}
	c.g3Mode, c.g4Mode = cfg.G3, cfg.G4
	if hs.G3 == nil {
		c.g3Mode = WriteOff
	} else if c.g3Mode == WriteAuto {
		c.g3Mode = WriteBack
	}
	if !w.HasObjects() {
		c.g4Mode = WriteOff
	} else if c.g4Mode == WriteAuto {
		c.g4Mode = WriteBack
	}
	newPool := func(t worker.Tier, h transfer.LayoutHandle, admit int, writeBackBelow bool) (*pool.Pool, error) {
		l, _, err := m.Layout(h)
		if err != nil {
			return nil, fmt.Errorf("cache: %v: %w", t, err)
		}
		pc := pool.Config{Blocks: l.Config().NumBlocks, Tier: int(t), AdmitAfter: admit}
		if writeBackBelow {
			pc.OnEvict = func(k pool.Key, id int) { c.victims = append(c.victims, victim{t, k, id}) }
		}
		p, err := pool.New(pc)
		if err != nil {
			return nil, fmt.Errorf("cache: %v: %w", t, err)
		}
		return p, nil
	}
	if hs.G3 != nil {
		// G2's victims go to G3 in write-back, or to G4 when G3 is not
		// written back; G3's go to G4.
		if c.g2, err = newPool(worker.G2, *hs.G2, cfg.AdmitAfter, c.g3Mode == WriteBack || c.g4Mode == WriteBack); err != nil {
			return nil, err
		}
		if c.g3, err = newPool(worker.G3, *hs.G3, 0, c.g4Mode == WriteBack); err != nil {
			return nil, err
		}
	} else if c.g2, err = newPool(worker.G2, *hs.G2, cfg.AdmitAfter, c.g4Mode == WriteBack); err != nil {
		return nil, err
	}
	if w.HasObjects() {
		c.g4 = newPresence(cfg.PresenceCache)
	}
	if id := w.G3PersistID(); id != "" && hs.G3 != nil {
		ids, entries, err := c.openPersist(id, *hs.G3)
		if err != nil {
			return nil, err
		}
		c.inflight.Add(1)
		go c.restore(ids, entries)
	}
	return c, nil
}

// Close waits for the cache's background work (write-through, the tails of
// offloads and onboards) and refuses later calls. Close it before the
// worker.
func (c *Cache) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.inflight.Wait()
	if c.persist != nil {
		return c.persist.j.close()
	}
	return nil
}

// Quiesce waits until the background work started by calls that have
// returned (write-through, promotions into G2, the tails of offloads and
// onboards) has ended: for a figure taken right after a load, or a test.
func (c *Cache) Quiesce() { c.inflight.Wait() }

// begin starts a call under c.mu: it fails once the cache is closed, and
// counts the call as in flight until done is called.
func (c *Cache) begin() error {
	if c.closed {
		return fmt.Errorf("%w: the cache is closed", transfer.ErrClosed)
	}
	c.inflight.Add(1)
	return nil
}

// collectEvents moves the pools' new events into the cache's ordered
// stream; callers hold c.mu.
func (c *Cache) collectEvents() {
	for _, p := range []*pool.Pool{c.g2, c.g3} {
		if p == nil {
			continue
		}
		c.drained = p.DrainEvents(c.drained[:0], 0)
		for _, e := range c.drained {
			c.events.Add(e)
		}
	}
}

// record appends a G4 event; callers hold c.mu.
func (c *Cache) record(kind pool.EventKind, k pool.Key) {
	c.events.Add(pool.Event{Kind: kind, Tier: int(worker.G4), Key: k})
}

// DrainEvents appends up to max of the oldest events (all when max <= 0)
// to dst, in the order they happened across tiers, and forgets them.
func (c *Cache) DrainEvents(dst []pool.Event, max int) []pool.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.collectEvents()
	return c.events.Drain(dst, max)
}

// keysOf converts and checks a call's keys: 1 to 64 bytes each, no repeats.
func keysOf(raw [][]byte) ([]pool.Key, error) {
	keys, err := pool.Keys(raw)
	if err != nil {
		return nil, err
	}
	seen := make(map[pool.Key]int, len(keys))
	for i, k := range keys {
		if j, dup := seen[k]; dup {
			return nil, fmt.Errorf("%w: keys[%d] repeats keys[%d] (%v)", kvbmerr.ErrInvalidArgument, i, j, k)
		}
		seen[k] = i
	}
	return keys, nil
}

// checkG1 checks G1 block ids against the layout: in range and, for
// destinations, distinct.
func (c *Cache) checkG1(ids []int, distinct bool) error {
	seen := make(map[int]int, len(ids))
	for i, id := range ids {
		if id < 0 || id >= c.g1Blocks {
			return fmt.Errorf("%w: G1 block ids[%d] = %d, G1 has blocks [0, %d)", kvbmerr.ErrOutOfRange, i, id, c.g1Blocks)
		}
		if j, dup := seen[id]; dup && distinct {
			return fmt.Errorf("%w: G1 block id %d repeated (ids[%d] and ids[%d])", kvbmerr.ErrInvalidArgument, id, j, i)
		}
		seen[id] = i
	}
	return nil
}
