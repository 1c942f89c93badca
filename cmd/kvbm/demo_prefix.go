package main

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/kvbm/kvbm/core/cache"
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// The prefix-cache scene: request A (a long prompt) is computed and
// offloaded through the cache, chunk by chunk as a chunked prefill would;
// another request follows; G2 is smaller than A, so the oldest part of A's
// prefix is written back to G3 and from there to G4. Request B shares A's
// prompt and adds new blocks: it matches the cached prefix, onboards it
// layer by layer into other G1 blocks, and computes only the rest.
const (
	prefixPromptA = 96 // blocks of request A (1,536 tokens)
	prefixOther   = 32 // blocks of the other request
	prefixNew     = 32 // blocks request B adds to A's prompt
	prefixG2      = 64 // G2 blocks: fewer than A's prompt
	prefixG3      = 48 // G3 blocks
	prefixChunk   = 16 // blocks computed and offloaded per step
	// The tags of the blocks' patterns: A's (and B's) block i carries i,
	// the other request's block j otherTag+j.
	otherTag = 1 << 20
)

// prefixRun is what the prefix-cache scene did.
type prefixRun struct {
	promptB  int
	matched  int
	byTier   map[worker.Tier]int
	loaded   time.Duration // Onboard to the last layer's event and the notification
	limit    limit         // the same bytes moved the plain way from each tier, right after
	verified error         // of the onboarded prefix, byte by byte
	stats    cache.Stats
	stored   map[worker.Tier]int // stored events by tier
	removed  map[worker.Tier]int // removed events by tier
	// dedupedB and storedB are B's blocks the cache had in G2 already and
	// those it stored, when B offloaded its whole prompt.
	dedupedB, storedB int
}

// blockHashes are the keys of a prompt's full blocks, the way vLLM hashes
// blocks: each is SHA-256 over its parent's hash and its own token ids, so
// that a key names a block given its whole prefix.
func blockHashes(tokens []uint32, pageSize int) [][]byte {
	var parent []byte
	keys := make([][]byte, 0, len(tokens)/pageSize)
	buf := make([]byte, 4*pageSize)
	for from := 0; from+pageSize <= len(tokens); from += pageSize {
		for i, t := range tokens[from : from+pageSize] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		h := sha256.New()
		h.Write(parent)
		h.Write(buf)
		parent = h.Sum(nil)
		keys = append(keys, parent)
	}
	return keys
}

// promptTokens is n pseudo-random token ids of a vocabulary of 128,256
// (Llama 3's), different for every seed.
func promptTokens(seed uint64, n int) []uint32 {
	tokens := make([]uint32, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range tokens {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		tokens[i] = uint32(x % 128256)
	}
	return tokens
}

// runPrefix runs the prefix-cache scene on a worker of its own, whose G3
// and G4 live under root.
//
// lim measures the limit of an onboard of blocks by tier.
func runPrefix(drv cuda.Driver, root string, lim func(map[worker.Tier]int) (limit, error)) (run *prefixRun, err error) {
	page := llama3_8B(1).PageSize
	promptB := prefixPromptA + prefixNew
	// G1: A's blocks (reused by the other request once offloaded), then B's.
	g1A, g1B := seq(0, prefixPromptA), seq(prefixPromptA, promptB)
	g3 := filepath.Join(root, "g3-prefix")
	if err := os.MkdirAll(g3, 0o700); err != nil {
		return nil, fmt.Errorf("prefix: G3 directory: %w", err)
	}
	w, err := newTierWorker(drv, tierSpec{name: "prefix", id: 0xC, g1: prefixPromptA + promptB, g2: prefixG2, g3: prefixG3,
		diskDir: g3, objectDir: filepath.Join(root, "g4-prefix")})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, w.close()) }()
	// The cache closes with the worker's node, before the worker.
	c, err := w.node.EnableCache(cache.Config{G3: cache.WriteBack, G4: cache.WriteBack})
	if err != nil {
		return nil, fmt.Errorf("prefix: %w", err)
	}

	tokensA := promptTokens(1, prefixPromptA*page)
	tokensB := append(append([]uint32(nil), tokensA...), promptTokens(2, prefixNew*page)...)
	keysA, keysB := blockHashes(tokensA, page), blockHashes(tokensB, page)
	keysOther := blockHashes(promptTokens(3, prefixOther*page), page)
	tagsB := seq(0, promptB)

	if _, err := computeAndOffload(w, c, "request A", keysA, g1A, seq(0, prefixPromptA), 0); err != nil {
		return nil, err
	}
	if _, err := computeAndOffload(w, c, "other request", keysOther, g1A[:prefixOther], seq(otherTag, prefixOther), 0); err != nil {
		return nil, err
	}

	// Request B: what the scheduler asks before it allocates.
	run = &prefixRun{promptB: promptB, byTier: map[worker.Tier]int{}}
	n, tiers, err := c.Match(keysB)
	if err != nil {
		return nil, fmt.Errorf("prefix: match request B: %w", err)
	}
	run.matched = n
	for _, t := range tiers {
		run.byTier[t]++
	}
	if err := w.clearBlocks(worker.G1, g1B); err != nil {
		return nil, err
	}
	if run.loaded, err = cacheOnboardLayerwise(drv, c, keysB[:n], g1B[:n]); err != nil {
		return nil, err
	}
	c.Quiesce() // the promotions into G2 the load started: not beside the limit's reads
	if run.limit, err = lim(run.byTier); err != nil {
		return nil, err
	}
	run.verified = w.verifyBlocks(worker.G1, g1B[:n], tagsB[:n])

	// B computes only the rest, and offers its whole prompt to the cache,
	// which keeps what it has.
	ds, err := computeAndOffload(w, c, "request B", keysB, g1B, tagsB, n)
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		switch d {
		case pool.Present, pool.InFlight:
			run.dedupedB++
		case pool.Store:
			run.storedB++
		}
	}
	run.stats = c.Stats()
	run.stored, run.removed = map[worker.Tier]int{}, map[worker.Tier]int{}
	for _, ev := range c.DrainEvents(nil, 0) {
		switch ev.Kind {
		case pool.Stored:
			run.stored[worker.Tier(ev.Tier)]++
		case pool.Removed:
			run.removed[worker.Tier(ev.Tier)]++
		}
	}
	return run, nil
}

// computeAndOffload runs a request's prefill in chunks: each chunk's G1
// blocks are computed (filled with their patterns) — except the first
// cached blocks, which were onboarded — and offloaded through the cache
// before the next chunk. It returns the cache's decision per block.
func computeAndOffload(w *tierWorker, c *cache.Cache, what string, keys [][]byte, g1, tags []int, cached int) ([]pool.Decision, error) {
	if err := w.fillBlocks(worker.G1, g1[cached:], tags[cached:]); err != nil {
		return nil, fmt.Errorf("prefix: compute %s: %w", what, err)
	}
	var all []pool.Decision
	for from := 0; from < len(keys); from += prefixChunk {
		to := min(from+prefixChunk, len(keys))
		nt, ds, err := c.Offload(keys[from:to], g1[from:to], 0)
		if err != nil {
			return nil, fmt.Errorf("prefix: offload %s blocks %d..%d: %w", what, from, to-1, err)
		}
		if err := nt.WaitTimeout(waitLimit); err != nil {
			return nil, fmt.Errorf("prefix: offload %s blocks %d..%d: %w (failed G1 blocks %v)", what, from, to-1, err, nt.FailedBlocks())
		}
		all = append(all, ds...)
	}
	return all, nil
}

// cacheOnboardLayerwise onboards keys into G1 blocks g1 through the cache, with
// one event per layer, timed as timeLayerwise does.
func cacheOnboardLayerwise(drv cuda.Driver, c *cache.Cache, keys [][]byte, g1 []int) (time.Duration, error) {
	// On the engine's stream, as the vLLM connector onboards (torch's
	// current stream).
	stream, err := drv.StreamCreate(0)
	if err != nil {
		return 0, fmt.Errorf("prefix: onboard: the engine's stream: %w", err)
	}
	defer func() { _ = drv.StreamDestroy(stream) }()
	return timeLayerwise(drv, llama3_8B(1).NumLayers, "prefix: onboard", func(events []cuda.Event) (*transfer.Notification, error) {
		return c.Onboard(keys, g1, events, &stream)
	})
}

// printPrefix prints the scene: where B's prefix was found, the hit rate,
// the onboard's speed beside its limit, and the cache's counters.
func printPrefix(w io.Writer, r *prefixRun, blockSize int) {
	pct := func(n, of int) float64 { return 100 * float64(n) / float64(of) }
	bytes := int64(r.matched) * int64(blockSize)
	gbs := float64(bytes) / r.loaded.Seconds() / 1e9
	s := r.stats
	fmt.Fprintf(w, "prefix cache: G2 %d blocks, G3 %d (%v), G4 (%v); request A %d blocks, then another request of %d, then request B = A + %d new blocks\n",
		prefixG2, prefixG3, cache.WriteBack, cache.WriteBack, prefixPromptA, prefixOther, prefixNew)
	fmt.Fprintf(w, "  request B matched %d of %d blocks: hit rate %.1f%% (G2 %d = %.1f%%, G3 %d = %.1f%%, G4 %d = %.1f%%); computed %d\n",
		r.matched, r.promptB, pct(r.matched, r.promptB),
		r.byTier[worker.G2], pct(r.byTier[worker.G2], r.promptB),
		r.byTier[worker.G3], pct(r.byTier[worker.G3], r.promptB),
		r.byTier[worker.G4], pct(r.byTier[worker.G4], r.promptB), r.promptB-r.matched)
	verified := "every byte verified"
	if r.verified != nil {
		verified = "NOT verified: " + r.verified.Error()
	}
	fmt.Fprintf(w, "  onboard layer-wise: %d blocks, %d MiB in %.3f s = %.2f GB/s, limit (%s) %.2f GB/s, vs limit %.2f; %s\n",
		r.matched, bytes>>20, r.loaded.Seconds(), gbs, r.limit.name, r.limit.gbs, gbs/r.limit.gbs, verified)
	fmt.Fprintf(w, "  onboarded %d (from G2 %d, G3 %d, G4 %d), failed %d; B offloaded its %d blocks: %d already in G2, %d stored\n",
		s.Onboarded, s.OnboardedFromG2, s.OnboardedFromG3, s.OnboardedFromG4, s.OnboardFailed, r.promptB, r.dedupedB, r.storedB)
	fmt.Fprintf(w, "  cache: offloaded %d, deduped %d, not admitted %d, no space %d; evictions G2 %d, G3 %d; written down %d (G4 puts %d), failed %d\n",
		s.Offloaded, s.Deduped, s.NotAdmitted, s.NoSpace, s.G2.Evictions, s.G3.Evictions, s.WrittenDown, s.G4Puts, s.WriteDownFailed)
	fmt.Fprintf(w, "  now: G2 %d/%d registered, G3 %d/%d, G4 %d known; events stored G2 %d, G3 %d, G4 %d, removed G2 %d, G3 %d, G4 %d\n",
		s.G2.Registered, s.G2.Capacity, s.G3.Registered, s.G3.Capacity, s.G4Known,
		r.stored[worker.G2], r.stored[worker.G3], r.stored[worker.G4], r.removed[worker.G2], r.removed[worker.G3], r.removed[worker.G4])
}
