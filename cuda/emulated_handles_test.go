package cuda

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// chunks returns how many chunks t holds and the length of its view.
func chunks[T any](t *handleTable[T]) (held, length int) {
	v := t.view.Load()
	if v == nil {
		return 0, 0
	}
	for k := range v.chunks {
		if v.chunks[k].Load() != nil {
			held++
		}
	}
	return held, len(v.chunks)
}

func TestHandleTableStoresLoadsAndDeletes(t *testing.T) {
	var tab handleTable[int]
	require.Nil(t, tab.load(0))
	require.Nil(t, tab.load(1<<62), "a handle far past any given out")
	vals := make([]int, 3000)
	for h := uint64(1); h < 3000; h++ {
		vals[h] = int(h)
		tab.store(h, &vals[h])
	}
	for h := uint64(1); h < 3000; h++ {
		require.Equal(t, int(h), *tab.load(h))
	}
	require.Equal(t, 7, *tab.delete(7))
	require.Nil(t, tab.load(7))
	require.Nil(t, tab.delete(7), "deleted twice")
	require.Nil(t, tab.delete(5000), "never stored")
	n := 0
	tab.each(func(*int) { n++ })
	require.Equal(t, 2998, n)
	tab.clear()
	require.Nil(t, tab.load(8))
}

// Two tables share the handle counter, as streams and events do: handles
// created and destroyed for ever leave a bounded table, except for the
// chunk of a handle that lives on and a pointer per chunk after it.
func TestHandleTableDropsChunksNoHandleCanReach(t *testing.T) {
	var a, b handleTable[int]
	v := 1
	var next uint64
	keep := uint64(0)
	for range 200_000 {
		next++
		if next%3 == 0 {
			b.store(next, &v)
			require.NotNil(t, b.delete(next))
			continue
		}
		a.store(next, &v)
		if next == 5 {
			keep = next // one handle that lives on: its chunk stays
			continue
		}
		require.NotNil(t, a.delete(next))
	}
	held, length := chunks(&a)
	require.LessOrEqual(t, held, 2, "the kept handle's chunk and the newest")
	require.Equal(t, int(next>>handleChunkBits)+1, length, "a pointer per chunk from the kept handle's on")
	held, length = chunks(&b)
	require.LessOrEqual(t, held, 1, "the newest at most")
	require.LessOrEqual(t, length, 1, "the view trimmed to the newest chunk")
	require.Equal(t, v, *a.load(keep))
	require.Nil(t, b.load(next-next%3), "a deleted handle of a dropped chunk")

	// Once the kept handle goes, a's view is trimmed too.
	require.NotNil(t, a.delete(keep))
	held, length = chunks(&a)
	require.LessOrEqual(t, held, 1)
	require.LessOrEqual(t, length, 1)
}

// Lookups run without the lock while handles are stored and deleted (the
// race detector checks the table's atomics).
func TestHandleTableLookupsBesideWrites(t *testing.T) {
	var tab handleTable[int]
	var mu sync.Mutex
	vals := make([]int, 20000)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for h := uint64(1); h < uint64(len(vals)); h += 97 {
					if p := tab.load(h); p != nil && *p != int(h) {
						t.Errorf("handle %d holds %d", h, *p)
					}
				}
			}
		})
	}
	for h := uint64(1); h < uint64(len(vals)); h++ {
		vals[h] = int(h)
		mu.Lock()
		tab.store(h, &vals[h])
		if h > 10 {
			tab.delete(h - 10)
		}
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
}
