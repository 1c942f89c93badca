package transfer

import (
	"encoding/binary"
	"testing"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

// smallConfig is a small KV shape: 512-byte fragments, 4 KiB blocks.
func smallConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 4, OuterDim: 2, PageSize: 4, InnerDim: 64, DtypeWidth: 2}
}

var shapes = map[string]Shape{
	"fc":        FullyContiguous,
	"ls-first":  {Kind: layout.LayerSeparate, BlockDim: layout.BlockIsFirstDim},
	"ls-second": {Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim},
}

var kinds = []storage.Kind{storage.System, storage.Pinned, storage.Device, storage.Disk}

type fixture struct {
	t   *testing.T
	emu *cuda.Emulated
	m   *Manager
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	emu := cuda.NewEmulated(1)
	m, err := NewManager(Config{WorkerID: 0xA1, Driver: emu, DiskDir: t.TempDir(), HostWorkers: 2})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, m.Close())
		require.NoError(t, emu.Close())
	})
	return &fixture{t: t, emu: emu, m: m}
}

func (f *fixture) alloc(kind storage.Kind, cfg layout.Config, shape Shape) LayoutHandle {
	f.t.Helper()
	h, err := f.m.AllocateLayout(kind, cfg, shape)
	require.NoError(f.t, err)
	return h
}

// pattern is the content of a block tagged with tag: every 8 bytes hold
// tag, then the byte offset, so that a misplaced fragment shows.
func pattern(size int, tag uint64) []byte {
	b := make([]byte, size)
	for off := 0; off+8 <= size; off += 8 {
		binary.LittleEndian.PutUint64(b[off:], tag<<32|uint64(off))
	}
	return b
}

func (f *fixture) writeBlock(h LayoutHandle, id int, data []byte) {
	f.t.Helper()
	bio, err := f.m.BlockIO(h)
	require.NoError(f.t, err)
	require.NoError(f.t, bio.WriteBlock(id, data))
}

func (f *fixture) readBlock(h LayoutHandle, id int) []byte {
	f.t.Helper()
	bio, err := f.m.BlockIO(h)
	require.NoError(f.t, err)
	out := make([]byte, bio.BlockSize())
	require.NoError(f.t, bio.ReadBlock(id, out))
	return out
}

// fill writes pattern(tag0+id) into every block of h.
func (f *fixture) fill(h LayoutHandle, tag0 uint64) {
	l, _, err := f.m.Layout(h)
	require.NoError(f.t, err)
	for id := range l.Config().NumBlocks {
		f.writeBlock(h, id, pattern(l.Config().BlockSize(), tag0+uint64(id)))
	}
}

func (f *fixture) transfer(src LayoutHandle, srcIDs []int, dst LayoutHandle, dstIDs []int, opts Options) error {
	f.t.Helper()
	n, err := f.m.ExecuteTransfer(src, srcIDs, dst, dstIDs, opts)
	require.NoError(f.t, err)
	return n.WaitTimeout(-1)
}
