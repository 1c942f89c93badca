package pool

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPropertyAgainstModel runs random operation sequences on a pool and on
// the reference model and requires the same answers after every step, and
// the invariants: a pinned block is never handed out, a key maps to at most
// one block and a block to at most one key, capacity is never exceeded,
// and eviction follows least-recent use.
func TestPropertyAgainstModel(t *testing.T) {
	for seed := range uint64(120) {
		for _, admit := range []int{0, 3} {
			t.Run(fmt.Sprintf("seed%d/admit%d", seed, admit), func(t *testing.T) {
				runProperty(t, rand.New(rand.NewPCG(seed, 7)), 1+int(seed%8), admit, 300)
			})
		}
	}
}

func runProperty(t *testing.T, r *rand.Rand, blocks, admit, steps int) {
	p, err := New(Config{Blocks: blocks, AdmitAfter: admit})
	require.NoError(t, err)
	if r.IntN(2) == 0 {
		// Few hash values: most keys collide and take the overflow path.
		p.index.weakHash = func(k Key) uint64 { return uint64(k.b[max(k.n, 1)-1] % 3) }
	}
	m := newModel(blocks, admit)
	keySpace := make([]Key, 3*blocks+2)
	for i := range keySpace {
		keySpace[i], _ = KeyOf(fmt.Sprintf("k%02d", i))
	}
	randKeys := func() []Key {
		ks := make([]Key, r.IntN(blocks+2))
		for i := range ks {
			if r.IntN(40) == 0 {
				continue // a zero key, now and then
			}
			ks[i] = keySpace[r.IntN(len(keySpace))]
		}
		return ks
	}
	// randIDs favours ids in the state an operation wants, with some noise.
	randIDs := func(want ...state) []int {
		var cand []int
		for i, b := range m.blocks {
			if slices.Contains(want, b.state) {
				cand = append(cand, i)
			}
		}
		r.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
		ids := cand[:r.IntN(len(cand)+1)]
		if r.IntN(10) == 0 {
			ids = append(ids, r.IntN(blocks+2)-1) // any id, maybe out of range
		}
		return ids
	}
	for step := range steps {
		op := r.IntN(10)
		pinnedBefore := map[int]bool{}
		for i, b := range m.blocks {
			if b.pins > 0 {
				pinnedBefore[i] = true
			}
		}
		where := fmt.Sprintf("step %d op %d", step, op)
		switch op {
		case 0:
			n := r.IntN(blocks+2) - 1
			got, err := p.Allocate(n, nil)
			want, ok := m.allocate(n)
			require.Equal(t, ok, err == nil, "%s allocate(%d): %v", where, n, err)
			require.Equal(t, want, got, where)
			for _, id := range got {
				require.False(t, pinnedBefore[id], "%s: pinned block %d handed out", where, id)
			}
		case 1:
			// register: allocated/storing blocks with fresh or storing keys
			ids := randIDs(stateAllocated, stateStoring)
			keys := make([]Key, len(ids))
			for i, id := range ids {
				if id >= 0 && id < blocks && m.blocks[id].state == stateStoring && r.IntN(5) > 0 {
					keys[i] = m.blocks[id].key
				} else {
					keys[i] = keySpace[r.IntN(len(keySpace))]
				}
			}
			if r.IntN(15) == 0 && len(keys) > 0 {
				keys = keys[1:]
			}
			err := p.Register(keys, ids)
			require.Equal(t, m.register(keys, ids), err == nil, "%s register(%v, %v): %v", where, keys, ids, err)
		case 2:
			ids := randIDs(stateAllocated, stateStoring, stateRegistered)
			err := p.Release(ids)
			require.Equal(t, m.release(ids), err == nil, "%s release(%v): %v", where, ids, err)
		case 3:
			ids := randIDs(stateRegistered)
			err := p.Pin(ids)
			require.Equal(t, m.pin(ids), err == nil, "%s pin(%v): %v", where, ids, err)
		case 4:
			var ids []int
			for i, b := range m.blocks {
				if b.pins > 0 && r.IntN(2) == 0 {
					ids = append(ids, i)
				}
			}
			if r.IntN(8) == 0 {
				ids = append(ids, r.IntN(blocks))
			}
			err := p.Unpin(ids)
			require.Equal(t, m.unpin(ids), err == nil, "%s unpin(%v): %v", where, ids, err)
		case 5:
			keys := randKeys()
			require.Equal(t, m.touch(keys), p.Touch(keys), where)
		case 6:
			if r.IntN(3) == 0 {
				keys := randKeys()
				require.Equal(t, m.remove(keys), p.Remove(keys), where)
			} else {
				keys := randKeys()
				require.Equal(t, m.lookup(keys), p.Lookup(keys, nil), where)
			}
		case 7:
			k := keySpace[r.IntN(len(keySpace))]
			wid, wok := m.acquire(k)
			gid, gok := p.Acquire(k)
			require.Equal(t, wok, gok, where)
			require.Equal(t, wid, gid, where)
		default:
			keys := randKeys()
			gids, gds, err := p.PrepareStore(keys)
			wids, wds, ok := m.prepareStore(keys)
			require.Equal(t, ok, err == nil, "%s prepareStore(%v): %v", where, keys, err)
			if ok {
				require.Equal(t, wds, gds, where)
				require.Equal(t, wids, gids, where)
				for _, id := range gids {
					require.False(t, id >= 0 && pinnedBefore[id], "%s: pinned block %d handed out", where, id)
				}
			}
		}
		checkInvariants(t, p, m, where)
	}
}

func checkInvariants(t *testing.T, p *Pool, m *model, where string) {
	t.Helper()
	var want Stats
	keyOf := map[Key]int{}
	for i, b := range m.blocks {
		switch b.state {
		case stateFree:
			want.Free++
		case stateAllocated:
			want.Allocated++
		case stateStoring:
			want.Storing++
		case stateRegistered:
			want.Registered++
			if b.pins > 0 {
				want.Pinned++
			}
		case stateRemoved:
			want.Removing++
		}
		if b.state == stateStoring || b.state == stateRegistered {
			_, dup := keyOf[b.key]
			require.False(t, dup, "%s: key %v in two blocks", where, b.key)
			keyOf[b.key] = i
			id, ok := p.index.get(b.key)
			require.True(t, ok, where)
			require.Equal(t, i, int(id), "%s: key %v", where, b.key)
		}
		require.Equal(t, b.state, p.blocks[i].state, "%s: block %d", where, i)
		require.Equal(t, b.pins, int(p.blocks[i].pins), "%s: block %d pins", where, i)
	}
	require.Equal(t, len(keyOf), p.index.len(), "%s: index holds keys of no block", where)
	got := p.Stats()
	require.Equal(t, p.cfg.Blocks, got.Free+got.Allocated+got.Storing+got.Registered+got.Removing, where)
	require.Equal(t, [6]int{want.Free, want.Allocated, want.Storing, want.Registered, want.Pinned, want.Removing},
		[6]int{got.Free, got.Allocated, got.Storing, got.Registered, got.Pinned, got.Removing}, where)
	lru := m.evictable(nil)
	if lru == nil {
		lru = []int{}
	}
	gotLRU := p.LRU()
	if gotLRU == nil {
		gotLRU = []int{}
	}
	require.Equal(t, lru, gotLRU, "%s: eviction order", where)
	evs := p.DrainEvents(nil, 0)
	for i := range evs {
		evs[i].Tier = 0
	}
	if len(m.events) == 0 {
		m.events = nil
	}
	if len(evs) == 0 {
		evs = nil
	}
	require.Equal(t, m.events, evs, "%s: events", where)
	m.events = nil
}
