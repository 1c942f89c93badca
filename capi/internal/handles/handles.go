// Package handles is the generation-checked handle table behind the C ABI's
// opaque handles.
//
// A handle is a pointer-sized integer that encodes a slot index and the
// slot's generation, under a fixed tag in the top byte. Freeing a handle bumps
// its slot's generation, so a freed, stale or never-issued handle — or a
// handle of another kind — is refused instead of reaching the wrong object.
// A slot whose generation reaches the last one is retired instead of
// wrapping, so no handle value is ever issued twice and a freed handle never
// comes back to life, however many handles the process makes.
// The tag keeps every valid handle far from 0 and outside any address a
// process maps, so a handle is never mistaken for a pointer.
package handles

import (
	"sync"
	"sync/atomic"
)

// Kind is the type of object a handle names; a handle of one kind is
// invalid where another is expected.
type Kind uint8

// Handle is the value C sees. Zero is never a valid handle.
type Handle uint64

const (
	tag      = uint64(0x6b) << 56 // 'k'
	tagMask  = uint64(0xff) << 56
	genBits  = 24
	genMask  = uint64(1)<<genBits - 1
	idxMask  = uint64(1)<<32 - 1
	firstIdx = 1 // slot 0 is never used, so index 0 never appears
)

// maxGen is a slot's last generation: freeing its handle then retires the
// slot. A variable so that tests can reach it without 2^24 reuses.
var maxGen = uint32(genMask)

// entry is what a live slot holds. It is immutable: Add and Remove swap
// entries, so that Get reads a slot without a lock.
type entry struct {
	gen  uint32
	kind Kind
	val  any
}

// chunkBits sets the slots per chunk; chunks never move once made, so a
// reader holding a directory snapshot finds the same slots a writer sees.
const (
	chunkBits = 10
	chunkLen  = 1 << chunkBits
)

type chunk [chunkLen]atomic.Pointer[entry]

// Table maps handles to values. Safe for concurrent use. Get takes no
// lock — it is the call every ABI function makes, and threads using their
// own handles must not queue behind each other; Add and Remove take mu.
type Table struct {
	dir atomic.Pointer[[]*chunk] // grown by copy under mu

	mu   sync.Mutex
	gens []uint32 // each slot's current generation, 1..maxGen; maxGen+1: retired
	free []uint32
	live int
}

// New returns an empty table.
func New() *Table {
	t := &Table{gens: make([]uint32, firstIdx)}
	dir := []*chunk{new(chunk)}
	t.dir.Store(&dir)
	return t
}

func encode(idx, gen uint32) Handle {
	return Handle(tag | uint64(gen)<<32 | uint64(idx))
}

func decode(h Handle) (idx, gen uint32, ok bool) {
	v := uint64(h)
	if v&tagMask != tag {
		return 0, 0, false
	}
	return uint32(v & idxMask), uint32(v >> 32 & genMask), true
}

// slotOf is slot idx's cell, or nil past the directory.
func (t *Table) slotOf(idx uint32) *atomic.Pointer[entry] {
	dir := *t.dir.Load()
	c := int(idx >> chunkBits)
	if c >= len(dir) {
		return nil
	}
	return &dir[c][idx&(chunkLen-1)]
}

// Add stores v under a new handle of kind k (k must not be 0).
func (t *Table) Add(k Kind, v any) Handle {
	if k == 0 {
		panic("handles: kind 0 is reserved for free slots")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if uint64(len(t.gens)) > idxMask {
			// 2^32 slots, each retired after 2^24 uses: unreachable.
			panic("handles: every slot index has been used up")
		}
		idx = uint32(len(t.gens))
		t.gens = append(t.gens, 1)
		if dir := *t.dir.Load(); int(idx>>chunkBits) >= len(dir) {
			grown := append(append([]*chunk(nil), dir...), new(chunk))
			t.dir.Store(&grown)
		}
	}
	gen := t.gens[idx]
	t.slotOf(idx).Store(&entry{gen: gen, kind: k, val: v})
	t.live++
	return encode(idx, gen)
}

// lookup returns the live entry h names, if h is current and of kind k.
func (t *Table) lookup(h Handle, k Kind) (*entry, uint32, bool) {
	idx, gen, ok := decode(h)
	if !ok || idx < firstIdx {
		return nil, 0, false
	}
	cell := t.slotOf(idx)
	if cell == nil {
		return nil, 0, false
	}
	e := cell.Load()
	if e == nil || e.kind != k || e.gen != gen {
		return nil, 0, false
	}
	return e, idx, true
}

// Get returns the value under h if h is a live handle of kind k.
func (t *Table) Get(h Handle, k Kind) (any, bool) {
	e, _, ok := t.lookup(h, k)
	if !ok {
		return nil, false
	}
	return e.val, true
}

// Remove deletes h and returns its value if h is a live handle of kind k.
// The slot's generation moves on, so h (and copies of it) stay invalid
// after the slot is reused. A slot past its last generation is retired,
// never reused: its generation cannot wrap back to h's.
func (t *Table) Remove(h Handle, k Kind) (any, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, idx, ok := t.lookup(h, k)
	if !ok {
		return nil, false
	}
	t.slotOf(idx).Store(nil)
	t.gens[idx]++
	if t.gens[idx] <= maxGen {
		t.free = append(t.free, idx)
	}
	t.live--
	return e.val, true
}

// Len is the number of live handles.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}
