package transfer

import (
	"github.com/kvbm/kvbm/core/layout"
	"sync"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

// gate holds a stream until opened: a D2D copy of one byte whose execution
// blocks in the emulated device's fault hook, and an event recorded after it.
type gate struct {
	open  chan struct{}
	event cuda.Event
}

func newGate(t *testing.T, f *fixture, onCopy func(kind cuda.CopyKind, c cuda.Copy)) *gate {
	f.needEmulated()
	g := &gate{open: make(chan struct{})}
	buf, err := f.emu.MemAlloc(0, 2)
	require.NoError(t, err)
	f.emu.InjectCopyFault(func(kind cuda.CopyKind, c cuda.Copy) error {
		if kind == cuda.DeviceToDevice && c.Src == buf {
			<-g.open
		} else if onCopy != nil {
			onCopy(kind, c)
		}
		return nil
	})
	s, err := f.emu.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, f.emu.MemcpyAsync(cuda.DeviceToDevice, cuda.Copy{Dst: buf + 1, Src: buf, Size: 1}, s))
	g.event, err = f.emu.EventCreate(0)
	require.NoError(t, err)
	require.NoError(t, f.emu.EventRecord(g.event, s))
	t.Cleanup(func() {
		g.release()
		require.NoError(t, f.emu.StreamSynchronize(s))
		f.emu.InjectCopyFault(nil)
		f.emu.StreamDestroy(s)
		f.emu.EventDestroy(g.event)
		f.emu.MemFree(buf)
	})
	return g
}

var releaseMu sync.Mutex

func (g *gate) release() {
	releaseMu.Lock()
	defer releaseMu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// Layer L's event completes only after layer L's copies, and every layer's
// copies run after the previous layer's: a reader that waits on layer L's
// event sees layers 0..L in place.
func TestLayerwiseOnboardOrdering(t *testing.T) {
	t.Run("one stream", func(t *testing.T) { layerwiseOrdering(t, smallConfig(6), true) })
	// 384 KiB a layer: split over two streams, the events still cumulative.
	big := layout.Config{NumBlocks: 6, NumLayers: 4, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}
	t.Run("two streams", func(t *testing.T) { layerwiseOrdering(t, big, false) })
}

func layerwiseOrdering(t *testing.T, cfg layout.Config, inOrder bool) {
	f := newFixture(t)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g1 := f.alloc(storage.Device, cfg, shapes["ls-second"])
	f.fill(g2, 20)
	f.fill(g1, 80)
	g1l, _, _ := f.m.Layout(g1)
	layerOf := map[uint64]int{}
	for layer := range cfg.NumLayers {
		for outer := range cfg.OuterDim {
			for b := range cfg.NumBlocks {
				layerOf[g1l.Fragment(b, layer, outer).Addr] = layer
			}
		}
	}
	src, dst := []int{0, 1, 2, 5}, []int{5, 3, 1, 0}
	// The last block's copies are in each layer's second half: on the second
	// stream when layers are split. Slowing them shows whether a layer's
	// event waits for that half too.
	last := map[uint64]bool{}
	for layer := range cfg.NumLayers {
		for outer := range cfg.OuterDim {
			last[g1l.Fragment(dst[len(dst)-1], layer, outer).Addr] = true
		}
	}
	var mu sync.Mutex
	var order []int
	g := newGate(t, f, func(kind cuda.CopyKind, c cuda.Copy) {
		if kind == cuda.HostToDevice {
			mu.Lock()
			order = append(order, layerOf[c.Dst])
			mu.Unlock()
			if last[c.Dst] {
				time.Sleep(5 * time.Millisecond)
			}
		}
	})

	stream, err := f.emu.StreamCreate(0)
	require.NoError(t, err)
	defer f.emu.StreamDestroy(stream)
	require.NoError(t, f.emu.StreamWaitEvent(stream, g.event)) // hold the onboard stream
	events := make([]cuda.Event, cfg.NumLayers)
	for i := range events {
		events[i], err = f.emu.EventCreate(0)
		require.NoError(t, err)
		defer f.emu.EventDestroy(events[i])
	}
	n, err := f.m.ExecuteLayerwiseOnboard(g2, src, g1, dst, events, &stream)
	require.NoError(t, err)
	for _, ev := range events {
		done, err := f.emu.EventQuery(ev)
		require.NoError(t, err)
		require.False(t, done, "no layer completes while the stream is held")
	}
	time.Sleep(10 * time.Millisecond)
	mu.Lock()
	require.Empty(t, order, "no copy starts before the work queued on the caller's stream")
	mu.Unlock()
	g.release()
	frag := cfg.FragmentSize() * cfg.OuterDim
	for layer, ev := range events {
		require.NoError(t, f.emu.EventSynchronize(ev))
		for i := range src {
			for l := 0; l <= layer; l++ {
				want := pattern(cfg.BlockSize(), 20+uint64(src[i]))[l*frag : (l+1)*frag]
				for outer := range cfg.OuterDim {
					fr := g1l.Fragment(dst[i], l, outer)
					got, err := f.emu.Bytes(fr.Addr, fr.Size)
					require.NoError(t, err)
					require.Equal(t, want[outer*cfg.FragmentSize():(outer+1)*cfg.FragmentSize()], got,
						"after event %d, layer %d of block %d", layer, l, dst[i])
				}
			}
		}
	}
	require.NoError(t, n.WaitTimeout(-1))
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, order)
	for i := 1; inOrder && i < len(order); i++ {
		require.LessOrEqual(t, order[i-1], order[i], "copies run layer by layer")
	}
}

func TestLayerwiseOnboardErrors(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g1 := f.alloc(storage.Device, cfg, FullyContiguous)
	sys := f.alloc(storage.System, cfg, FullyContiguous)
	ev := make([]cuda.Event, cfg.NumLayers)
	for i := range ev {
		ev[i] = cuda.Event(1000 + i)
	}
	_, err := f.m.ExecuteLayerwiseOnboard(g2, []int{0, 1}, g1, []int{0}, ev, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "layer-wise onboard: invalid argument: 2 source block ids but 1 destination block ids")
	_, err = f.m.ExecuteLayerwiseOnboard(g2, []int{0}, g1, []int{0}, ev[:3], nil)
	require.ErrorContains(t, err, "3 layer events given, the layout has 4 layers")
	_, err = f.m.ExecuteLayerwiseOnboard(g2, []int{0}, g1, []int{0}, []cuda.Event{1, 2, 0, 4}, nil)
	require.ErrorContains(t, err, "layer event 2 is null")
	_, err = f.m.ExecuteLayerwiseOnboard(g1, []int{0}, g2, []int{0}, ev, nil)
	require.ErrorContains(t, err, "moves pinned host blocks to the device")
	_, err = f.m.ExecuteLayerwiseOnboard(sys, []int{0}, g1, []int{0}, ev, nil)
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = f.m.ExecuteLayerwiseOnboard(g2, []int{9}, g1, []int{0}, ev, nil)
	require.ErrorContains(t, err, "source block id 9")
}

// An offload whose precondition is the engine's compute event reads the KV
// as it is once that event completes, not before.
func TestOffloadWaitsForPrecondition(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	g1 := f.alloc(storage.Device, cfg, FullyContiguous)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g3 := f.alloc(storage.Disk, cfg, FullyContiguous)
	f.fill(g1, 1)
	g := newGate(t, f, nil) // the engine's compute, still running
	n, err := f.m.ExecuteTransfer(g1, []int{0, 1}, g2, []int{2, 3}, Options{Precondition: g.event})
	require.NoError(t, err)
	n3, err := f.m.ExecuteTransfer(g1, []int{0}, g3, []int{0}, Options{Precondition: g.event})
	require.NoError(t, err)
	done, err := n.Poll()
	require.NoError(t, err)
	require.False(t, done, "the offload waits for the compute event")
	done, _ = n3.Poll()
	require.False(t, done)
	// The compute finishes writing block 0, then its event completes.
	f.writeBlock(g1, 0, pattern(cfg.BlockSize(), 77))
	g.release()
	require.NoError(t, n.WaitTimeout(-1))
	require.NoError(t, n3.WaitTimeout(-1))
	require.Equal(t, pattern(cfg.BlockSize(), 77), f.readBlock(g2, 2))
	require.Equal(t, pattern(cfg.BlockSize(), 2), f.readBlock(g2, 3))
	require.Equal(t, pattern(cfg.BlockSize(), 77), f.readBlock(g3, 0))
}

// The precondition on any driver (no gate: the real one has none): the
// engine's stream writes G1 (copies from a pinned staging layout on a
// stream of its own), the engine records its event there, and offloads
// given that event, to G2 and through the bounce buffer to disk, read
// what the engine wrote. 32 MiB, so that the engine's write is still
// running when they start: on the CUDA double, copies take time, and an
// offload that did not wait would read the old bytes.
func TestOffloadReadsWhatItsPreconditionCovers(t *testing.T) {
	f := newFixture(t)
	cfg := layout.Config{NumBlocks: 32, NumLayers: 4, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}
	g1 := f.alloc(storage.Device, cfg, FullyContiguous)
	staging := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g3 := f.alloc(storage.Disk, cfg, FullyContiguous)
	f.fill(g1, 1)
	f.fill(staging, 100)
	s, err := f.drv.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.drv.StreamDestroy(s)) }()
	ev, err := f.drv.EventCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.drv.EventDestroy(ev)) }()
	all := make([]int, cfg.NumBlocks)
	for i := range all {
		all[i] = i
	}
	compute, err := f.m.ExecuteTransfer(staging, all, g1, all, Options{Stream: &s})
	require.NoError(t, err)
	require.NoError(t, f.drv.EventRecord(ev, s))
	n2, err := f.m.ExecuteTransfer(g1, all, g2, all, Options{Precondition: ev})
	require.NoError(t, err)
	n3, err := f.m.ExecuteTransfer(g1, []int{31}, g3, []int{0}, Options{Precondition: ev})
	require.NoError(t, err)
	require.NoError(t, compute.WaitTimeout(-1))
	require.NoError(t, n2.WaitTimeout(-1))
	require.NoError(t, n3.WaitTimeout(-1))
	for id := range cfg.NumBlocks {
		require.Equal(t, pattern(cfg.BlockSize(), 100+uint64(id)), f.readBlock(g2, id), "G2 block %d", id)
	}
	require.Equal(t, pattern(cfg.BlockSize(), 131), f.readBlock(g3, 0))
}

// Layer-wise onboard on any driver: the engine makes a stream wait for
// layer L's event and reads layer L from there (here: an offload of that
// layer to pinned memory, given the event as its precondition). 1 MiB a
// layer, split over two streams: each layer's event must cover both
// halves. On the CUDA double copies take time, so a read the event did
// not hold back would see the old bytes.
func TestLayerwiseEventsCoverTheirLayer(t *testing.T) {
	f := newFixture(t)
	cfg := layout.Config{NumBlocks: 8, NumLayers: 4, OuterDim: 2, PageSize: 16, InnerDim: 2048, DtypeWidth: 2}
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g1 := f.alloc(storage.Device, cfg, shapes["ls-second"])
	out := f.alloc(storage.Pinned, cfg, FullyContiguous)
	f.fill(g2, 20)
	f.fill(g1, 80)
	events := make([]cuda.Event, cfg.NumLayers)
	for i := range events {
		ev, err := f.drv.EventCreate(0)
		require.NoError(t, err)
		defer func() { require.NoError(t, f.drv.EventDestroy(ev)) }()
		events[i] = ev
	}
	ids := []int{0, 1, 2, 3, 4, 5, 6, 7}
	n, err := f.m.ExecuteLayerwiseOnboard(g2, ids, g1, ids, events, nil)
	require.NoError(t, err)
	var reads []*Notification
	for layer := range cfg.NumLayers {
		r, err := f.m.ExecuteTransfer(g1, ids, out, ids, Options{Precondition: events[layer],
			Layers: &LayerRange{Start: layer, End: layer + 1}})
		require.NoError(t, err)
		reads = append(reads, r)
	}
	require.NoError(t, n.WaitTimeout(-1))
	for _, r := range reads {
		require.NoError(t, r.WaitTimeout(-1))
	}
	for _, id := range ids {
		require.Equal(t, pattern(cfg.BlockSize(), 20+uint64(id)), f.readBlock(out, id), "block %d", id)
	}
}
