package transfer

import (
	"encoding/binary"
	"os"
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
	drv cuda.Driver
	emu *cuda.Emulated // nil on the real driver
	m   *Manager
}

// testDriver is the emulated device, or the real driver when the run asks
// for it with KVBM_DEVICE=cuda (scripts/gpu-check.sh on a GPU machine).
func testDriver(t testing.TB) (cuda.Driver, *cuda.Emulated) {
	t.Helper()
	if os.Getenv(cuda.EnvDevice) == cuda.RealName {
		drv, err := cuda.Default()
		require.NoError(t, err)
		return drv, nil
	}
	emu := cuda.NewEmulated(1)
	t.Cleanup(func() { require.NoError(t, emu.Close()) })
	return emu, emu
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	drv, emu := testDriver(t)
	m, err := NewManager(Config{WorkerID: 0xA1, Driver: drv, DiskDir: t.TempDir(), HostWorkers: 2})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	return &fixture{t: t, drv: drv, emu: emu, m: m}
}

// needEmulated skips a test that needs the emulated device's hooks (fault
// injection, reading device memory from the host).
func (f *fixture) needEmulated() {
	if f.emu == nil {
		f.t.Skip("needs the emulated device's fault hook")
	}
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
