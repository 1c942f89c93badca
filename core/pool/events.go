package pool

// EventKind says whether a key entered or left a tier.
type EventKind uint8

const (
	// Stored: the key became present (registered) in the tier.
	Stored EventKind = iota + 1
	// Removed: the key left the tier (evicted, removed, found corrupt).
	Removed
)

func (k EventKind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	}
	return "EventKind(?)"
}

// Event records a key entering or leaving a tier, for KV-aware routers
// (vLLM's BlockStored/BlockRemoved).
type Event struct {
	Kind EventKind
	Tier int
	Key  Key
}

func (p *Pool) record(kind EventKind, k *Key) {
	if p.maxEvents < 0 {
		return
	}
	if len(p.events) >= p.maxEvents {
		p.stats.EventsDropped++
		return
	}
	p.events = append(p.events, Event{Kind: kind, Tier: p.cfg.Tier, Key: *k})
}

// DrainEvents appends up to max of the oldest undrained events to dst (all
// of them when max <= 0), in the order they happened, and forgets them.
func (p *Pool) DrainEvents(dst []Event, max int) []Event {
	n := len(p.events)
	if max > 0 && max < n {
		n = max
	}
	dst = append(dst, p.events[:n]...)
	rest := copy(p.events, p.events[n:])
	p.events = p.events[:rest]
	return dst
}

// PendingEvents is the number of events not yet drained.
func (p *Pool) PendingEvents() int { return len(p.events) }
