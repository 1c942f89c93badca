package pool

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIndexAgainstMap puts, deletes and gets keys at random, with hashes
// that crowd a few home slots at the end of the table (so probe runs wrap
// around and deletions shift entries back across the end), and requires
// the answers of a plain map.
func TestIndexAgainstMap(t *testing.T) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 1))
		const capacity = 16
		blocks := make([]block, capacity)
		x := newIndex(blocks, capacity)
		homes := 1 + r.IntN(4)
		x.weakHash = func(k Key) uint64 { return x.mask - uint64(k.b[0])%uint64(homes) }
		want := map[Key]int32{}
		var free []int32
		for i := range capacity {
			free = append(free, int32(i))
		}
		keys := make([]Key, 40)
		for i := range keys {
			keys[i], _ = KeyOf(fmt.Sprintf("%c-key-%d", 'a'+i%7, i))
		}
		for step := range 2000 {
			k := keys[r.IntN(len(keys))]
			id, ok := want[k]
			switch {
			case !ok && len(free) > 0 && r.IntN(2) == 0:
				id, free = free[len(free)-1], free[:len(free)-1]
				blocks[id].key = k
				x.put(k, id)
				want[k] = id
			case ok && r.IntN(2) == 0:
				x.del(&k)
				blocks[id].key = Key{}
				delete(want, k)
				free = append(free, id)
			}
			for _, q := range keys {
				wid, wok := want[q]
				gid, gok := x.get(q)
				require.Equal(t, wok, gok, "seed %d step %d key %v", seed, step, q)
				if wok {
					require.Equal(t, wid, gid, "seed %d step %d key %v", seed, step, q)
				}
			}
			require.Equal(t, len(want), x.len())
		}
	}
}
