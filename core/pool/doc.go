// Package pool records which blocks of one tier hold which KV, keyed by
// sequence hash: the block pool of a tier.
//
// A Pool covers the block ids [0, Blocks) of one layout (G2, G3) or of a
// tier's budget (G4). Every block is in one of four states:
//
//	free        nothing in it; Allocate hands it out
//	allocated   handed out by Allocate, no key yet; Register or Release ends it
//	storing     allocated by PrepareStore for a key whose data is in flight;
//	            the key is reserved (a second store of it is deduplicated)
//	            but not usable: Lookup does not find it
//	registered  holds the KV of its key; Lookup finds it. Unpinned registered
//	            blocks are the evictable ones, reused in least-recently-used
//	            order when no block is free.
//
// Pins are reference counts a transfer holds on a registered block while it
// reads it: a pinned block is never evicted or handed out. A block removed
// while pinned loses its key at once and becomes free when its last pin is
// released.
//
// The pool is pure: no goroutines, no clocks, no I/O, no locks. Its owner
// (the tiered cache) serializes calls and runs the transfers. Every call
// that changes state checks its whole input first and changes nothing when
// it returns an error.
//
// Every key that becomes present (registered) or leaves (evicted, removed)
// is recorded as an Event, in order, for KV-aware routers; the owner drains
// them in batches with DrainEvents.
package pool
