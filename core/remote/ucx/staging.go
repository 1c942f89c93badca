//go:build cgo

package ucx

/*
#include <stdlib.h>
*/
import "C"

import (
	"cmp"
	"math/bits"
	"sync"
	"unsafe"
)

// Staging: each data message of a pull lands in memory of the
// transport's own, and is copied to its destination only once it arrived
// whole, by the progress thread between its turns at UCX, while the next
// arrives; so nothing UCX does late (an answer to a pull that failed, a
// receive that outlives its pull) can reach a destination. A slot is out
// from the receive's start until UCX completed it, and until its copy is
// done or dropped: a pull that fails meanwhile leaves its slots out until
// UCX completed their receives (pull.go).
// On a GPU the destination is host memory the transfer manager copies to
// the device after Read returns, so the staging copy is a host memcpy
// there too.

// Slots are at most chunkBytes (a data message, serve.go), a power of two
// from stagingMin; at most stagingBudget bytes are handed out at once
// (more waits: UCX holds the data at the sender until it is received),
// and up to stagingKeep bytes are kept for reuse.
const (
	stagingMin    = 64 << 10
	stagingBudget = 64 << 20
	stagingKeep   = 64 << 20
)

type slot struct {
	mem        unsafe.Pointer // C memory
	addr, size uint64
}

func (s *slot) bytes() []byte { return unsafe.Slice((*byte)(s.mem), s.size) }

// stagingPool hands out slots; safe for concurrent use.
type stagingPool struct {
	mu     sync.Mutex
	free   map[uint64][]*slot // by size
	kept   uint64
	out    uint64 // bytes handed out and not put back
	slots  int    // slots handed out and not put back (for tests)
	closed bool
	budget uint64 // stagingBudget when 0 (tests set less)
}

// fits says whether size more bytes may be handed out: within the budget,
// or alone (a slot larger than the budget goes when none is out); p.mu held.
func (p *stagingPool) fits(size uint64) bool {
	return p.out == 0 || p.out+size <= cmp.Or(p.budget, stagingBudget)
}

func sizeClass(n uint64) uint64 {
	if n <= stagingMin {
		return stagingMin
	}
	return 1 << bits.Len64(n-1)
}

// available reports whether tryGet(n) would hand a slot out.
func (p *stagingPool) available(n uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fits(sizeClass(n))
}

// tryGet hands out a slot of at least n bytes, or nil when the budget is
// spent (or memory ran out) while others are out.
func (p *stagingPool) tryGet(n uint64) *slot {
	size := sizeClass(n)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fits(size) {
		return nil
	}
	var s *slot
	if l := p.free[size]; len(l) > 0 {
		s = l[len(l)-1]
		p.free[size] = l[:len(l)-1]
		p.kept -= size
	} else {
		mem := C.malloc(C.size_t(size))
		if mem == nil {
			return nil
		}
		s = &slot{mem: mem, addr: uint64(uintptr(mem)), size: size}
	}
	p.out += size
	p.slots++
	return s
}

func (p *stagingPool) put(s *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out -= s.size
	p.slots--
	if p.closed || p.kept+s.size > stagingKeep {
		C.free(s.mem)
		return
	}
	if p.free == nil {
		p.free = map[uint64][]*slot{}
	}
	p.free[s.size] = append(p.free[s.size], s)
	p.kept += s.size
}

// outstanding is the number of slots handed out (in use or being copied).
func (p *stagingPool) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slots
}

// close frees the slots kept; those put back later are freed then.
func (p *stagingPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.free {
		for _, s := range l {
			C.free(s.mem)
		}
	}
	p.free, p.kept, p.closed = nil, 0, true
}
