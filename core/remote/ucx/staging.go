//go:build cgo

package ucx

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Staging: a pull lands in memory of the transport's own and is copied to
// its destination only once every byte of it arrived and the exporter
// said it was whole, so that nothing UCX does late (a reply to a pull
// that failed, a receive that outlives its endpoint) can reach the
// destination: a failed pull's slot is quarantined until UCX completed
// every receive into it, and only then reused. On a GPU the destination
// is host memory the transfer manager copies to the device after Read
// returns, so the staging copy is a host memcpy here too.

// Slots are kept for reuse up to stagingKeep bytes; a size class is a
// power of two from stagingMin.
const (
	stagingMin  = 64 << 10
	stagingKeep = 256 << 20
)

type slot struct {
	mem        unsafe.Pointer // C memory
	addr, size uint64
}

func (s *slot) bytes() []byte { return unsafe.Slice((*byte)(s.mem), s.size) }

// stagingPool hands out slots; safe for concurrent use.
type stagingPool struct {
	mu   sync.Mutex
	free map[uint64][]*slot // by size
	kept uint64
	out  int // slots handed out and not put back (for tests)
}

func (p *stagingPool) get(n uint64) (*slot, error) {
	size := uint64(stagingMin)
	if n > size {
		size = 1 << bits.Len64(n-1)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.free[size]; len(l) > 0 {
		s := l[len(l)-1]
		p.free[size] = l[:len(l)-1]
		p.kept -= size
		p.out++
		return s, nil
	}
	mem := C.malloc(C.size_t(size))
	if mem == nil {
		return nil, fmt.Errorf("%w: ucx: no memory for a %d-byte staging slot", kvbmerr.ErrIO, size)
	}
	p.out++
	return &slot{mem: mem, addr: uint64(uintptr(mem)), size: size}, nil
}

func (p *stagingPool) put(s *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out--
	if p.kept+s.size > stagingKeep {
		C.free(s.mem)
		return
	}
	if p.free == nil {
		p.free = map[uint64][]*slot{}
	}
	p.free[s.size] = append(p.free[s.size], s)
	p.kept += s.size
}

// outstanding is the number of slots handed out (in use or quarantined).
func (p *stagingPool) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out
}

// close frees the slots kept.
func (p *stagingPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.free {
		for _, s := range l {
			C.free(s.mem)
		}
	}
	p.free, p.kept = nil, 0
}
