package cache

import "github.com/kvbm/kvbm/core/pool"

// Reset forgets every key G2 and G3 hold (an engine's reset of its prefix
// cache): their blocks are free for new stores, a REMOVED event is recorded
// for each key, and a block a transfer holds loses its key at once and is
// freed when the transfer lets go. Keys still being stored are not touched:
// they land afterwards. G4 is kept: its objects outlive the process and may
// be shared with other instances. It returns how many keys left each tier.
func (c *Cache) Reset() (g2, g3 int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.begin(); err != nil {
		return 0, 0, err
	}
	defer c.inflight.Done()
	g2 = c.g2.Clear()
	for _, p := range []*pool.Pool{c.g3} {
		if p != nil {
			g3 = p.Clear()
		}
	}
	c.journalCleared()
	c.collectEvents()
	return g2, g3, nil
}
