package pool

import "hash/maphash"

// index maps keys to blocks. At a million keys a map keyed by the 65-byte
// Key spends its time in cache misses over large slots, so the map is
// keyed by a 64-bit hash of the key, and the block's own copy of the key
// confirms a hit. Keys whose hash is taken by another key (about one in
// 10^7 pools of a million keys) go to a small overflow map.
type index struct {
	seed     maphash.Seed
	byHash   map[uint64]int32
	overflow map[Key]int32
	// blocks are the pool's, whose keys confirm hits; never reallocated.
	blocks []block
	// weakHash, set by tests, replaces the hash to force collisions.
	weakHash func(Key) uint64
}

func newIndex(blocks []block) index {
	return index{seed: maphash.MakeSeed(), byHash: make(map[uint64]int32), overflow: make(map[Key]int32), blocks: blocks}
}

func (x *index) hash(k Key) uint64 {
	if x.weakHash != nil {
		return x.weakHash(k)
	}
	return maphash.Bytes(x.seed, k.b[:k.n])
}

func (x *index) get(k Key) (int32, bool) {
	if id, ok := x.byHash[x.hash(k)]; ok && x.blocks[id].key.equal(k) {
		return id, true
	}
	if len(x.overflow) == 0 {
		return -1, false
	}
	id, ok := x.overflow[k]
	return id, ok
}

// put maps k, which must not be mapped, to id.
func (x *index) put(k Key, id int32) {
	h := x.hash(k)
	if _, taken := x.byHash[h]; taken {
		x.overflow[k] = id
		return
	}
	x.byHash[h] = id
}

// del unmaps k, which must be mapped; call it before the block's key
// changes.
func (x *index) del(k Key) {
	if len(x.overflow) > 0 {
		if _, ok := x.overflow[k]; ok {
			delete(x.overflow, k)
			return
		}
	}
	delete(x.byHash, x.hash(k))
}

func (x *index) len() int { return len(x.byHash) + len(x.overflow) }
