package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/kvbmerr"
)

// Memory an engine registered (RegisterExternal) can be taken back while
// the worker lives: vLLM's sleep mode and weight updates lend the KV
// cache's memory to something else and give it back later. Before the
// memory goes, the transfers in flight on its layout must be over, and no
// new one may start; a peer that still names the layout must be told why it
// is gone, not that it never was. Withdraw does both: such a layout has an
// in-flight gate of its own, which every transfer on it passes (hold), and
// a withdrawn handle is remembered with its reason.

// ErrWithdrawn: the layout was registered here and its owner took its
// memory back (Withdraw); the error names the reason it gave.
var ErrWithdrawn = kvbmerr.New(kvbmerr.FailedPrecondition, "layout withdrawn")

// Withdraw unregisters layout h, memory registered here with
// RegisterExternal, once the transfers in flight on it have finished:
// from the moment it is called, a transfer (or a peer's read or write)
// that names h fails at once with ErrWithdrawn and reason. When it returns,
// nothing of this manager touches the memory any more and the driver's
// registration of it is undone.
func (m *Manager) Withdraw(h LayoutHandle, reason string) error {
	m.mu.Lock()
	e, ok := m.entries[h]
	if ok && (e.gate == nil || e.owner != nil) { // an in-process import shares its exporter's gate
		m.mu.Unlock()
		return fmt.Errorf("%w: layout %v is not memory registered by its owner (only that is withdrawn; Unregister the rest)",
			ErrInvalidArgument, h)
	}
	if ok {
		delete(m.entries, h)
		if m.withdrawn == nil {
			m.withdrawn = map[LayoutHandle]string{}
		}
		m.withdrawn[h] = reason
		m.withdrawnOrder = append(m.withdrawnOrder, h)
		m.published()
	}
	m.mu.Unlock()
	if !ok {
		_, err := m.lookup(h)
		return fmt.Errorf("withdraw: %w", err)
	}
	e.gate.closeAndWait()
	return e.release()
}

// missing is the error for a handle the registry does not hold: withdrawn
// (and why), or never registered.
func (m *Manager) missing(h LayoutHandle) error {
	m.mu.RLock()
	reason, gone := m.withdrawn[h]
	m.mu.RUnlock()
	if gone {
		return withdrawnError(h, reason)
	}
	return fmt.Errorf("%w: no layout registered for handle %v", ErrNotFound, h)
}

func withdrawnError(h LayoutHandle, reason string) error {
	return fmt.Errorf("%w: layout %v was unregistered by its owner: %s", ErrWithdrawn, h, reason)
}

// enterGates passes a transfer through the gates of the withdrawable
// layouts among entries (those registered by their owner, and their
// imports by workers of this process, which share the gate); it fails once
// one of them is being withdrawn. leaveGates undoes it.
func (m *Manager) enterGates(entries []*entry) error {
	for i, e := range entries {
		if e == nil || e.gate == nil {
			continue
		}
		if !e.gate.enter() {
			leaveGates(entries[:i])
			owner := m // an imported layout of this process shares its exporter's gate
			if e.owner != nil {
				owner = e.owner
			}
			owner.mu.RLock()
			reason := owner.withdrawn[e.handle]
			owner.mu.RUnlock()
			return withdrawnError(e.handle, reason)
		}
	}
	return nil
}

func leaveGates(entries []*entry) {
	for _, e := range entries {
		if e != nil && e.gate != nil {
			e.gate.leave()
		}
	}
}

// gated reports whether any of entries has a gate.
func gated(entries []*entry) bool {
	for _, e := range entries {
		if e != nil && e.gate != nil {
			return true
		}
	}
	return false
}

// holdGated is hold (after the manager's gate) for a transfer on a
// withdrawable layout: it passes their gates too.
func (m *Manager) holdGated(entries []*entry) (release func(), err error) {
	if err := m.enterGates(entries); err != nil {
		m.inflight.leave()
		return nil, err
	}
	if one := soleGate(m, entries); one != nil {
		return one.leaveWith, nil // the common case (G1 and this manager's own layouts): no allocation
	}
	rest, err := m.holdOwners(entries)
	if err != nil {
		leaveGates(entries)
		return nil, err
	}
	// One closure, with the gated entries in it (a transfer names at most
	// three layouts: source, destination, bounce): no slice to copy.
	var g [3]*entry
	n := 0
	for _, e := range entries {
		if e != nil && e.gate != nil {
			if n == len(g) {
				all := append([]*entry(nil), entries...) // the caller's may be reused
				return func() { leaveGates(all); rest() }, nil
			}
			g[n] = e
			n++
		}
	}
	return func() {
		for _, e := range g[:n] {
			e.gate.leave()
		}
		rest()
	}, nil
}

// soleGate is the one gated entry of a transfer that holds no other
// manager (no import of this process among its layouts), whose release is
// then its own leaveWith; nil otherwise.
func soleGate(m *Manager, entries []*entry) *entry {
	var one *entry
	for _, e := range entries {
		if e == nil {
			continue
		}
		if e.owner != nil && e.owner != m {
			return nil
		}
		if e.gate != nil {
			if one != nil { // another, or the same layout twice (two passes through its gate)
				return nil
			}
			one = e
		}
	}
	if one == nil || one.leaveWith == nil {
		return nil
	}
	return one
}
