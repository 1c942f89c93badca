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

// EventQueue is an ordered, bounded queue of events: what a pool records,
// and what its owner gathers across tiers. Beyond its bound new events are
// dropped and counted. The zero value records nothing; use NewEventQueue.
type EventQueue struct {
	events  []Event
	max     int
	dropped uint64
}

// NewEventQueue holds up to max undrained events: 0 means 65,536; a
// negative max records none.
func NewEventQueue(max int) EventQueue {
	if max == 0 {
		max = 1 << 16
	}
	return EventQueue{max: max}
}

// Add appends e, or counts it dropped when the queue is full.
func (q *EventQueue) Add(e Event) {
	if q.max <= 0 {
		return
	}
	if len(q.events) >= q.max {
		q.dropped++
		return
	}
	q.events = append(q.events, e)
}

// Drain appends up to max of the oldest events to dst (all of them when
// max <= 0), in the order they happened, and forgets them.
func (q *EventQueue) Drain(dst []Event, max int) []Event {
	n := len(q.events)
	if max > 0 && max < n {
		n = max
	}
	dst = append(dst, q.events[:n]...)
	rest := copy(q.events, q.events[n:])
	q.events = q.events[:rest]
	return dst
}

// Len is the number of events not yet drained.
func (q *EventQueue) Len() int { return len(q.events) }

// Cap is how many events the queue keeps before it drops new ones (0: it
// records none).
func (q *EventQueue) Cap() int { return max(q.max, 0) }

// Dropped counts the events lost because the queue was full.
func (q *EventQueue) Dropped() uint64 { return q.dropped }

func (p *Pool) record(kind EventKind, k *Key) {
	p.events.Add(Event{Kind: kind, Tier: p.cfg.Tier, Key: *k})
}

// DrainEvents appends up to max of the oldest undrained events to dst (all
// of them when max <= 0), in the order they happened, and forgets them.
func (p *Pool) DrainEvents(dst []Event, max int) []Event { return p.events.Drain(dst, max) }

// PendingEvents is the number of events not yet drained.
func (p *Pool) PendingEvents() int { return p.events.Len() }
