package cuda

import "sync/atomic"

// handleTable maps the emulated driver's handles to their objects. Handles
// are small integers given out in order and never reused, so a handle is
// an index: a lookup is two atomic loads, where a hashed map costs several
// times that on every enqueue, record and query. Stores and deletes are
// serialized by the driver's lock; lookups take no lock.
//
// The handles live in chunks of handleChunk slots; a chunk whose every
// handle has been given out and deleted is dropped, so a process that
// creates and destroys handles for ever keeps only a pointer per chunk.
type handleTable[T any] struct {
	chunks atomic.Pointer[[]*handleChunk[T]]
	newest uint64 // index of the newest chunk; under the driver's lock
}

const handleChunkBits = 10

type handleChunk[T any] struct {
	slots [1 << handleChunkBits]atomic.Pointer[T]
	live  int // stored and not deleted; under the driver's lock
}

func handleIndex(h uint64) (chunk uint64, slot uint64) {
	return h >> handleChunkBits, h & (1<<handleChunkBits - 1)
}

// load returns the object of h, or nil.
func (t *handleTable[T]) load(h uint64) *T {
	cs := t.chunks.Load()
	if cs == nil {
		return nil
	}
	i, j := handleIndex(h)
	if i >= uint64(len(*cs)) {
		return nil
	}
	c := (*cs)[i]
	if c == nil {
		return nil
	}
	return c.slots[j].Load()
}

// store records v as h's object; h is new.
func (t *handleTable[T]) store(h uint64, v *T) {
	i, j := handleIndex(h)
	var cur []*handleChunk[T]
	if cs := t.chunks.Load(); cs != nil {
		cur = *cs
	}
	if i >= uint64(len(cur)) || cur[i] == nil {
		// A new slice, so that a lookup holding the old one sees it whole.
		grown := make([]*handleChunk[T], max(uint64(len(cur)), i+1))
		copy(grown, cur)
		if t.newest < uint64(len(cur)) && cur[t.newest] != nil && cur[t.newest].live == 0 {
			grown[t.newest] = nil // every handle of it given out, none left
		}
		grown[i], t.newest = new(handleChunk[T]), i
		t.chunks.Store(&grown)
		cur = grown
	}
	cur[i].slots[j].Store(v)
	cur[i].live++
}

// delete removes h and returns its object, or nil when h has none. next is
// the last handle given out: a chunk left empty below it is dropped.
func (t *handleTable[T]) delete(h, next uint64) *T {
	cs := t.chunks.Load()
	if cs == nil {
		return nil
	}
	i, j := handleIndex(h)
	if i >= uint64(len(*cs)) || (*cs)[i] == nil {
		return nil
	}
	c := (*cs)[i]
	v := c.slots[j].Swap(nil)
	if v == nil {
		return nil
	}
	if c.live--; c.live == 0 && (i != t.newest || next >= (i+1)<<handleChunkBits-1) {
		// No handle of this chunk is left to give out (a newer chunk
		// exists, or next is past its end): drop it.
		shrunk := make([]*handleChunk[T], len(*cs))
		copy(shrunk, *cs)
		shrunk[i] = nil
		t.chunks.Store(&shrunk)
	}
	return v
}

// each calls fn on every object; the table must not change meanwhile.
func (t *handleTable[T]) each(fn func(*T)) {
	cs := t.chunks.Load()
	if cs == nil {
		return
	}
	for _, c := range *cs {
		if c == nil {
			continue
		}
		for j := range c.slots {
			if v := c.slots[j].Load(); v != nil {
				fn(v)
			}
		}
	}
}

// clear removes every handle.
func (t *handleTable[T]) clear() { t.chunks.Store(nil); t.newest = 0 }
