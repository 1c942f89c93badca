package cache

import "github.com/kvbm/kvbm/core/pool"

type counters struct {
	g4Hits, g4Misses, g4Puts, g4PutFailures, g4Corrupt      uint64
	offloaded, deduped, notAdmitted, noSpace, offloadFailed uint64
	onboarded, onboardFailed                                uint64
	onboardedFrom                                           [5]uint64 // by source tier
	writtenDown, writeDownFailed                            uint64
	g3Restored, g3Refused                                   uint64
}

// Stats are the cache's per-tier pools and its counters since it was made.
type Stats struct {
	G2 pool.Stats
	// G3 is the zero Stats without G3.
	G3 pool.Stats
	// HasG3 and HasG4 say which lower tiers the cache uses.
	HasG3, HasG4 bool
	// G4Known is the number of G4 keys remembered as present.
	G4Known int
	// G4Hits and G4Misses count onboard lookups that went to the store.
	G4Hits, G4Misses uint64
	// G4Puts and G4PutFailures count blocks written to the store;
	// G4Corrupt the objects found corrupt on onboard.
	G4Puts, G4PutFailures, G4Corrupt uint64
	// Offloaded counts blocks copied G1→G2; Deduped, NotAdmitted and
	// NoSpace the offered blocks not copied, by reason; OffloadFailed the
	// copies that failed.
	Offloaded, Deduped, NotAdmitted, NoSpace, OffloadFailed uint64
	// Onboarded counts blocks loaded into G1, OnboardedFromG2/G3/G4 by the
	// tier they were found in; OnboardFailed those reported failed.
	Onboarded, OnboardedFromG2, OnboardedFromG3, OnboardedFromG4, OnboardFailed uint64
	// WrittenDown and WriteDownFailed count blocks written to a lower tier
	// (write-back and write-through).
	WrittenDown, WriteDownFailed uint64
	// EventsDropped counts events lost because nobody drained them.
	EventsDropped uint64
	// G3Restored and G3Refused count the blocks a persistent G3's journal
	// named at start that were vouched for (registered) or not (their
	// bytes were not what was written, or could not be read).
	G3Restored, G3Refused uint64
	// LoadRate is the bytes per second the loads from each tier ran at
	// lately (by tier number: 2, 3, 4; 0 until measured), LoadQueued the
	// bytes of each tier's loads in flight: what core/loadplan weighs.
	LoadRate, LoadQueued [5]float64
}

// Stats returns the pools' occupancy and the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.counters
	s := Stats{
		G2: c.g2.Stats(), HasG3: c.g3 != nil, HasG4: c.g4 != nil,
		G4Hits: k.g4Hits, G4Misses: k.g4Misses, G4Puts: k.g4Puts, G4PutFailures: k.g4PutFailures, G4Corrupt: k.g4Corrupt,
		Offloaded: k.offloaded, Deduped: k.deduped, NotAdmitted: k.notAdmitted, NoSpace: k.noSpace, OffloadFailed: k.offloadFailed,
		Onboarded: k.onboarded, OnboardFailed: k.onboardFailed,
		OnboardedFromG2: k.onboardedFrom[2], OnboardedFromG3: k.onboardedFrom[3], OnboardedFromG4: k.onboardedFrom[4],
		WrittenDown: k.writtenDown, WriteDownFailed: k.writeDownFailed,
		EventsDropped: c.events.Dropped(),
		G3Restored:    k.g3Restored, G3Refused: k.g3Refused,
		LoadRate: c.rates.rate, LoadQueued: c.rates.queued,
	}
	if c.g3 != nil {
		s.G3 = c.g3.Stats()
	}
	if c.g4 != nil {
		s.G4Known = len(c.g4.known)
	}
	return s
}
