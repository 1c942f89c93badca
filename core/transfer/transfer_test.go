package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every (shape, kind) pair to every (shape, kind) pair: moved blocks arrive
// byte for byte, and the guard blocks around them stay untouched.
func TestRoundTripMatrix(t *testing.T) {
	f := newFixture(t)
	const blocks = 8
	cfg := smallConfig(blocks)
	srcIDs := []int{1, 3, 5, 6}
	dstIDs := []int{6, 2, 0, 4}
	for srcName, srcShape := range shapes {
		for _, srcKind := range kinds {
			src := f.alloc(srcKind, cfg, srcShape)
			f.fill(src, 100)
			for dstName, dstShape := range shapes {
				for _, dstKind := range kinds {
					name := fmt.Sprintf("%s-%v/%s-%v", srcName, srcKind, dstName, dstKind)
					t.Run(name, func(t *testing.T) {
						dst := f.alloc(dstKind, cfg, dstShape)
						defer f.m.Unregister(dst)
						f.fill(dst, 900)
						n, err := f.m.ExecuteTransfer(src, srcIDs, dst, dstIDs, Options{})
						if (srcKind == storage.System && dstKind == storage.Device) ||
							(srcKind == storage.Device && dstKind == storage.System) {
							require.ErrorIs(t, err, ErrUnsupported)
							require.ErrorContains(t, err, "pinned")
							return
						}
						require.NoError(t, err)
						require.NoError(t, n.WaitTimeout(10*time.Second))
						moved := map[int]int{}
						for i, d := range dstIDs {
							moved[d] = srcIDs[i]
						}
						for id := range blocks {
							want := pattern(cfg.BlockSize(), 900+uint64(id))
							if s, ok := moved[id]; ok {
								want = pattern(cfg.BlockSize(), 100+uint64(s))
							}
							require.True(t, bytes.Equal(want, f.readBlock(dst, id)), "block %d", id)
						}
					})
				}
			}
			require.NoError(t, f.m.Unregister(src))
		}
	}
}

// A layer range moves only those layers; the others keep their bytes.
func TestPartialLayerRange(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	frag := cfg.FragmentSize() * cfg.OuterDim // one layer of one block
	for _, pair := range [][2]storage.Kind{
		{storage.Pinned, storage.Device}, {storage.Device, storage.Pinned}, {storage.System, storage.Disk},
		{storage.Disk, storage.Pinned}, {storage.Disk, storage.Device}, {storage.Device, storage.Device},
	} {
		t.Run(fmt.Sprintf("%v-%v", pair[0], pair[1]), func(t *testing.T) {
			src := f.alloc(pair[0], cfg, shapes["ls-second"])
			dst := f.alloc(pair[1], cfg, FullyContiguous)
			f.fill(src, 10)
			f.fill(dst, 50)
			require.NoError(t, f.transfer(src, []int{0, 2}, dst, []int{3, 1}, Options{Layers: Layers(1, 3)}))
			for _, c := range []struct{ s, d int }{{0, 3}, {2, 1}} {
				got := f.readBlock(dst, c.d)
				from := pattern(cfg.BlockSize(), 10+uint64(c.s))
				keep := pattern(cfg.BlockSize(), 50+uint64(c.d))
				for layer := range cfg.NumLayers {
					want := keep
					if layer >= 1 && layer < 3 {
						want = from
					}
					lo, hi := layer*frag, (layer+1)*frag
					require.Equal(t, want[lo:hi], got[lo:hi], "dst %d layer %d", c.d, layer)
				}
			}
			require.Equal(t, pattern(cfg.BlockSize(), 50), f.readBlock(dst, 0))
		})
	}
}

func TestValidationErrors(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	a := f.alloc(storage.Pinned, cfg, FullyContiguous)
	b := f.alloc(storage.Device, cfg, FullyContiguous)
	other := cfg
	other.NumLayers = 3
	c := f.alloc(storage.Pinned, other, FullyContiguous)
	missing := LayoutHandle{Worker: 0xA1, Layout: 999}
	cases := []struct {
		name     string
		src      LayoutHandle
		srcIDs   []int
		dst      LayoutHandle
		dstIDs   []int
		opts     Options
		is       error
		contains string
	}{
		{"lengths", a, []int{0, 1}, b, []int{0}, Options{}, ErrInvalidArgument, "2 source block ids but 1 destination"},
		{"src range", a, []int{4}, b, []int{0}, Options{}, ErrInvalidArgument, "source block id 4 (index 0) out of range [0, 4)"},
		{"dst negative", a, []int{0}, b, []int{-1}, Options{}, ErrInvalidArgument, "destination block id -1"},
		{"dst duplicate", a, []int{0, 1}, b, []int{2, 2}, Options{}, ErrInvalidArgument, "destination block id 2 appears twice"},
		{"overlap", a, []int{0, 1}, a, []int{1, 2}, Options{}, ErrInvalidArgument, "block 1 is both a source and a destination"},
		{"incompatible", a, []int{0}, c, []int{0}, Options{}, ErrInvalidArgument, "NumLayers 4 vs 3"},
		{"layer range", a, []int{0}, b, []int{0}, Options{Layers: Layers(2, 5)}, ErrInvalidArgument, "layer range [2, 5)"},
		{"empty layer range", a, []int{0}, b, []int{0}, Options{Layers: Layers(2, 2)}, ErrInvalidArgument, "layer range [2, 2)"},
		{"missing src", missing, []int{0}, b, []int{0}, Options{}, ErrNotFound, "source: not found: no layout registered for handle a1/999"},
		{"missing dst", a, []int{0}, missing, []int{0}, Options{}, ErrNotFound, "destination"},
	}
	f.fill(b, 7)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, err := f.m.ExecuteTransfer(tc.src, tc.srcIDs, tc.dst, tc.dstIDs, tc.opts)
			require.Nil(t, n)
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.contains)
		})
	}
	// Nothing moved.
	for id := range 4 {
		require.Equal(t, pattern(cfg.BlockSize(), 7+uint64(id)), f.readBlock(b, id))
	}
	// An empty transfer is a completed success.
	n, err := f.m.ExecuteTransfer(a, nil, b, nil, Options{})
	require.NoError(t, err)
	done, err := n.Poll()
	require.True(t, done)
	require.NoError(t, err)
}

func TestDiskAllocationErrors(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	m, err := NewManager(Config{WorkerID: 1, Driver: emu})
	require.NoError(t, err)
	defer m.Close()
	_, err = m.AllocateLayout(storage.Disk, smallConfig(2), FullyContiguous)
	require.ErrorContains(t, err, "no disk directory configured")

	file := t.TempDir() + "/not-a-dir"
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	m2, err := NewManager(Config{WorkerID: 2, Driver: emu, DiskDir: file})
	require.NoError(t, err)
	defer m2.Close()
	_, err = m2.AllocateLayout(storage.Disk, smallConfig(2), FullyContiguous)
	require.ErrorContains(t, err, "not-a-dir")

	bad := smallConfig(2)
	bad.PageSize = 3
	_, err = m2.AllocateLayout(storage.Pinned, bad, FullyContiguous)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "PageSize must be a power of two, got 3")
}

func diskOf(t testing.TB, m *Manager, h LayoutHandle) *storage.DiskFile {
	e, err := m.lookup(h)
	require.NoError(t, err)
	require.NotNil(t, e.disk)
	return e.disk
}

// An I/O error (a full disk here) fails the transfer and names the blocks;
// it is never reported as success.
func TestDiskWriteFailureSurfaces(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(8)
	src := f.alloc(storage.Pinned, cfg, FullyContiguous)
	disk := f.alloc(storage.Disk, cfg, FullyContiguous)
	dev := f.alloc(storage.Device, cfg, FullyContiguous)
	f.fill(src, 1)
	blockBytes := uint64(4096) // disk blocks are 4 KiB-aligned: block b at b*4096
	diskOf(t, f.m, disk).SetFaultInjector(func(op string, off int64, n int) error {
		if op == "write" && uint64(off) <= 5*blockBytes && 5*blockBytes < uint64(off)+uint64(n) {
			return syscall.ENOSPC // any write that covers block 5
		}
		return nil
	})
	err := f.transfer(src, []int{0, 1, 2}, disk, []int{4, 5, 6}, Options{})
	var te *Error
	require.ErrorAs(t, err, &te)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.Equal(t, []int{5}, te.FailedBlocks)

	// Two hops: device -> disk fails the same way.
	f.fill(dev, 1)
	err = f.transfer(dev, []int{0, 1}, disk, []int{5, 7}, Options{})
	require.ErrorIs(t, err, syscall.ENOSPC)
	n, _ := f.m.ExecuteTransfer(dev, []int{0, 1}, disk, []int{5, 7}, Options{})
	require.Error(t, n.WaitTimeout(-1))
	require.Equal(t, []int{5}, n.FailedBlocks())
}

// A byte changed on disk after the write fails that block on read, and only
// that block.
func TestDiskCorruptionDetected(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			src := f.alloc(storage.Pinned, cfg, shape)
			disk := f.alloc(storage.Disk, cfg, shape)
			dst := f.alloc(storage.Device, cfg, FullyContiguous)
			f.fill(src, 3)
			require.NoError(t, f.transfer(src, []int{0, 1, 2, 3}, disk, []int{0, 1, 2, 3}, Options{}))
			l, _, _ := f.m.Layout(disk)
			r := l.Fragment(2, 3, 1)
			fh, err := os.OpenFile(diskOf(t, f.m, disk).Path(), os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = fh.WriteAt([]byte{0xFF}, int64(r.Addr+7))
			require.NoError(t, err)
			require.NoError(t, fh.Close())

			f.fill(dst, 9) // what the failed block's destination must keep
			n, err := f.m.ExecuteTransfer(disk, []int{0, 1, 2, 3}, dst, []int{3, 2, 1, 0}, Options{})
			require.NoError(t, err)
			err = n.WaitTimeout(-1)
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorContains(t, err, "disk block 2 layer 3")
			require.Equal(t, []int{1}, n.FailedBlocks())
			for _, c := range [][2]int{{0, 3}, {1, 2}, {3, 0}} {
				require.Equal(t, pattern(cfg.BlockSize(), 3+uint64(c[0])), f.readBlock(dst, c[1]))
			}
			// Its first hop failed: the bounce's bytes for it (corrupt, or an
			// earlier transfer's) were not taken on to the destination.
			require.Equal(t, pattern(cfg.BlockSize(), 9+1), f.readBlock(dst, 1))
		})
	}
}

// A disk read into the device through a bounce buffer far smaller than
// the transfer runs in chunks through the bounce's slots (here two, of
// half the bounce each), each chunk's copy beside the next chunk's read
// (the device copies are slowed so that they overlap): every block lands
// in its destination; a corrupt block in a middle chunk fails alone, its
// destination keeping its bytes (not what a chunk before left in its
// slot); a second hop that fails fails its chunk's blocks only. A bounce
// of one block is one slot: its chunks go one at a time.
func TestTwoHopChunksThroughTheBounceHalves(t *testing.T) {
	for _, bounce := range []int{4, 1} {
		t.Run(fmt.Sprintf("bounce of %d", bounce), func(t *testing.T) {
			drv, emu := testDriver(t)
			if emu == nil {
				t.Skip("needs the emulated device's fault hook")
			}
			m, err := NewManager(Config{WorkerID: 0xA2, Driver: drv, DiskDir: t.TempDir(), HostWorkers: 2, BounceBlocks: bounce})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, m.Close()) })
			f := &fixture{t: t, drv: drv, emu: emu, m: m}
			const n = 12 // chunks of 2 (or 1): the last one fails on its second hop
			cfg := smallConfig(n)
			src := f.alloc(storage.Pinned, cfg, FullyContiguous)
			disk := f.alloc(storage.Disk, cfg, FullyContiguous)
			dst := f.alloc(storage.Device, cfg, FullyContiguous)
			f.fill(src, 100)
			ids := seqInts(n)
			require.NoError(t, f.transfer(src, ids, disk, ids, Options{}))
			l, _, _ := f.m.Layout(disk)
			fh, err := os.OpenFile(diskOf(t, f.m, disk).Path(), os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = fh.WriteAt([]byte{0xFF}, int64(l.Fragment(5, 1, 0).Addr+3)) // a middle chunk
			require.NoError(t, err)
			require.NoError(t, fh.Close())
			dl, _, _ := f.m.Layout(dst)
			last := dl.Fragment(0, 0, 0) // rev[11]: source block 11, in the last chunk
			f.fill(dst, 500)
			var calls atomic.Int32
			emu.InjectCopyFault(func(kind cuda.CopyKind, c cuda.Copy) error {
				if kind != cuda.HostToDevice {
					return nil
				}
				calls.Add(1)
				time.Sleep(2 * time.Millisecond)
				if c.Dst >= last.Addr && c.Dst < last.Addr+uint64(cfg.BlockSize()) {
					return errors.New("injected: the last chunk's second hop")
				}
				return nil
			})
			defer emu.InjectCopyFault(nil)

			rev := make([]int, n)
			for i := range rev {
				rev[i] = n - 1 - i
			}
			nt, err := f.m.ExecuteTransfer(disk, ids, dst, rev, Options{})
			require.NoError(t, err)
			require.Error(t, nt.WaitTimeout(-1))
			chunk := max(1, bounce/2)
			lastChunk := []int{}
			for i := (n - 1) / chunk * chunk; i < n; i++ {
				lastChunk = append(lastChunk, rev[i])
			}
			require.ElementsMatch(t, append([]int{rev[5]}, lastChunk...), nt.FailedBlocks())
			require.Positive(t, calls.Load())
			for i := range ids {
				if i == 5 || slices.Contains(lastChunk, rev[i]) {
					if i == 5 {
						require.Equal(t, pattern(cfg.BlockSize(), 500+uint64(rev[i])), f.readBlock(dst, rev[i]), "its first hop failed")
					}
					continue
				}
				require.Equal(t, pattern(cfg.BlockSize(), 100+uint64(i)), f.readBlock(dst, rev[i]), "source block %d", i)
			}
		})
	}
}

// While one chunk's second hop is held in the device, the bounce's other
// slots keep taking chunks through both hops: the disk is never left idle
// behind one slow copy (a barrier per pair of chunks did that). 1 MiB
// blocks, a bounce of 16: four slots of four blocks, four chunks.
func TestTwoHopSlotsDoNotWaitForEachOther(t *testing.T) {
	drv, emu := testDriver(t)
	if emu == nil {
		t.Skip("needs the emulated device's fault hook")
	}
	m, err := NewManager(Config{WorkerID: 0xA3, Driver: drv, DiskDir: t.TempDir(), BounceBlocks: 16})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	f := &fixture{t: t, drv: drv, emu: emu, m: m}
	const n = 16
	cfg := layout.Config{NumBlocks: n, NumLayers: 4, OuterDim: 2, PageSize: 16, InnerDim: 4096, DtypeWidth: 2} // 1 MiB blocks
	require.Equal(t, 1<<20, cfg.BlockSize())
	src := f.alloc(storage.Pinned, cfg, FullyContiguous)
	disk := f.alloc(storage.Disk, cfg, FullyContiguous)
	dst := f.alloc(storage.Device, cfg, FullyContiguous)
	f.fill(src, 700)
	f.fill(dst, 900)
	ids := seqInts(n)
	require.NoError(t, f.transfer(src, ids, disk, ids, Options{}))
	dl, _, _ := f.m.Layout(dst)
	chunkOf := func(addr uint64) int {
		for b := range n {
			if start := dl.Fragment(b, 0, 0).Addr; addr >= start && addr < start+uint64(cfg.BlockSize()) {
				return b / 4
			}
		}
		return -1
	}
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open() // a failed wait must not leave the copy held
	var seen [4]atomic.Bool
	emu.InjectCopyFault(func(kind cuda.CopyKind, c cuda.Copy) error {
		if kind != cuda.HostToDevice {
			return nil
		}
		ch := chunkOf(c.Dst)
		seen[ch].Store(true)
		if ch == 0 {
			<-release
		}
		return nil
	})
	defer emu.InjectCopyFault(nil)
	nt, err := f.m.ExecuteTransfer(disk, ids, dst, ids, Options{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return seen[0].Load() && seen[1].Load() && seen[2].Load() && seen[3].Load() },
		10*time.Second, time.Millisecond, "chunks 1-3 reached the device while chunk 0's copy was held")
	open()
	require.NoError(t, nt.WaitTimeout(-1))
	for i := range ids {
		require.Equal(t, pattern(cfg.BlockSize(), 700+uint64(i)), f.readBlock(dst, i), "block %d", i)
	}
}

// A disk file cut short after the write fails the blocks it no longer
// holds as corrupt data (not an internal error), and only those blocks.
func TestDiskTruncatedFileIsCorruption(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g3 := f.alloc(storage.Disk, cfg, FullyContiguous)
	back := f.alloc(storage.Pinned, cfg, FullyContiguous)
	f.fill(g2, 7)
	f.fill(back, 90)
	require.NoError(t, f.transfer(g2, []int{0, 1, 2, 3}, g3, []int{0, 1, 2, 3}, Options{}))

	// Disk blocks are 4 KiB-aligned: block b at b*4096. Keep blocks 0 and 1
	// and 100 bytes of block 2.
	require.NoError(t, os.Truncate(diskOf(t, f.m, g3).Path(), 2*4096+100))

	n, err := f.m.ExecuteTransfer(g3, []int{0, 1, 2, 3}, back, []int{3, 2, 1, 0}, Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, "disk block 2")
	require.ElementsMatch(t, []int{1, 0}, n.FailedBlocks())
	require.Equal(t, pattern(cfg.BlockSize(), 7), f.readBlock(back, 3))
	require.Equal(t, pattern(cfg.BlockSize(), 8), f.readBlock(back, 2))

	// Through the bounce buffer (G3 -> G1) the same blocks fail the same way.
	g1 := f.alloc(storage.Device, cfg, FullyContiguous)
	n, err = f.m.ExecuteTransfer(g3, []int{0, 1, 2, 3}, g1, []int{0, 1, 2, 3}, Options{})
	require.NoError(t, err)
	require.ErrorIs(t, n.WaitTimeout(-1), ErrCorrupt)
	require.ElementsMatch(t, []int{2, 3}, n.FailedBlocks())
}

// A device copy that fails (an injected fault) fails the notification.
func TestDeviceFaultSurfaces(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	f.needEmulated()
	src := f.alloc(storage.Pinned, cfg, FullyContiguous)
	dst := f.alloc(storage.Device, cfg, FullyContiguous)
	boom := errors.New("injected ECC error")
	f.emu.InjectCopyFault(func(kind cuda.CopyKind, c cuda.Copy) error {
		if kind == cuda.HostToDevice {
			return boom
		}
		return nil
	})
	defer f.emu.InjectCopyFault(nil)
	n, err := f.m.ExecuteTransfer(src, []int{0, 1}, dst, []int{2, 3}, Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorContains(t, err, "injected ECC error")
	require.Equal(t, []int{2, 3}, n.FailedBlocks())

	// The failed stream's error is sticky; the pool replaces it, so the
	// next transfers succeed.
	f.emu.InjectCopyFault(nil)
	for range 8 {
		require.NoError(t, f.transfer(src, []int{0, 1}, dst, []int{2, 3}, Options{}))
	}
}

// Two hops through a caller's bounce buffer smaller than the transfer.
func TestCallerBounceBuffer(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(8)
	disk := f.alloc(storage.Disk, cfg, shapes["ls-first"])
	dev := f.alloc(storage.Device, cfg, shapes["ls-second"])
	bounce := f.alloc(storage.Pinned, smallConfig(3), FullyContiguous)
	sys := f.alloc(storage.System, smallConfig(3), FullyContiguous)
	f.fill(disk, 40)
	ids := []int{0, 1, 2, 3, 4, 5, 6}
	dst := []int{7, 6, 5, 4, 3, 2, 1}
	require.NoError(t, f.transfer(disk, ids, dev, dst, Options{Bounce: &Bounce{Handle: bounce, BlockIDs: []int{2, 0}}}))
	for i := range ids {
		require.Equal(t, pattern(cfg.BlockSize(), 40+uint64(ids[i])), f.readBlock(dev, dst[i]))
	}
	// Disk to disk through the same bounce.
	disk2 := f.alloc(storage.Disk, cfg, FullyContiguous)
	require.NoError(t, f.transfer(disk, ids, disk2, dst, Options{Bounce: &Bounce{Handle: bounce, BlockIDs: []int{1}}}))
	require.Equal(t, pattern(cfg.BlockSize(), 46), f.readBlock(disk2, 1))

	_, err := f.m.ExecuteTransfer(disk, ids, dev, dst, Options{Bounce: &Bounce{Handle: sys, BlockIDs: []int{0}}})
	require.ErrorContains(t, err, "must be pinned")
	_, err = f.m.ExecuteTransfer(disk, ids, dev, dst, Options{Bounce: &Bounce{Handle: bounce, BlockIDs: []int{3}}})
	require.ErrorContains(t, err, "bounce block id 3 (index 0) out of range [0, 3)")
	_, err = f.m.ExecuteTransfer(disk, ids, dev, dst, Options{Bounce: &Bounce{Handle: bounce}})
	require.ErrorContains(t, err, "no block ids")
}

// Transfers issued from several goroutines at once into the device, each
// waited for before the next: every block arrives. Over the CUDA double
// (make test-cuda-double) this found two launches of the real backend's
// copy kernel sharing one set of argument tables: a set being filled still
// carried its previous launch's completed event, and a second caller took
// it as free.
func TestTransfersFromSeveralGoroutinesAtOnce(t *testing.T) {
	f := newFixture(t)
	const blocks, goroutines = 8, 4
	cfg := smallConfig(blocks)
	src := f.alloc(storage.Pinned, cfg, FullyContiguous)
	dev := f.alloc(storage.Device, cfg, shapes["ls-second"])
	for round := range 10 {
		f.fill(src, uint64(100*round))
		f.fill(dev, 9999)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := g; i < blocks; i += goroutines {
					n, err := f.m.ExecuteTransfer(src, []int{i}, dev, []int{blocks - 1 - i}, Options{})
					if assert.NoError(t, err) {
						assert.NoError(t, n.WaitTimeout(-1))
					}
				}
			})
		}
		wg.Wait()
		for i := range blocks {
			require.Equal(t, pattern(cfg.BlockSize(), uint64(100*round+i)), f.readBlock(dev, blocks-1-i),
				"round %d, source block %d", round, i)
		}
	}
}

// Many transfers in flight at once, each with its own notification; none is
// dropped, every block arrives.
func TestThousandsInFlight(t *testing.T) {
	f := newFixture(t)
	const blocks = 1200
	cfg := smallConfig(blocks)
	host := f.alloc(storage.Pinned, cfg, FullyContiguous)
	dev := f.alloc(storage.Device, cfg, shapes["ls-second"])
	back := f.alloc(storage.System, cfg, FullyContiguous)
	hb, _ := f.m.lookup(host)
	mem := storage.HostBytes(hb.layout.Regions()[0].Addr, hb.layout.Regions()[0].Size)
	for id := range blocks {
		copy(mem[id*cfg.BlockSize():], pattern(cfg.BlockSize(), uint64(id)))
	}
	var ns []*Notification
	for id := range blocks {
		n, err := f.m.ExecuteTransfer(host, []int{id}, dev, []int{blocks - 1 - id}, Options{})
		require.NoError(t, err)
		ns = append(ns, n)
	}
	require.NoError(t, Aggregate(ns...).WaitTimeout(-1))
	ns = ns[:0]
	pinnedBack := f.alloc(storage.Pinned, cfg, FullyContiguous)
	for id := range blocks {
		n, err := f.m.ExecuteTransfer(dev, []int{id}, pinnedBack, []int{id}, Options{})
		require.NoError(t, err)
		ns = append(ns, n)
	}
	require.NoError(t, Aggregate(ns...).WaitTimeout(-1))
	all := make([]int, blocks)
	for i := range all {
		all[i] = i
	}
	require.NoError(t, f.transfer(pinnedBack, all, back, all, Options{}))
	be, _ := f.m.lookup(back)
	out := storage.HostBytes(be.layout.Regions()[0].Addr, be.layout.Regions()[0].Size)
	for id := range blocks {
		require.True(t, bytes.Equal(pattern(cfg.BlockSize(), uint64(blocks-1-id)), out[id*cfg.BlockSize():(id+1)*cfg.BlockSize()]), "block %d", id)
	}
}

// A completed notification reports its result even with a zero timeout
// or an ended context: completion wins every race with the timer.
func TestCompletedNotificationWinsOverTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 200 {
		n := completed(nil)
		require.NoError(t, n.WaitTimeout(0))
		require.NoError(t, n.Wait(ctx))
	}
}

func TestNotificationWaitTimeoutAndAggregateErrors(t *testing.T) {
	n := newNotification()
	err := n.WaitTimeout(time.Millisecond)
	require.ErrorIs(t, err, ErrTimeout)
	done, err := n.Poll()
	require.False(t, done)
	require.NoError(t, err)
	a := newNotification()
	agg := Aggregate(n, a)
	n.complete(&Error{FailedBlocks: []int{4, 2}, Err: errors.New("x")})
	n.complete(nil) // only the first completion counts
	a.complete(nil)
	require.ErrorContains(t, agg.WaitTimeout(-1), "x")
	require.Equal(t, []int{2, 4}, agg.FailedBlocks())
	require.Error(t, n.WaitTimeout(0))
}

var _ = layout.FullyContiguous

// Blocks adjacent on both sides go to disk in one request each way, and a
// request that fails is retried block by block, so that only the failing
// blocks are named.
func TestDiskRequestsAreCoalesced(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(16)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g3 := f.alloc(storage.Disk, cfg, FullyContiguous)
	back := f.alloc(storage.Pinned, cfg, FullyContiguous)
	f.fill(g2, 40)
	var mu sync.Mutex
	requests := map[string]int{}
	diskOf(t, f.m, g3).SetFaultInjector(func(op string, off int64, n int) error {
		mu.Lock()
		defer mu.Unlock()
		requests[op]++
		return nil
	})
	require.NoError(t, f.transfer(g2, []int{0, 1, 2, 3, 4, 5}, g3, []int{8, 9, 10, 11, 12, 13}, Options{}))
	require.NoError(t, f.transfer(g3, []int{8, 9, 10, 11, 12, 13}, back, []int{0, 1, 2, 3, 4, 5}, Options{}))
	require.Equal(t, map[string]int{"write": 1, "read": 1}, requests)
	for b := range 6 {
		require.Equal(t, pattern(cfg.BlockSize(), 40+uint64(b)), f.readBlock(back, b))
	}

	clear(requests)
	require.NoError(t, f.transfer(g2, []int{0, 1, 7, 3}, g3, []int{0, 1, 2, 5}, Options{}))
	require.Equal(t, map[string]int{"write": 3}, requests, "0-1 together; 7->2 and 3->5 alone")
}
