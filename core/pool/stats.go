package pool

// Stats are a pool's occupancy and its counters since it was made.
type Stats struct {
	Tier int
	// Occupancy: blocks by state, and the registered blocks that are pinned.
	Capacity, Free, Allocated, Storing, Registered, Pinned int
	// Removing: blocks whose key was removed while pinned, freed at their
	// last Unpin.
	Removing int
	// Hits and Misses count Acquire calls.
	Hits, Misses uint64
	// Evictions counts registered blocks reused by Allocate or PrepareStore.
	Evictions uint64
	// Stored and Removed count keys registered and removed (not evicted).
	Stored, Removed uint64
	// Admitted, Rejected, Deduped and NoSpace count PrepareStore's decisions
	// (Deduped: present or in flight).
	Admitted, Rejected, Deduped, NoSpace uint64
	// EventsDropped counts events lost because nobody drained them.
	EventsDropped uint64
}

// Stats returns the pool's occupancy and counters.
func (p *Pool) Stats() Stats {
	s := p.stats
	s.Tier = p.cfg.Tier
	s.Capacity = p.cfg.Blocks
	s.Free = p.count[stateFree]
	s.Allocated = p.count[stateAllocated]
	s.Storing = p.count[stateStoring]
	s.Registered = p.count[stateRegistered]
	s.Removing = p.count[stateRemoved]
	s.Pinned = p.pinned
	s.EventsDropped = p.events.Dropped()
	return s
}
