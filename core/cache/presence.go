package cache

import (
	"context"

	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/pool"
)

// presence remembers G4 keys known to be present — put by this cache or
// found by asking the store — so that Match asks the store only about the
// rest. Absence is never remembered: other instances share the store.
type presence struct {
	known map[pool.Key]struct{}
	limit int
}

func newPresence(limit int) *presence {
	if limit <= 0 {
		limit = 1 << 16
	}
	// Match relies on a batch of answers (64) outliving its own insertion.
	limit = max(limit, 1024)
	return &presence{known: make(map[pool.Key]struct{}), limit: limit}
}

func (p *presence) has(k pool.Key) bool { _, ok := p.known[k]; return ok }

func (p *presence) add(k pool.Key) {
	if len(p.known) >= p.limit {
		clear(p.known) // forget it all: a miss only costs a question to the store
	}
	p.known[k] = struct{}{}
}

func (p *presence) drop(k pool.Key) { delete(p.known, k) }

// objectKeys converts pool keys to the store's keys (the same bytes).
func objectKeys(keys []pool.Key) []object.Key {
	out := make([]object.Key, len(keys))
	for i, k := range keys {
		out[i], _ = object.NewKey(k.Bytes()) // a pool key is a valid object key
	}
	return out
}

// askStore asks the store whether keys are present, in batches, stopping
// at the first that is not, and remembers those that are. It returns how
// many leading keys are present. It runs without c.mu.
func (c *Cache) askStore(keys []pool.Key) int {
	const batch = 64
	n := 0
	for n < len(keys) {
		chunk := keys[n:min(len(keys), n+batch)]
		found := c.w.HasBlocks(context.Background(), objectKeys(chunk))
		c.mu.Lock()
		for i, f := range found {
			if !f.Found {
				c.mu.Unlock()
				return n
			}
			c.g4.add(chunk[i])
			n++
		}
		c.mu.Unlock()
	}
	return n
}
