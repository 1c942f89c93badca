package cache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// tiers sizes a fixture: G1, G2 and G3 blocks (G3 0: none), and whether
// there is an object store.
type tiers struct {
	g1, g2, g3 int
	g4         bool
}

type fixture struct {
	t       *testing.T
	emu     *cuda.Emulated
	w       *worker.PhysicalWorker
	c       *Cache
	diskDir string
	objDir  string
}

// small blocks: 3 layers, K and V, 4 tokens of 32 bf16 values: 1,536 bytes
// in 12 fragments of 128.
func shape(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 3, OuterDim: 2, PageSize: 4, InnerDim: 32, DtypeWidth: 2}
}

func newFixture(t *testing.T, ts tiers, cfg Config) *fixture {
	t.Helper()
	f := &fixture{t: t, emu: cuda.NewEmulated(1), diskDir: t.TempDir()}
	m, err := transfer.NewManager(transfer.Config{WorkerID: 7, Driver: f.emu, DiskDir: f.diskDir})
	require.NoError(t, err)
	pc := worker.PhysicalConfig{Manager: m}
	if ts.g4 {
		f.objDir = t.TempDir()
		store, err := object.NewFSStore(object.FSConfig{Dir: f.objDir})
		require.NoError(t, err)
		pc.Objects = store
	}
	f.w, err = worker.NewPhysical(pc)
	require.NoError(t, err)
	// G1 is the engine's: one device region per layer, vLLM's shape.
	g1Shape := transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}
	sizes, err := layout.RegionSizes(shape(ts.g1), g1Shape.Kind, g1Shape.BlockDim)
	require.NoError(t, err)
	var ptrs []uint64
	var mems []*storage.Memory
	for _, s := range sizes {
		mem, err := storage.AllocDevice(f.emu, 0, s)
		require.NoError(t, err)
		mems = append(mems, mem)
		ptrs = append(ptrs, mem.Addr())
	}
	_, err = f.w.RegisterG1(shape(ts.g1), g1Shape, ptrs)
	require.NoError(t, err)
	_, err = f.w.AllocateG2(shape(ts.g2), transfer.FullyContiguous)
	require.NoError(t, err)
	if ts.g3 > 0 {
		_, err = f.w.AllocateG3(shape(ts.g3), transfer.FullyContiguous)
		require.NoError(t, err)
	}
	cfg.Worker = f.w
	f.c, err = New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, f.c.Close())
		require.NoError(t, m.Close())
		for _, mem := range mems {
			require.NoError(t, mem.Close())
		}
		require.NoError(t, f.emu.Close())
	})
	return f
}

func key(i int) []byte { return []byte(fmt.Sprintf("prefix-hash-%04d", i)) }

func keyRange(from, n int) [][]byte {
	ks := make([][]byte, n)
	for i := range ks {
		ks[i] = key(from + i)
	}
	return ks
}

func seq(from, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = from + i
	}
	return ids
}

// content is the bytes of the KV of key i: every 8 bytes name the key and
// the offset, so a misplaced or stale block shows.
func content(i int) []byte {
	b := make([]byte, shape(1).BlockSize())
	for off := 0; off+8 <= len(b); off += 8 {
		binary.LittleEndian.PutUint64(b[off:], uint64(i+1)<<32|uint64(off))
	}
	return b
}

func (f *fixture) bio(t worker.Tier) *transfer.BlockIO {
	h := f.w.Handles()
	var lh *transfer.LayoutHandle
	switch t {
	case worker.G1:
		lh = h.G1
	case worker.G2:
		lh = h.G2
	case worker.G3:
		lh = h.G3
	}
	b, err := f.w.Manager().BlockIO(*lh)
	require.NoError(f.t, err)
	return b
}

// compute writes key i's KV into G1 block id, as a forward pass would.
func (f *fixture) compute(id, i int) {
	require.NoError(f.t, f.bio(worker.G1).WriteBlock(id, content(i)))
}

func (f *fixture) block(t worker.Tier, id int) []byte {
	b := make([]byte, shape(1).BlockSize())
	require.NoError(f.t, f.bio(t).ReadBlock(id, b))
	return b
}

// clearG1 zeroes every G1 block.
func (f *fixture) clearG1() {
	zero := make([]byte, shape(1).BlockSize())
	bio := f.bio(worker.G1)
	for id := range bio.NumBlocks() {
		require.NoError(f.t, bio.WriteBlock(id, zero))
	}
}

// offload computes keys [from, from+n) into G1 blocks g1 and offloads them,
// waiting for the result.
func (f *fixture) offload(from int, g1 []int) []pool.Decision {
	f.t.Helper()
	for j, id := range g1 {
		f.compute(id, from+j)
	}
	n, ds, err := f.c.Offload(keyRange(from, len(g1)), g1, 0)
	require.NoError(f.t, err)
	require.NoError(f.t, n.WaitTimeout(10*time.Second))
	return ds
}

// quiesce waits for the cache's background work (write-through).
func (f *fixture) quiesce() {
	f.c.inflight.Wait()
}

func (f *fixture) requireLoaded(g1 []int, from int) {
	f.t.Helper()
	for j, id := range g1 {
		requireContent(f.t, from+j, f.block(worker.G1, id), "G1 block %d", id)
	}
}

// requireContent checks every byte of a block against key i's KV, and
// says briefly what is there instead.
func requireContent(t *testing.T, i int, got []byte, msg string, args ...any) {
	t.Helper()
	want := content(i)
	if bytes.Equal(want, got) {
		return
	}
	for off := range want {
		if want[off] != got[off] {
			w := off &^ 7
			t.Fatalf("%s: want key %d; byte %d differs: word %x, want %x", fmt.Sprintf(msg, args...), i, off,
				got[w:w+8], want[w:w+8])
		}
	}
}

func (f *fixture) requireZero(g1 ...int) {
	f.t.Helper()
	zero := make([]byte, shape(1).BlockSize())
	for _, id := range g1 {
		require.Equal(f.t, zero, f.block(worker.G1, id), "G1 block %d must be untouched", id)
	}
}

func tiersOf(ts ...worker.Tier) []worker.Tier { return ts }

func repeat(t worker.Tier, n int) []worker.Tier {
	out := make([]worker.Tier, n)
	for i := range out {
		out[i] = t
	}
	return out
}
