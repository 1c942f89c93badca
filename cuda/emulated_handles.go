package cuda

import "sync/atomic"

// handleTable maps the emulated driver's handles to their objects. Handles
// are small integers given out in order and never reused, so a handle is
// an index: a lookup is three atomic loads, where a hashed map costs
// several times that on every enqueue, record and query. Stores and
// deletes are serialized by the driver's lock; lookups take no lock.
//
// The handles live in chunks of 1<<handleChunkBits slots. An empty chunk
// older than the newest (no handle of it is left to give out) is dropped,
// and dropped chunks at the front of the view are trimmed off it, so a
// process that creates and destroys handles for ever keeps a bounded
// table (a handle that lives on keeps its chunk, and a pointer per chunk
// after it).
type handleTable[T any] struct {
	view atomic.Pointer[handleView[T]]
}

// handleView is what a lookup reads: chunks[k] is chunk base+k, the last
// one the newest. Writers extend it in place within its capacity (slots
// past a reader's length are not read) or copy it, and publish a new view
// either way.
type handleView[T any] struct {
	base   uint64
	chunks []atomic.Pointer[handleChunk[T]]
}

const handleChunkBits = 10

type handleChunk[T any] struct {
	slots [1 << handleChunkBits]atomic.Pointer[T]
	live  int // stored and not deleted; under the driver's lock
}

func handleIndex(h uint64) (chunk, slot uint64) {
	return h >> handleChunkBits, h & (1<<handleChunkBits - 1)
}

// chunk returns chunk i of v, or nil.
func (v *handleView[T]) chunk(i uint64) *handleChunk[T] {
	if v == nil || i < v.base || i-v.base >= uint64(len(v.chunks)) {
		return nil
	}
	return v.chunks[i-v.base].Load()
}

// newest is the slot of v's last chunk, where new handles may still land,
// or nil when v has none.
func (v *handleView[T]) newest() *atomic.Pointer[handleChunk[T]] {
	if v == nil || len(v.chunks) == 0 {
		return nil
	}
	return &v.chunks[len(v.chunks)-1]
}

// load returns the object of h, or nil.
func (t *handleTable[T]) load(h uint64) *T {
	i, j := handleIndex(h)
	if c := t.view.Load().chunk(i); c != nil {
		return c.slots[j].Load()
	}
	return nil
}

// store records v as h's object; h is newer than every handle stored.
func (t *handleTable[T]) store(h uint64, x *T) {
	i, j := handleIndex(h)
	v := t.view.Load()
	c := v.chunk(i)
	if c == nil {
		if n := v.newest(); n != nil && n.Load() != nil && n.Load().live == 0 {
			// The newest till now: every handle of it was given out, and
			// none is left.
			n.Store(nil)
		}
		c = new(handleChunk[T])
		t.view.Store(trimmed(extended(v, i, c)))
	}
	c.slots[j].Store(x)
	c.live++
}

// extended is v with chunk i (past its end) set to c: v's own array when
// it has room (its readers never look past their length), else a copy of
// twice the length, from the first chunk still held.
func extended[T any](v *handleView[T], i uint64, c *handleChunk[T]) *handleView[T] {
	if v == nil || len(v.chunks) == 0 {
		nv := &handleView[T]{base: i, chunks: make([]atomic.Pointer[handleChunk[T]], 1, 4)}
		nv.chunks[0].Store(c)
		return nv
	}
	n := int(i-v.base) + 1
	if n <= cap(v.chunks) {
		nv := &handleView[T]{base: v.base, chunks: v.chunks[:n]}
		nv.chunks[n-1].Store(c)
		return nv
	}
	nv := &handleView[T]{base: v.base, chunks: make([]atomic.Pointer[handleChunk[T]], n, 2*n)}
	for k := range v.chunks {
		nv.chunks[k].Store(v.chunks[k].Load())
	}
	nv.chunks[n-1].Store(c)
	return nv
}

// delete removes h and returns its object, or nil when h has none. A chunk
// it leaves empty is dropped unless it is the newest, which store drops
// once a newer one is made.
func (t *handleTable[T]) delete(h uint64) *T {
	i, j := handleIndex(h)
	v := t.view.Load()
	c := v.chunk(i)
	if c == nil {
		return nil
	}
	x := c.slots[j].Swap(nil)
	if x == nil {
		return nil
	}
	if c.live--; c.live == 0 && &v.chunks[i-v.base] != v.newest() {
		v.chunks[i-v.base].Store(nil)
		if tv := trimmed(v); tv != v {
			t.view.Store(tv)
		}
	}
	return x
}

// trimmed is v without the dropped chunks at its front.
func trimmed[T any](v *handleView[T]) *handleView[T] {
	k := 0
	for k < len(v.chunks) && v.chunks[k].Load() == nil {
		k++
	}
	if k == 0 {
		return v
	}
	return &handleView[T]{base: v.base + uint64(k), chunks: v.chunks[k:]}
}

// each calls fn on every object; the table must not change meanwhile.
func (t *handleTable[T]) each(fn func(*T)) {
	v := t.view.Load()
	if v == nil {
		return
	}
	for k := range v.chunks {
		c := v.chunks[k].Load()
		if c == nil {
			continue
		}
		for j := range c.slots {
			if x := c.slots[j].Load(); x != nil {
				fn(x)
			}
		}
	}
}

// clear removes every handle.
func (t *handleTable[T]) clear() { t.view.Store(nil) }
