//go:build cgo

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
)

// HostMemory is host memory allocated through UCX (AllocHost).
type HostMemory struct {
	t          *Transport
	memh       C.uint64_t
	addr, size uint64
	once       sync.Once
	err        error
}

type allocation struct {
	addr, size uint64
	reg        *registration
}

// AllocHost allocates size bytes of host memory through UCX
// (ucp_mem_map with UCP_MEM_MAP_ALLOCATE). On one host UCX backs it with
// shared memory (sysv, posix) that peers map into their address space,
// so that their reads and writes of a layout registered over it
// (transfer.Manager.RegisterExternal) are one-sided memory copies: the
// exporter's CPU does nothing. Memory that UCX did not allocate is reached
// between processes through RMA that UCX emulates with messages the
// exporter's progress thread answers (unless the UCX build has xpmem or
// knem, or the hardware RDMA).
//
// Unregister the layout over it before its Close or the transport's,
// which releases what is left.
func (t *Transport) AllocHost(size uint64) (*HostMemory, error) {
	h := &HostMemory{t: t}
	err := t.do(func() error {
		var memh, addr, n C.uint64_t
		if err := status(C.kvbm_ucx_mem_alloc(t.context, C.uint64_t(size), &memh, &addr, &n)); err != nil {
			return fmt.Errorf("ucx: allocate %d bytes: %w", size, err)
		}
		h.memh, h.addr, h.size = memh, uint64(addr), uint64(n)
		r, err := t.packRegion(memh)
		if err != nil {
			C.kvbm_ucx_mem_unmap(t.context, memh)
			return fmt.Errorf("ucx: allocate %d bytes: %w", size, err)
		}
		r.alloc = true
		t.allocs[h.addr] = &allocation{addr: h.addr, size: h.size, reg: r}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Addr is the address of the memory.
func (h *HostMemory) Addr() uint64 { return h.addr }

// Size is its size (at least the size asked for).
func (h *HostMemory) Size() uint64 { return h.size }

// Close releases the memory; peers that still read it fail.
func (h *HostMemory) Close() error {
	h.once.Do(func() {
		err := h.t.do(func() error {
			a, ok := h.t.allocs[h.addr]
			if !ok {
				return nil // released by the transport's Close
			}
			delete(h.t.allocs, h.addr)
			for k, r := range h.t.regs {
				if r == a.reg {
					delete(h.t.regs, k)
				}
			}
			return status(C.kvbm_ucx_mem_unmap(h.t.context, h.memh))
		})
		if err != nil && !isClosed(err) {
			h.err = fmt.Errorf("ucx: release %d bytes at %#x: %w", h.size, h.addr, err)
		}
	})
	return h.err
}

// allocationOf is the allocation holding [base, base+size), or nil; on
// the progress thread.
func (t *Transport) allocationOf(base, size uint64) *allocation {
	for _, a := range t.allocs {
		if base >= a.addr && base+size <= a.addr+a.size {
			return a
		}
	}
	return nil
}

func isClosed(err error) bool { return errors.Is(err, errClosed) }
