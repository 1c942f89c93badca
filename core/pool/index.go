package pool

import (
	"hash/maphash"
	"math/bits"
)

// index maps keys to blocks: an open-addressing table with linear probing,
// sized once for the pool (it never grows), whose entries are 8 bytes — a
// 32-bit hash tag and the block id — so that a lookup touches one cache
// line of the table and then the block, whose own copy of the key confirms
// the hit. At a million keys Go's map, keyed by the hash or by the 65-byte
// Key, spends its time in cache misses; this table is what keeps Lookup
// near a bare map[string]int.
//
// An entry is tag<<32 | (id+1); 0 is an empty slot. The tag is the low 32
// bits of the key's hash, so an entry's home slot (tag & mask) can be
// found again when a deletion shifts entries back (no tombstones).
type index struct {
	seed  maphash.Seed
	slots []uint64
	mask  uint64
	n     int
	// blocks are the pool's, whose keys confirm hits; never reallocated.
	blocks []block
	// weakHash, set by tests, replaces the hash to force collisions.
	weakHash func(Key) uint64
}

func newIndex(blocks []block, capacity int) index {
	size := uint64(1) << bits.Len64(uint64(2*capacity-1)) // load factor at most 1/2
	return index{seed: maphash.MakeSeed(), slots: make([]uint64, size), mask: size - 1, blocks: blocks}
}

func (x *index) hash(k *Key) uint32 {
	if x.weakHash != nil {
		return uint32(x.weakHash(*k))
	}
	return uint32(maphash.Bytes(x.seed, k.b[:k.n]))
}

// find returns the slot holding k, or -1.
func (x *index) find(k *Key) int { return x.findH(k, x.hash(k)) }

// findH is find with k's hash already computed.
func (x *index) findH(k *Key, tag uint32) int {
	for i := uint64(tag) & x.mask; ; i = (i + 1) & x.mask {
		e := x.slots[i]
		if e == 0 {
			return -1
		}
		if uint32(e>>32) == tag && x.blocks[uint32(e)-1].key.equal(k) {
			return int(i)
		}
	}
}

func (x *index) get(k Key) (int32, bool) {
	i := x.find(&k)
	if i < 0 {
		return -1, false
	}
	return int32(uint32(x.slots[i]) - 1), true
}

// put maps k, which must not be mapped, to id.
func (x *index) put(k Key, id int32) { x.putH(id, x.hash(&k)) }

// putH is put with the key's hash already computed.
func (x *index) putH(id int32, tag uint32) {
	i := uint64(tag) & x.mask
	for x.slots[i] != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = uint64(tag)<<32 | uint64(id+1)
	x.n++
}

// del unmaps k, which must be mapped; call it before the block's key
// changes. Later entries of the probe run shift back into the hole.
func (x *index) del(k *Key) {
	i := uint64(x.find(k))
	x.n--
	for {
		x.slots[i] = 0
		j := i
		for {
			j = (j + 1) & x.mask
			e := x.slots[j]
			if e == 0 {
				return
			}
			home := uint64(uint32(e>>32)) & x.mask
			// The entry at j stays unless its home is cyclically outside
			// (i, j]: then it may move into the hole at i.
			if (i < j && i < home && home <= j) || (i > j && (i < home || home <= j)) {
				continue
			}
			x.slots[i] = e
			i = j
			break
		}
	}
}

func (x *index) len() int { return x.n }
