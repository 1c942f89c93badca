package cache

import (
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/worker"
)

// Match returns how many leading keys can be onboarded now and the tier
// each would come from (G2 before G3 before G4). It changes nothing a later
// call depends on (it may remember G4 keys the store has): a scheduler may
// ask repeatedly before it allocates.
func (c *Cache) Match(raw [][]byte) (int, []worker.Tier, error) {
	keys, err := keysOf(raw)
	if err != nil {
		return 0, nil, err
	}
	tiers := make([]worker.Tier, 0, len(keys))
	for len(tiers) < len(keys) {
		c.mu.Lock()
		for _, k := range keys[len(tiers):] {
			t := c.tierOf(k)
			if t == 0 {
				break
			}
			tiers = append(tiers, t)
		}
		c.mu.Unlock()
		if len(tiers) == len(keys) || c.g4 == nil {
			break
		}
		// Ask the store from the first key no tier knows; what it has is
		// remembered, and the next pass goes on from there.
		if c.askStore(keys[len(tiers):]) == 0 {
			break
		}
	}
	return len(tiers), tiers, nil
}

// tierOf is the tier a key would be onboarded from, or 0; callers hold c.mu.
func (c *Cache) tierOf(k pool.Key) worker.Tier {
	if _, ok := c.g2.Get(k); ok {
		return worker.G2
	}
	if c.g3 != nil {
		if _, ok := c.g3.Get(k); ok {
			return worker.G3
		}
	}
	if c.g4 != nil && c.g4.has(k) {
		return worker.G4
	}
	return 0
}
