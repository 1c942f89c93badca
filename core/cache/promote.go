package cache

import "github.com/kvbm/kvbm/core/pool"

// promote brings keys an onboard loaded straight from G3 or G4 into G2's
// free blocks, after that load and in the background, so that the next hit
// is from G2. It evicts nothing: an evicted block is in no tier until its
// write-down lands, and a load right behind this one (SGLang's next
// prefetch batch) would then miss it. What G2 has no free block for stays
// where it is. Started with c.inflight counted for it.
func (c *Cache) promote(keys []pool.Key) {
	defer c.inflight.Done()
	c.mu.Lock()
	o := &onboard{}
	var wanted []pool.Key
	for _, k := range keys {
		if _, ok := c.g2.Get(k); !ok { // another call may have stored it meanwhile
			wanted = append(wanted, k)
		}
	}
	ids, _ := c.g2.Allocate(min(len(wanted), c.g2.Stats().Free), nil)
	for j, id := range ids {
		k := wanted[j]
		if c.g3 != nil {
			if src, ok := c.g3.Acquire(k); ok {
				o.from3.add(k, src, -1)
				o.stage3 = append(o.stage3, id)
				continue
			}
		}
		if c.g4 != nil && c.g4.has(k) {
			o.from4.add(k, -1, -1)
			o.stage4 = append(o.stage4, id)
			continue
		}
		_ = c.g2.Release([]int{id}) // gone from every tier since
	}
	o.wd = c.planWriteDown()
	c.collectEvents()
	c.mu.Unlock()
	c.stage(o, nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range o.ready.keys {
		if c.g2.Register([]pool.Key{k}, o.ready.src[i:i+1]) != nil {
			_ = c.g2.Release(o.ready.src[i : i+1])
		}
	}
	c.collectEvents()
}
