// Package cache is the tiered prefix cache of a worker: which of its G2,
// G3 and G4 blocks hold which KV, keyed by sequence hash, and the two
// operations an engine needs on top of the transfers — Offload (G1 blocks
// out to the tiers, deduplicated, with eviction and write-down) and Onboard
// (the longest cached prefix back into G1, staged through G2) — plus Match,
// what a scheduler asks before it allocates.
//
// Policy lives here and in core/pool, so that vLLM, SGLang and C++ engines
// get the same behaviour; engine adapters only translate calls.
//
// Tiers and how blocks reach them:
//
//	G2  pinned host memory: every offload lands here first (if admitted)
//	G3  local disk: blocks evicted from G2 are written down (write-back),
//	    or every block once it landed in G2 (write-through)
//	G4  object store: blocks evicted from the lowest local tier, or every
//	    block once it landed in G2; presence is asked of the store, with a
//	    small cache of answers
//
// Onboard stages G3 and G4 blocks through G2's free blocks (two hops, each
// block pinned while in flight) and keeps them there, so that the next hit
// is from G2; those G2 has no free block for go straight to G1 (making
// room in G2 would evict, and writing the evicted blocks down would come
// first, on the load's path), and into G2's free blocks after the load, in
// the background (promote.go).
// A block that fails anywhere is reported failed, never loaded; a corrupt
// G3 or G4 block is removed from its tier.
package cache
