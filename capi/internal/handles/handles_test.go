package handles

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	kindA Kind = 1
	kindB Kind = 2
)

func TestAddGetRemove(t *testing.T) {
	tb := New()
	h := tb.Add(kindA, "a")
	require.NotZero(t, h)
	require.GreaterOrEqual(t, uint64(h), uint64(1)<<32, "handles stay away from small values")
	v, ok := tb.Get(h, kindA)
	require.True(t, ok)
	require.Equal(t, "a", v)
	require.Equal(t, 1, tb.Len())

	v, ok = tb.Remove(h, kindA)
	require.True(t, ok)
	require.Equal(t, "a", v)
	require.Equal(t, 0, tb.Len())
}

func TestStaleHandleRefusedAfterReuse(t *testing.T) {
	tb := New()
	old := tb.Add(kindA, 1)
	_, ok := tb.Remove(old, kindA)
	require.True(t, ok)

	// The slot is reused with a new generation.
	fresh := tb.Add(kindA, 2)
	require.NotEqual(t, old, fresh)
	_, ok = tb.Get(old, kindA)
	require.False(t, ok, "stale handle")
	_, ok = tb.Remove(old, kindA)
	require.False(t, ok, "double free of a stale handle")
	v, ok := tb.Get(fresh, kindA)
	require.True(t, ok)
	require.Equal(t, 2, v)
}

func TestDoubleFree(t *testing.T) {
	tb := New()
	h := tb.Add(kindA, 1)
	_, ok := tb.Remove(h, kindA)
	require.True(t, ok)
	_, ok = tb.Remove(h, kindA)
	require.False(t, ok)
	require.Equal(t, 0, tb.Len())
}

func TestWrongKindRefused(t *testing.T) {
	tb := New()
	h := tb.Add(kindA, 1)
	_, ok := tb.Get(h, kindB)
	require.False(t, ok)
	_, ok = tb.Remove(h, kindB)
	require.False(t, ok)
	require.Equal(t, 1, tb.Len(), "a refused remove leaves the handle live")
}

func TestNeverIssuedRefused(t *testing.T) {
	tb := New()
	h := tb.Add(kindA, 1)
	for _, bad := range []Handle{0, 1, 4096, h + 1, h ^ Handle(1)<<32, Handle(uint64(h) &^ (0xff << 56)), ^Handle(0)} {
		_, ok := tb.Get(bad, kindA)
		require.False(t, ok, "handle %#x", uint64(bad))
		_, ok = tb.Remove(bad, kindA)
		require.False(t, ok, "handle %#x", uint64(bad))
	}
}

func TestSlotRetiredAtLastGeneration(t *testing.T) {
	lowGenerations(t, 3)
	tb := New()
	var last Handle
	for range 3 { // generations 1, 2, 3 of slot 1
		last = tb.Add(kindA, 0)
		_, ok := tb.Remove(last, kindA)
		require.True(t, ok)
	}
	idx, gen, ok := decode(last)
	require.True(t, ok)
	require.Equal(t, uint32(firstIdx), idx)
	require.Equal(t, uint32(3), gen)
	require.Empty(t, tb.free, "a slot past its last generation is not reused")
	next := tb.Add(kindA, 1)
	idx, gen, _ = decode(next)
	require.Equal(t, uint32(firstIdx+1), idx, "a fresh slot instead")
	require.Equal(t, uint32(1), gen)
}

func TestEmptyAfterConcurrentUse(t *testing.T) {
	tb := New()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				h := tb.Add(kindA, g*1000+i)
				v, ok := tb.Get(h, kindA)
				if !ok || v != g*1000+i {
					t.Errorf("lost handle %#x", uint64(h))
					return
				}
				if _, ok := tb.Remove(h, kindA); !ok {
					t.Errorf("remove %#x failed", uint64(h))
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 0, tb.Len())
}

// lowGenerations makes slots reach their last generation after a few
// reuses, so that the test sees what happens at the 2^24th without making
// 2^24 handles.
func lowGenerations(t *testing.T, limit uint32) {
	saved := maxGen
	maxGen = limit
	t.Cleanup(func() { maxGen = saved })
}

func TestFreedHandleNeverComesBack(t *testing.T) {
	lowGenerations(t, 4)
	tb := New()
	h0 := tb.Add(kindA, "first")
	_, ok := tb.Remove(h0, kindA)
	require.True(t, ok)

	// The reproduction of issue 9: create and free on and on, far past
	// the point where the generation would wrap.
	issued := map[Handle]bool{h0: true}
	for i := range 100 {
		h := tb.Add(kindA, i)
		require.False(t, issued[h], "handle %#x issued twice (cycle %d)", uint64(h), i)
		issued[h] = true
		_, ok := tb.Get(h0, kindA)
		require.False(t, ok, "freed handle %#x came back to life at cycle %d", uint64(h0), i)
		_, ok = tb.Remove(h, kindA)
		require.True(t, ok)
	}
	_, ok = tb.Get(h0, kindA)
	require.False(t, ok)
	_, ok = tb.Remove(h0, kindA)
	require.False(t, ok)
	require.Equal(t, 0, tb.Len())
}

// BenchmarkGetParallel is Get from every P at once, each on its own
// handle: what threads of an engine calling the ABI do.
func BenchmarkGetParallel(b *testing.B) {
	t := New()
	hs := make([]Handle, 64)
	for i := range hs {
		hs[i] = t.Add(1, i)
	}
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		h := hs[next.Add(1)%int64(len(hs))]
		for pb.Next() {
			if _, ok := t.Get(h, 1); !ok {
				b.Fatal("lost a handle")
			}
		}
	})
}
