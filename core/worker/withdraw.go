package worker

import (
	"errors"
	"fmt"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// An engine may take G1's memory back while the worker lives (vLLM's sleep
// mode and weight updates lend the KV cache to something else) and give it
// back later: UnregisterG1, then RegisterG1 again.

// lentG1 is what UnregisterG1 leaves behind: the withdrawn layout's
// shape, which G1 comes back with (the prefix cache sized itself on it),
// and the reason, for calls that need G1 meanwhile.
type lentG1 struct {
	shape  layoutShape
	reason string
}

// UnregisterG1 takes G1 away before its memory is lent: new transfers on
// it (local ones, a peer's read or write through any capability, whole
// worker or request-scoped) fail at once with transfer.ErrWithdrawn
// naming reason; it returns once the transfers in flight on it have
// finished and the network transport forgot its registrations, so that
// nothing of the library touches the memory afterwards. G1 can then be
// registered again (RegisterG1, same layout config and shape; new
// handle, so that metadata exported before names nothing). Metadata
// exported from then on describes the new G1. An error after the
// withdrawal began (the driver's or UCX's registration not undone) still
// leaves G1 unregistered: it can be registered again.
func (w *PhysicalWorker) UnregisterG1(reason string) error {
	if reason == "" {
		reason = "its memory was taken back"
	}
	w.g1Change.Lock()
	defer w.g1Change.Unlock()
	w.mu.Lock()
	h := w.handles.G1
	if h == nil {
		w.mu.Unlock()
		return fmt.Errorf("%w: unregister G1: %s", transfer.ErrNotFound, w.g1Missing())
	}
	l, _, err := w.m.Layout(*h)
	if err != nil {
		w.mu.Unlock()
		return fmt.Errorf("unregister G1: %w", err)
	}
	w.handles.G1 = nil
	w.lent = &lentG1{shape: layoutShape{l.Config(), transfer.Shape{Kind: l.Kind(), BlockDim: l.BlockDim()}}, reason: reason}
	w.mu.Unlock()
	err = w.m.Withdraw(*h, reason)
	if f, ok := w.network.(remote.Withdrawer); ok {
		err = errors.Join(err, f.Withdrawn(*h))
	}
	if err != nil {
		return fmt.Errorf("unregister G1: %w", err)
	}
	return nil
}

// layoutShape is a layout's config and shape, compared whole.
type layoutShape struct {
	cfg   layout.Config
	shape transfer.Shape
}

// g1Missing says why G1 is not registered. The caller holds mu.
func (w *PhysicalWorker) g1Missing() string {
	if w.lent != nil {
		return "G1 was unregistered (" + w.lent.reason + ") and is not registered again yet"
	}
	return "G1 is not registered"
}

// checkG1Back refuses a G1 that comes back with another shape than it left.
func (w *PhysicalWorker) checkG1Back(s layoutShape) error {
	if s.shape.Kind == layout.FullyContiguous { // one region a block: where the block dim is names nothing
		s.shape.BlockDim = layout.BlockIsFirstDim
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.lent != nil && w.lent.shape != s {
		return fmt.Errorf("%w: G1 comes back as it was unregistered: %+v, not %+v", kvbmerr.ErrInvalidArgument, w.lent.shape, s)
	}
	return nil
}
