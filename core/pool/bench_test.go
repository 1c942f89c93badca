package pool

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hashKeys makes n 32-byte keys, as vLLM's SHA-256 block hashes.
func hashKeys(from, n int) []Key {
	ks := make([]Key, n)
	var buf [8]byte
	for i := range ks {
		binary.LittleEndian.PutUint64(buf[:], uint64(from+i))
		sum := sha256.Sum256(buf[:])
		ks[i], _ = NewKey(sum[:])
	}
	return ks
}

// fullPool is a pool of n blocks, each registered under hashKeys(0, n).
func fullPool(b *testing.B, n int) (*Pool, []Key) {
	p, err := New(Config{Blocks: n, MaxEvents: -1})
	require.NoError(b, err)
	keys := hashKeys(0, n)
	ids, err := p.Allocate(n, nil)
	require.NoError(b, err)
	require.NoError(b, p.Register(keys, ids))
	return p, keys
}

// BenchmarkLookup matches a 4,096-block key chain (a 64k-token prompt of 16
// tokens a block) in a pool of 1,000,000 registered blocks, beside a bare
// map[string]int lookup of the same keys in a map of the same size, in the
// same run. x-map = map time / pool time (1.0: as fast as the bare map).
//
// cold: 64 different chains in turn, so that neither side finds its keys in
// the CPU's caches (a scheduler meeting new prompts); warm: one chain again
// and again (a scheduler asking about the same request each step).
func BenchmarkLookup(b *testing.B) {
	p, keys := fullPool(b, benchRegistered)
	b.Run("cold", func(b *testing.B) { benchLookup(b, p, keys, 64) })
	b.Run("warm", func(b *testing.B) { benchLookup(b, p, keys, 1) })
}

func benchLookup(b *testing.B, p *Pool, keys []Key, chains int) {
	const chain = 4096
	registered := len(keys)
	bare := make(map[string]int, registered)
	strs := make([]string, registered)
	for i, k := range keys {
		strs[i] = string(k.Bytes())
		bare[strs[i]] = i
	}
	// Chains spread over the pool, as a prompt's blocks are.
	query := make([][]Key, chains)
	queryStrs := make([][]string, chains)
	for c := range chains {
		query[c] = make([]Key, chain)
		queryStrs[c] = make([]string, chain)
		for i := range chain {
			j := (c*chain*7 + i*7919) % registered
			query[c][i], queryStrs[c][i] = keys[j], strs[j]
		}
	}
	ids := make([]int, 0, chain)
	b.ResetTimer()
	start := time.Now()
	for n := range b.N {
		ids = p.Lookup(query[n%chains], ids[:0])
	}
	took := time.Since(start)
	b.StopTimer()
	require.Len(b, ids, chain)
	start = time.Now()
	sum := 0
	for n := range b.N {
		for _, s := range queryStrs[n%chains] {
			sum += bare[s]
		}
	}
	limit := time.Since(start)
	require.NotZero(b, sum)
	b.ReportMetric(took.Seconds()*1e6/float64(b.N), "us/lookup")
	b.ReportMetric(limit.Seconds()*1e6/float64(b.N), "map-us")
	b.ReportMetric(limit.Seconds()/took.Seconds(), "x-map")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAllocateRegister allocates 1,024 blocks of a full pool (every
// one evicted, in LRU order) and registers them under new keys, draining
// the events; allocs/op must stay 0. The baseline is the same number of
// inserts and deletes in a bare map[string]int of the same size.
func BenchmarkAllocateRegister(b *testing.B) {
	const blocks, batch = 65536, 1024
	p, err := New(Config{Blocks: blocks})
	require.NoError(b, err)
	const generations = 8 // keys cycle so that registering never allocates
	keys := hashKeys(0, blocks*generations)
	ids, err := p.Allocate(blocks, nil)
	require.NoError(b, err)
	require.NoError(b, p.Register(keys[:blocks], ids))
	events := make([]Event, 0, 4*batch)
	events = p.DrainEvents(events, 0)
	next := blocks
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if next+batch > len(keys) {
			next = 0
		}
		var err error
		ids, err = p.Allocate(batch, ids[:0])
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Register(keys[next:next+batch], ids); err != nil {
			b.Fatal(err)
		}
		events = p.DrainEvents(events[:0], 0)
		next += batch
	}
	took := time.Since(start)
	b.StopTimer()
	bare := make(map[string]int, blocks)
	strs := make([]string, len(keys))
	for i, k := range keys {
		strs[i] = string(k.Bytes())
	}
	for i := range blocks {
		bare[strs[i]] = i
	}
	old, next := 0, blocks
	start = time.Now()
	for range b.N {
		for range batch {
			delete(bare, strs[old%len(strs)])
			bare[strs[next%len(strs)]] = next
			old++
			next++
		}
	}
	limit := time.Since(start)
	b.ReportMetric(took.Seconds()*1e6/float64(b.N), "us/1024-blocks")
	b.ReportMetric(limit.Seconds()*1e6/float64(b.N), "map-us")
	b.ReportMetric(limit.Seconds()/took.Seconds(), "x-map")
	b.ReportMetric(0, "ns/op")
}

const benchRegistered = 1_000_000
