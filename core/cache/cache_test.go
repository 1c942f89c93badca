package cache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Request A computes and offloads its prefix; request B, sharing it,
// matches it in G2 and onboards it into other G1 blocks, byte for byte,
// and the G1 blocks around them stay untouched.
func TestOffloadThenOnboardFromG2(t *testing.T) {
	f := newFixture(t, tiers{g1: 32, g2: 16}, Config{})
	ds := f.offload(0, seq(0, 8))
	require.Equal(t, repeatDecision(pool.Store, 8), ds)

	f.clearG1()
	n, ts, err := f.c.Match(keyRange(0, 10))
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, repeat(worker.G2, 8), ts)

	note, err := f.c.Onboard(keyRange(0, 8), seq(10, 8), nil, nil)
	require.NoError(t, err)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	f.requireLoaded(seq(10, 8), 0)
	f.requireZero(append(seq(0, 10), seq(18, 14)...)...)
	st := f.c.Stats()
	require.EqualValues(t, 8, st.Onboarded)
	require.EqualValues(t, 8, st.OnboardedFromG2)
	require.EqualValues(t, 8, st.G2.Hits)
	require.Equal(t, 8, st.G2.Registered)
	require.Zero(t, st.G2.Pinned, "an onboard releases its pins")
}

func repeatDecision(d pool.Decision, n int) []pool.Decision {
	out := make([]pool.Decision, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// Offloading what is cached is a no-op that says so, and copies nothing.
func TestOffloadDedupes(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 16}, Config{})
	f.offload(0, seq(0, 4))
	ds := f.offload(2, seq(4, 4)) // keys 2, 3 are cached; 4, 5 are new
	require.Equal(t, []pool.Decision{pool.Present, pool.Present, pool.Store, pool.Store}, ds)
	st := f.c.Stats()
	require.EqualValues(t, 6, st.Offloaded)
	require.EqualValues(t, 2, st.Deduped)
}

// The frequency filter: with AdmitAfter 2 a block is offloaded the second
// time it is offered.
func TestAdmitAfter(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 16}, Config{AdmitAfter: 2})
	require.Equal(t, repeatDecision(pool.NotAdmitted, 4), f.offload(0, seq(0, 4)))
	n, _, err := f.c.Match(keyRange(0, 4))
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, repeatDecision(pool.Store, 4), f.offload(0, seq(0, 4)))
	n, _, err = f.c.Match(keyRange(0, 4))
	require.NoError(t, err)
	require.Equal(t, 4, n)
}

// G2 full: its least recently used blocks are written back to G3 before
// reuse; they onboard from G3 (staged through G2, where they stay), bytes
// verified, and the events tell a router where each key went.
func TestEvictionToG3AndOnboardFromG3(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 4, g3: 8}, Config{})
	f.offload(0, seq(0, 4))
	f.offload(4, seq(4, 4)) // evicts keys 0-3 from G2 to G3
	n, ts, err := f.c.Match(keyRange(0, 8))
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, append(repeat(worker.G3, 4), repeat(worker.G2, 4)...), ts)

	f.clearG1()
	note, err := f.c.Onboard(keyRange(0, 8), seq(8, 8), nil, nil)
	require.NoError(t, err)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	f.requireLoaded(seq(8, 8), 0)
	f.requireZero(seq(0, 8)...)
	st := f.c.Stats()
	require.EqualValues(t, 4, st.OnboardedFromG3)
	require.EqualValues(t, 4, st.OnboardedFromG2)

	var evs []string
	for _, e := range f.c.DrainEvents(nil, 0) {
		evs = append(evs, e.Kind.String()+" G"+string(rune('0'+e.Tier))+" "+string(e.Key.Bytes()))
	}
	require.Equal(t, []string{
		"stored G2 prefix-hash-0000", "stored G2 prefix-hash-0001", "stored G2 prefix-hash-0002", "stored G2 prefix-hash-0003",
		// the second offload evicts 0-3 (written back to G3) for 4-7
		"removed G2 prefix-hash-0000", "removed G2 prefix-hash-0001", "removed G2 prefix-hash-0002", "removed G2 prefix-hash-0003",
		"stored G3 prefix-hash-0000", "stored G3 prefix-hash-0001", "stored G3 prefix-hash-0002", "stored G3 prefix-hash-0003",
		"stored G2 prefix-hash-0004", "stored G2 prefix-hash-0005", "stored G2 prefix-hash-0006", "stored G2 prefix-hash-0007",
	}, evs, "G2 had no room beside the pinned 4-7: 0-3 went from G3 to G1 directly")
}

// With G2 full, G3 blocks load straight into G1 and stay in G3: nothing
// is evicted for them, on the load's path or after it (promote.go).
func TestOnboardPromotesFromG3(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 4, g3: 8}, Config{})
	f.offload(0, seq(0, 4))
	f.offload(4, seq(4, 4)) // 0-3 in G3, 4-7 in G2
	f.clearG1()
	note, err := f.c.Onboard(keyRange(0, 2), seq(8, 2), nil, nil)
	require.NoError(t, err)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	f.requireLoaded(seq(8, 2), 0)
	f.quiesce()
	n, ts, err := f.c.Match(keyRange(0, 8))
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, []worker.Tier{worker.G3, worker.G3, worker.G3, worker.G3, worker.G2, worker.G2, worker.G2, worker.G2}, ts,
		"G2 full: 0, 1 loaded straight into G1 and not promoted (promotion evicts nothing)")
	require.EqualValues(t, 2, f.c.Stats().OnboardedFromG3)
}

// Without G3, G2's victims go to the object store and come back from it;
// a corrupt object fails its block, is dropped, and says so in an event.
func TestEvictionToG4AndCorruptObject(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 4, g4: true}, Config{})
	f.offload(0, seq(0, 4))
	f.offload(4, seq(4, 4)) // 0-3 go to G4
	n, ts, err := f.c.Match(keyRange(0, 8))
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, append(repeat(worker.G4, 4), repeat(worker.G2, 4)...), ts)

	// Corrupt key 1's object: flip a payload byte.
	objects := objectFiles(t, f.objDir)
	require.Len(t, objects, 4)
	var corrupted bool
	for _, p := range objects {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		if bytes.Contains(b, key(1)) {
			b[len(b)-1] ^= 0xff
			require.NoError(t, os.WriteFile(p, b, 0o644))
			corrupted = true
		}
	}
	require.True(t, corrupted)
	f.c.DrainEvents(nil, 0)

	f.clearG1()
	note, err := f.c.Onboard(keyRange(0, 4), seq(8, 4), nil, nil)
	require.NoError(t, err)
	err = note.WaitTimeout(10 * time.Second)
	require.Error(t, err)
	require.Equal(t, []int{9}, note.FailedBlocks())
	f.requireLoaded([]int{8}, 0)
	f.requireLoaded([]int{10, 11}, 2)
	f.requireZero(9)
	require.EqualValues(t, 1, f.c.Stats().G4Corrupt)
	var removed []string
	for _, e := range f.c.DrainEvents(nil, 0) {
		if e.Kind == pool.Removed && e.Tier == int(worker.G4) {
			removed = append(removed, string(e.Key.Bytes()))
		}
	}
	require.Equal(t, []string{string(key(1))}, removed)
}

func objectFiles(t *testing.T, dir string) []string {
	var out []string
	require.NoError(t, filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			out = append(out, p)
		}
		return err
	}))
	return out
}

// openDiskFiles lists /proc/self/fd/N for the descriptors of this process's
// files in dir: G3 files have no name in it.
func openDiskFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var out []string
	seen := map[string]bool{}
	for _, e := range ents {
		p := "/proc/self/fd/" + e.Name()
		target, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		if !seen[target] { // the buffered and the O_DIRECT descriptor of one file
			seen[target] = true
			out = append(out, p)
		}
	}
	return out
}

// A corrupt G3 block fails its G1 block only, and leaves G3.
func TestCorruptG3BlockIsRemoved(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 2, g3: 4}, Config{})
	f.offload(0, seq(0, 2))
	f.offload(2, seq(2, 2)) // 0, 1 to G3 blocks 0, 1
	files := openDiskFiles(t, f.diskDir)
	require.Len(t, files, 1)
	fh, err := os.OpenFile(files[0], os.O_RDWR, 0)
	require.NoError(t, err)
	info, err := fh.Stat()
	require.NoError(t, err)
	stride := info.Size() / 4
	_, err = fh.WriteAt([]byte{0xde, 0xad}, stride+100) // inside G3 block 1
	require.NoError(t, err)
	require.NoError(t, fh.Close())

	note, err := f.c.Onboard(keyRange(0, 2), seq(8, 2), nil, nil)
	require.NoError(t, err)
	err = note.WaitTimeout(10 * time.Second)
	require.ErrorIs(t, err, transfer.ErrCorrupt)
	require.Equal(t, []int{9}, note.FailedBlocks())
	f.requireLoaded([]int{8}, 0)
	f.requireZero(9)
	n, _, err := f.c.Match(keyRange(1, 1))
	require.NoError(t, err)
	require.Zero(t, n, "the corrupt block left G3")
}

// A key evicted between Match and Onboard fails its block; the others load.
func TestOnboardOfUncachedKeyFailsItsBlock(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 8}, Config{})
	f.offload(0, seq(0, 2))
	f.clearG1()
	note, err := f.c.Onboard([][]byte{key(0), key(99), key(1)}, []int{4, 5, 6}, nil, nil)
	require.NoError(t, err)
	err = note.WaitTimeout(10 * time.Second)
	require.ErrorIs(t, err, ErrNotCached)
	require.Equal(t, []int{5}, note.FailedBlocks())
	f.requireLoaded([]int{4}, 0)
	f.requireLoaded([]int{6}, 1)
	f.requireZero(5)
}

// A copy that fails registers no key for its blocks.
func TestFailedOffloadRegistersNothing(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 8}, Config{})
	boom := errors.New("injected copy fault")
	f.emu.InjectCopyFault(func(kind cuda.CopyKind, _ cuda.Copy) error {
		if kind == cuda.DeviceToHost {
			return boom
		}
		return nil
	})
	for i := range 4 {
		f.compute(i, i)
	}
	note, ds, err := f.c.Offload(keyRange(0, 4), seq(0, 4), 0)
	require.NoError(t, err)
	require.Equal(t, repeatDecision(pool.Store, 4), ds)
	require.Error(t, note.WaitTimeout(10*time.Second))
	require.Equal(t, seq(0, 4), note.FailedBlocks(), "the G1 blocks that were not saved")
	f.emu.InjectCopyFault(nil)
	n, _, err := f.c.Match(keyRange(0, 4))
	require.NoError(t, err)
	require.Zero(t, n)
	st := f.c.Stats()
	require.Zero(t, st.G2.Registered+st.G2.Storing+st.G2.Allocated)
	require.EqualValues(t, 4, st.OffloadFailed)
	// and the same keys offload fine afterwards
	f.offload(0, seq(0, 4))
}

// Bad input is refused with an error naming it, and changes nothing.
func TestBadInput(t *testing.T) {
	f := newFixture(t, tiers{g1: 8, g2: 8}, Config{})
	f.offload(0, seq(0, 2))
	before := f.c.Stats()
	long := bytes.Repeat([]byte{1}, pool.MaxKeyLen+1)
	for name, call := range map[string]func() error{
		"key too long": func() error { _, _, err := f.c.Offload([][]byte{long}, []int{0}, 0); return err },
		"empty key":    func() error { _, _, err := f.c.Offload([][]byte{{}}, []int{0}, 0); return err },
		"duplicate keys": func() error {
			_, _, err := f.c.Offload([][]byte{key(5), key(5)}, []int{0, 1}, 0)
			return err
		},
		"more keys than blocks": func() error { _, _, err := f.c.Offload(keyRange(5, 3), []int{0, 1}, 0); return err },
		"onboard repeated G1": func() error {
			_, err := f.c.Onboard(keyRange(0, 2), []int{3, 3}, nil, nil)
			return err
		},
		"onboard wrong event count": func() error {
			_, err := f.c.Onboard(keyRange(0, 2), []int{3, 4}, []cuda.Event{1}, nil)
			return err
		},
		"onboard null event": func() error {
			_, err := f.c.Onboard(keyRange(0, 2), []int{3, 4}, []cuda.Event{1, 0, 2}, nil)
			return err
		},
		"match duplicate": func() error { _, _, err := f.c.Match([][]byte{key(0), key(0)}); return err },
	} {
		err := call()
		require.Equal(t, kvbmerr.InvalidArgument, kvbmerr.KindOf(err), "%s: %v", name, err)
	}
	_, _, err := f.c.Offload(keyRange(5, 1), []int{8}, 0)
	require.Equal(t, kvbmerr.OutOfRange, kvbmerr.KindOf(err), "G1 id out of range: %v", err)
	require.Equal(t, before, f.c.Stats(), "nothing changed")
}

// Layer-wise onboard records each layer's event before Onboard returns,
// also for blocks staged from G3.
func TestLayerwiseOnboard(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(map[bool]string{false: "worker's stream", true: "caller's stream"}[own], func(t *testing.T) {
			layerwiseOnboard(t, own)
		})
	}
}

// layerwiseOnboard: the copy of the blocks G2 holds runs beside the
// staging of G3's, slowed here (its first device copy waits 200 ms), and
// the layer events still cover it.
func layerwiseOnboard(t *testing.T, callerStream bool) {
	f := newFixture(t, tiers{g1: 16, g2: 2, g3: 4}, Config{})
	f.offload(0, seq(0, 2))
	f.offload(2, seq(2, 2)) // 0, 1 in G3; 2, 3 in G2
	f.clearG1()
	events := make([]cuda.Event, shape(1).NumLayers)
	for i := range events {
		ev, err := f.emu.EventCreate(0)
		require.NoError(t, err)
		events[i] = ev
		defer func() { require.NoError(t, f.emu.EventDestroy(ev)) }()
	}
	var stream *cuda.Stream
	if callerStream {
		s, err := f.emu.StreamCreate(0)
		require.NoError(t, err)
		defer func() { require.NoError(t, f.emu.StreamDestroy(s)) }()
		stream = &s
	}
	var first atomic.Bool
	f.emu.InjectCopyFault(func(kind cuda.CopyKind, _ cuda.Copy) error {
		if kind == cuda.HostToDevice && first.CompareAndSwap(false, true) {
			time.Sleep(200 * time.Millisecond) // the early copy: enqueued before staging starts
		}
		return nil
	})
	defer f.emu.InjectCopyFault(nil)
	note, err := f.c.Onboard(keyRange(0, 4), seq(4, 4), events, stream)
	require.NoError(t, err)
	for _, ev := range events {
		require.NoError(t, f.emu.EventSynchronize(ev))
	}
	// The events alone vouch for every block, those G2 held (copied while
	// G3's were staged) and those staged.
	f.requireLoaded(seq(4, 4), 0)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	require.EqualValues(t, 2, f.c.Stats().OnboardedFromG2)
	require.EqualValues(t, 2, f.c.Stats().OnboardedFromG3)
}

// Many threads offload, match and onboard at once (run with -race); every
// onboard that reports success delivered the right bytes.
func TestConcurrentUse(t *testing.T) {
	f := newFixture(t, tiers{g1: 64, g2: 12, g3: 24, g4: true}, Config{})
	for i := range 64 {
		f.compute(i, i)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := 32 + g*8 // G1 blocks [0, 32) hold the keys; each goroutine loads into its own 8 of [32, 64)
			for round := range 6 {
				from := (g*3 + round) % 8 * 4
				note, _, err := f.c.Offload(keyRange(from, 4), seq(from, 4), 0)
				require.NoError(t, err)
				require.NoError(t, note.WaitTimeout(10*time.Second))
				n, _, err := f.c.Match(keyRange(from, 4))
				require.NoError(t, err)
				if n == 0 {
					continue
				}
				dst := seq(base+round%2*4, n)
				note, err = f.c.Onboard(keyRange(from, n), dst, nil, nil)
				require.NoError(t, err)
				err = note.WaitTimeout(10 * time.Second)
				failed := map[int]bool{}
				for _, id := range note.FailedBlocks() {
					failed[id] = true
				}
				if err != nil {
					require.NotEmpty(t, failed, err.Error())
				}
				for j, id := range dst {
					if !failed[id] {
						requireContent(t, from+j, f.block(worker.G1, id), "goroutine %d round %d G1 block %d", g, round, id)
					}
				}
			}
		}()
	}
	wg.Wait()
	f.quiesce()
	st := f.c.Stats()
	require.Zero(t, st.G2.Pinned+st.G3.Pinned, "no pin outlives its transfer")
	require.Zero(t, st.G2.Storing+st.G2.Allocated, "no block is left in flight")
}

// A block G2 evicts while every G3 block is held by a transfer goes to G4
// instead of nowhere (found by the demo).
func TestWriteBackFallsThroughToG4WhenG3IsHeld(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 4, g3: 2, g4: true}, Config{G3: WriteBack, G4: WriteBack})
	f.offload(0, seq(0, 4))
	f.offload(4, seq(4, 2))
	f.offload(6, seq(6, 2))
	f.quiesce()
	// 0, 1 in G4; 2, 3 in G3; 4-7 in G2. Loading 2, 3 pins both G3 blocks
	// while G2 makes room for them by evicting 4, 5.
	note, err := f.c.Onboard(keyRange(2, 2), []int{8, 9}, nil, nil)
	require.NoError(t, err)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	f.quiesce()
	n, ts, err := f.c.Match(keyRange(0, 8))
	require.NoError(t, err)
	require.Equal(t, 8, n, "no key is lost from every tier: %v", ts)
	require.Equal(t, []worker.Tier{worker.G4, worker.G4, worker.G3, worker.G3, worker.G2, worker.G2, worker.G2, worker.G2}, ts)
	require.Zero(t, f.c.Stats().WriteDownFailed)
}

// Reset forgets what G2 and G3 hold: matches find nothing, a REMOVED event
// names each key, their blocks take new stores, and offering a key again
// stores it anew (not deduplicated against the forgotten copy).
func TestResetForgetsG2AndG3(t *testing.T) {
	f := newFixture(t, tiers{g1: 16, g2: 4, g3: 8}, Config{})
	f.offload(0, seq(0, 4))
	f.offload(4, seq(4, 4)) // 0-3 down to G3, 4-7 in G2
	f.quiesce()
	f.c.DrainEvents(nil, 0)
	g2, g3, err := f.c.Reset()
	require.NoError(t, err)
	require.Equal(t, 4, g2)
	require.Equal(t, 4, g3)
	n, _, err := f.c.Match(keyRange(0, 8))
	require.NoError(t, err)
	require.Zero(t, n)
	evs := f.c.DrainEvents(nil, 0)
	require.Len(t, evs, 8)
	for _, e := range evs {
		require.Equal(t, pool.Removed, e.Kind)
	}
	st := f.c.Stats()
	require.Equal(t, 4, st.G2.Free)
	require.Equal(t, 8, st.G3.Free)
	require.Equal(t, []pool.Decision{pool.Store, pool.Store, pool.Store, pool.Store}, f.offload(0, seq(0, 4)))
	f.quiesce()
	f.clearG1()
	note, err := f.c.Onboard(keyRange(0, 4), seq(8, 4), nil, nil)
	require.NoError(t, err)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	f.requireLoaded(seq(8, 4), 0)
	require.NoError(t, f.c.Close())
	_, _, err = f.c.Reset()
	require.ErrorIs(t, err, transfer.ErrClosed)
}

func TestLoadsAreMeasuredPerTier(t *testing.T) {
	// Onboards from G2 and from G3 (staged through G2) leave a rate for
	// each tier they read, and nothing in flight once they are over.
	defer func(was float64) { minSampleBytes = was }(minSampleBytes)
	minSampleBytes = 4 * float64(shape(1).BlockSize()) // these blocks are small
	f := newFixture(t, tiers{g1: 16, g2: 4, g3: 16}, Config{G3: WriteThrough})
	require.Zero(t, f.c.Stats().LoadRate[worker.G2])
	f.offload(0, seq(0, 4))
	f.quiesce()
	f.offload(4, seq(4, 4)) // evicts keys 0..3 from G2: they are G3's only
	f.quiesce()
	f.clearG1()
	for _, from := range []int{4, 0} { // G2, then G3
		n, err := f.c.Onboard(keyRange(from, 4), seq(8, 4), nil, nil)
		require.NoError(t, err)
		require.NoError(t, n.WaitTimeout(10*time.Second))
		f.requireLoaded(seq(8, 4), from)
	}
	st := f.c.Stats()
	require.Positive(t, st.LoadRate[worker.G2])
	require.Positive(t, st.LoadRate[worker.G3], "%+v", st)
	require.Zero(t, st.LoadRate[worker.G4])
	require.Equal(t, [5]float64{}, st.LoadQueued)
	// A load smaller than the sample size is not measured: the rate stays.
	minSampleBytes = 1 << 20
	n, err := f.c.Onboard(keyRange(4, 1), seq(8, 1), nil, nil)
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(10*time.Second))
	require.Equal(t, st.LoadRate, f.c.Stats().LoadRate)
}

// A load queued on the caller's stream behind the caller's own work (an
// engine's forward) is measured from when the stream reached it: the G2
// rate is the copy's, not the copy's plus the wait.
func TestALoadBehindTheCallersWorkIsMeasuredFromWhenItStarts(t *testing.T) {
	defer func(was float64) { minSampleBytes = was }(minSampleBytes)
	minSampleBytes = 4 * float64(shape(1).BlockSize())
	f := newFixture(t, tiers{g1: 16, g2: 4}, Config{})
	f.offload(0, seq(0, 4))
	f.quiesce()
	f.clearG1()
	stream, err := f.emu.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.emu.StreamDestroy(stream)) }()
	// The caller's work: a 3-byte copy that holds the stream until released.
	src, err := f.emu.HostAlloc(0, 8)
	require.NoError(t, err)
	dst, err := f.emu.MemAlloc(0, 8)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.emu.HostFree(src)); require.NoError(t, f.emu.MemFree(dst)) }()
	release := make(chan struct{})
	var first atomic.Bool
	f.emu.InjectCopyFault(func(_ cuda.CopyKind, c cuda.Copy) error {
		switch {
		case c.Size == 3:
			<-release
		case first.CompareAndSwap(false, true):
			// The load's first copy takes a while, so that the stamp of
			// when the stream reached the load is taken before its end
			// (a load of microseconds can end first, and is not sampled).
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	})
	defer f.emu.InjectCopyFault(nil)
	require.NoError(t, f.emu.MemcpyAsync(cuda.HostToDevice, cuda.Copy{Dst: dst, Src: src, Size: 3}, stream))

	const held = time.Second
	note, err := f.c.Onboard(keyRange(0, 4), seq(8, 4), nil, &stream)
	require.NoError(t, err)
	time.Sleep(held)
	close(release)
	require.NoError(t, note.WaitTimeout(10*time.Second))
	f.requireLoaded(seq(8, 4), 0)
	bytes := 4 * float64(shape(1).BlockSize())
	rate := f.c.Stats().LoadRate[worker.G2]
	require.NotZero(t, rate, "the load was not sampled")
	require.Less(t, bytes/rate, (held / 2).Seconds(),
		"the copy of 4 small blocks is timed as taking %.3f s: the wait behind the caller's copy counted", bytes/rate)
}
