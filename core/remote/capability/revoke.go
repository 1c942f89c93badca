package capability

import (
	"sync"
	"sync/atomic"
)

// Revocation of block scopes. A block scope is stateless on the server
// (blockscope.go), so it cannot be deleted when the request it was made
// for ends and its blocks go to another request. Instead every scope
// carries the server's revocation epoch when it was made, and the server
// keeps, per block of each layout, the epoch at which the block last
// changed owner (Revoke): a scope reads a block only while the block was
// not revoked after the scope was made. A scope made after a revocation
// (for the blocks' new owner) is not touched by it. The check is a few
// atomic loads per request, with no lock.
//
// A request that passed the check must not go on reading blocks that are
// given to their next owner meanwhile: Revoke returns only once every
// request begun before it has ended (Enter, Exit). Two counters
// alternate, as in sleepable RCU: a revocation waits for the requests
// counted in the phase it closes, never for those begun after it.
//
// Whole-worker capabilities (read-write, read-only) are not revoked: they
// are the deployment's, not a request's.

// Revocations is a server's revocation state; the zero value is ready.
type Revocations struct {
	epoch   atomic.Uint64                          // revocations so far; a scope made now carries it
	layouts atomic.Pointer[map[uint16]blockEpochs] // copied on write, under mu

	phase    atomic.Uint32   // which of inflight requests begin in
	inflight [2]atomic.Int64 // requests begun in each phase and not ended
	waiting  atomic.Bool     // a revoker waits for a phase to drain

	mu      sync.Mutex // revokers, one at a time
	drainMu sync.Mutex // drained's
	drained *sync.Cond
}

// blockEpochs is, per block of one layout, the epoch of its last
// revocation (0: never revoked).
type blockEpochs []atomic.Uint64

// Epoch is the epoch a scope made now carries.
func (r *Revocations) Epoch() uint64 { return r.epoch.Load() }

// Ticket is what Enter gave a request, for its Exit.
type Ticket uint32

// Enter counts a request that is about to be checked (Allows) and
// served; it must Exit when it has ended, successful or not.
func (r *Revocations) Enter() Ticket {
	for {
		p := r.phase.Load() & 1
		if enterPause != nil {
			enterPause()
		}
		r.inflight[p].Add(1)
		if r.phase.Load()&1 == p {
			return Ticket(p)
		}
		// A revoker closed the phase between the two loads: count in the
		// new one, so that it never waits for a request begun after it.
		r.exit(p)
	}
}

// enterPause, when set (tests only), runs in Enter between its look at
// the phase and its count.
var enterPause func()

// Exit ends what Enter counted.
func (r *Revocations) Exit(t Ticket) { r.exit(uint32(t)) }

func (r *Revocations) exit(p uint32) {
	if r.inflight[p].Add(-1) == 0 && r.waiting.Load() {
		r.drainMu.Lock()
		if r.drained != nil {
			r.drained.Broadcast()
		}
		r.drainMu.Unlock()
	}
}

// Allows reports whether a scope made at epoch reads blocks first to last
// of layout: none of them was revoked after it was made. Called between
// Enter and Exit.
func (r *Revocations) Allows(epoch uint64, layout uint16, first, last int) bool {
	m := r.layouts.Load()
	if m == nil {
		return true
	}
	at := (*m)[layout]
	for b := max(first, 0); b <= last && b < len(at); b++ {
		if at[b].Load() > epoch {
			return false
		}
	}
	return true
}

// LayoutBlocksRevoked is what one layout's revocation names: blocks of
// layout, which has NumBlocks (the caller checked the ids against it).
type LayoutBlocksRevoked struct {
	Layout    uint16
	NumBlocks int
	Blocks    []int
}

// Revoke ends every scope made before now that covers one of the blocks
// named, and returns once every request that may have been allowed by one
// has ended: from then on none of them is read under a scope made before
// the call. One epoch and one wait, however many layouts.
func (r *Revocations) Revoke(layouts ...LayoutBlocksRevoked) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.epoch.Add(1)
	for _, l := range layouts {
		at := r.table(l.Layout, l.NumBlocks)
		for _, b := range l.Blocks {
			at[b].Store(e)
		}
	}
	r.drain()
}

// table is layout's epochs, made (or grown to numBlocks) on the first
// revocation that needs it; r.mu held.
func (r *Revocations) table(layout uint16, numBlocks int) blockEpochs {
	m := map[uint16]blockEpochs{}
	if old := r.layouts.Load(); old != nil {
		if at := (*old)[layout]; len(at) >= numBlocks {
			return at
		}
		for k, v := range *old {
			m[k] = v
		}
	}
	at := make(blockEpochs, numBlocks)
	for i := range m[layout] { // grown: a layout registered anew under the same number
		at[i].Store(m[layout][i].Load())
	}
	m[layout] = at
	r.layouts.Store(&m)
	return at
}

// drain closes the current phase and waits until every request counted
// in it has ended; r.mu held. A request that read the old table, or an
// epoch before the revocation, began before the phase closed.
func (r *Revocations) drain() {
	p := r.phase.Add(1) - 1 // the phase closed
	r.drainMu.Lock()
	defer r.drainMu.Unlock()
	if r.drained == nil {
		r.drained = sync.NewCond(&r.drainMu)
	}
	r.waiting.Store(true)
	for r.inflight[p&1].Load() != 0 {
		r.drained.Wait()
	}
	r.waiting.Store(false)
}
