package pool

// The LRU list is intrusive: evictable blocks are linked through their
// prev/next fields, with a sentinel after the last block. The sentinel's
// next is the least recently used block, its prev the most recent.

func (p *Pool) sentinel() int32 { return int32(p.cfg.Blocks) }

func (p *Pool) lruPushBack(id int32) {
	s := p.sentinel()
	last := p.blocks[s].prev
	p.blocks[id].prev, p.blocks[id].next = last, s
	p.blocks[last].next = id
	p.blocks[s].prev = id
	p.evictable++
}

func (p *Pool) lruRemove(id int32) {
	b := &p.blocks[id]
	p.blocks[b.prev].next = b.next
	p.blocks[b.next].prev = b.prev
	b.prev, b.next = -1, -1
	p.evictable--
}

// LRU returns the evictable blocks, least recently used first: the order in
// which they would be evicted.
func (p *Pool) LRU() []int {
	var out []int
	s := p.sentinel()
	for id := p.blocks[s].next; id != s; id = p.blocks[id].next {
		out = append(out, int(id))
	}
	return out
}
