//go:build cgo

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
)

var _ remote.Withdrawer = (*Transport)(nil)

// Withdrawn unmaps the regions of a withdrawn layout (the memory goes to
// its next use): the rkeys peers hold for them then reach nothing the
// NIC will serve, where the transport invalidates them (RDMA; UCX's
// intra-node transports may not), and no Endpoint maps it again.
func (t *Transport) Withdrawn(h transfer.LayoutHandle) error {
	err := t.do(func() error {
		if t.withdrawn == nil {
			t.withdrawn = map[transfer.LayoutHandle]bool{}
		}
		t.withdrawn[h] = true // an Endpoint that described it already maps it no more
		var errs []error
		for k, r := range t.regs {
			if k.h != h {
				continue
			}
			delete(t.regs, k)
			if !r.alloc {
				errs = append(errs, status(C.kvbm_ucx_mem_unmap(t.context, r.memh)))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil && !isClosed(err) {
		return fmt.Errorf("ucx: unmap withdrawn layout %v: %w", h, err)
	}
	return nil
}
