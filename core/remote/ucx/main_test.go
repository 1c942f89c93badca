//go:build cgo

package ucx

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// EnvRequire makes a test that finds no usable UCX fail instead of skip
// (CI sets it; make test installs libucx0).
const envRequire = "KVBM_REQUIRE_UCX"

func needUCX(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv(envRequire) == "1" {
			t.Fatalf("%s=1 and UCX is unavailable: %v", envRequire, err)
		}
		t.Skipf("UCX is unavailable (set %s=1 to fail instead): %v", envRequire, err)
	}
}

// smallConfig is a small KV shape: 512-byte fragments, 4 KiB blocks.
func smallConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 4, OuterDim: 2, PageSize: 4, InnerDim: 64, DtypeWidth: 2}
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

// newEmu is an emulated device closed after everything the test made
// later (t.Cleanup runs last in, first out).
func newEmu(t testing.TB) *cuda.Emulated {
	emu := cuda.NewEmulated(1)
	t.Cleanup(func() { require.NoError(t, emu.Close()) })
	return emu
}

// side is one worker: a manager on the emulated device and its UCX
// transport, closed in that order (transport first) at the end of the test.
type side struct {
	m  *transfer.Manager
	tr *Transport
}

func newSide(t testing.TB, emu *cuda.Emulated, id uint64, cfg Config, deadline time.Duration) *side {
	t.Helper()
	m, err := transfer.NewManager(transfer.Config{WorkerID: id, Driver: emu, HostWorkers: 2, RemoteDeadline: deadline, DiskDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	cfg.DeviceIsHost = true
	tr, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	require.NoError(t, tr.Serve(m))
	return &side{m: m, tr: tr}
}

func (s *side) alloc(t testing.TB, kind storage.Kind, cfg layout.Config, shape transfer.Shape) transfer.LayoutHandle {
	t.Helper()
	h, err := s.m.AllocateLayout(kind, cfg, shape)
	require.NoError(t, err)
	return h
}

// fill writes pattern(tag0+id) into every block of h.
func (s *side) fill(t testing.TB, h transfer.LayoutHandle, tag0 uint64) {
	t.Helper()
	bio, err := s.m.BlockIO(h)
	require.NoError(t, err)
	for id := 0; id < bio.NumBlocks(); id++ {
		require.NoError(t, bio.WriteBlock(id, pattern(bio.BlockSize(), tag0+uint64(id))))
	}
}

// check requires block id of h to hold pattern(tag).
func (s *side) check(t testing.TB, h transfer.LayoutHandle, id int, tag uint64) {
	t.Helper()
	require.NoError(t, s.checkErr(h, id, tag))
}

func (s *side) checkErr(h transfer.LayoutHandle, id int, tag uint64) error {
	bio, err := s.m.BlockIO(h)
	if err != nil {
		return err
	}
	got := make([]byte, bio.BlockSize())
	if err := bio.ReadBlock(id, got); err != nil {
		return err
	}
	want := pattern(bio.BlockSize(), tag)
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("layout %v block %d: byte %d is %#x, want %#x (tag %#x)", h, id, i, got[i], want[i], tag)
		}
	}
	return nil
}

// importAll connects to the exporter's endpoint and imports its layouts.
func (s *side) importAll(t testing.TB, exporter *side) *Peer {
	t.Helper()
	ep, err := exporter.tr.Endpoint()
	require.NoError(t, err)
	var descs []transfer.Descriptor
	for _, h := range exporter.m.Handles() {
		d, err := exporter.m.Describe(h)
		require.NoError(t, err)
		descs = append(descs, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := s.tr.Connect(ctx, ep)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	_, err = s.m.Import(p, descs)
	require.NoError(t, err)
	return p.(*Peer)
}

func seq(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

func move(t testing.TB, m *transfer.Manager, src transfer.LayoutHandle, srcIDs []int, dst transfer.LayoutHandle, dstIDs []int) error {
	t.Helper()
	n, err := m.ExecuteTransfer(src, srcIDs, dst, dstIDs, transfer.Options{})
	if err != nil {
		return err
	}
	return n.WaitTimeout(-1)
}
