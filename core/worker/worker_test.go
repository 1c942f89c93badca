package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"testing"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

func testConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 3, OuterDim: 2, PageSize: 4, InnerDim: 32, DtypeWidth: 2}
}

var lsSecond = transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}

func pattern(size int, tag uint64) []byte {
	b := make([]byte, size)
	for off := 0; off+8 <= size; off += 8 {
		binary.LittleEndian.PutUint64(b[off:], tag<<32|uint64(off))
	}
	return b
}

type testWorker struct {
	*PhysicalWorker
	g1mem []*storage.Memory
}

// newWorker makes a worker whose G1 is "engine" device memory registered by
// pointer (one region per layer, vLLM's block-second shape), with G2, G3
// and an object store.
func newWorker(t *testing.T, drv cuda.Driver, id uint64, loop *remote.Loopback, store object.Store) *testWorker {
	t.Helper()
	m, err := transfer.NewManager(transfer.Config{WorkerID: id, Driver: drv, DiskDir: t.TempDir()})
	require.NoError(t, err)
	w, err := NewPhysical(PhysicalConfig{Manager: m, Objects: store, Loopback: loop})
	require.NoError(t, err)
	tw := &testWorker{PhysicalWorker: w, g1mem: registerEngineG1(t, w, drv, 8)}
	_, err = w.AllocateG2(testConfig(16), transfer.FullyContiguous)
	require.NoError(t, err)
	_, err = w.AllocateG3(testConfig(16), transfer.FullyContiguous)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, w.Close())
		require.NoError(t, m.Close())
		for _, mem := range tw.g1mem {
			require.NoError(t, mem.Close())
		}
	})
	return tw
}

func (w *testWorker) write(t *testing.T, tier Tier, id int, data []byte) {
	bio, err := w.m.BlockIO(*w.Handles().get(tier))
	require.NoError(t, err)
	require.NoError(t, bio.WriteBlock(id, data))
}

func (w *testWorker) read(t *testing.T, tier Tier, id int) []byte {
	bio, err := w.m.BlockIO(*w.Handles().get(tier))
	require.NoError(t, err)
	b := make([]byte, bio.BlockSize())
	require.NoError(t, bio.ReadBlock(id, b))
	return b
}

// registerEngineG1 registers "engine" device memory as G1: one region per
// layer, vLLM's block-second shape, like cudaMalloc'd tensors. The caller
// frees the memory after the worker closes.
func registerEngineG1(t *testing.T, w *PhysicalWorker, drv cuda.Driver, blocks int) []*storage.Memory {
	t.Helper()
	return registerEngineG1Of(t, w, drv, testConfig(blocks))
}

// registerEngineG1Of is registerEngineG1 of layout cfg.
func registerEngineG1Of(t *testing.T, w *PhysicalWorker, drv cuda.Driver, cfg layout.Config) []*storage.Memory {
	t.Helper()
	sizes, err := layout.RegionSizes(cfg, lsSecond.Kind, lsSecond.BlockDim)
	require.NoError(t, err)
	var mems []*storage.Memory
	var ptrs []uint64
	for _, s := range sizes {
		mem, err := storage.AllocDevice(drv, 0, s)
		require.NoError(t, err)
		mems = append(mems, mem)
		ptrs = append(ptrs, mem.Addr())
	}
	_, err = w.RegisterG1(cfg, lsSecond, ptrs)
	require.NoError(t, err)
	return mems
}

// waiter returns a function that checks a transfer started and succeeded,
// so that it can wrap a call: wait(w.ExecuteLocalTransfer(…)).
func waiter(t *testing.T) func(*transfer.Notification, error) {
	return func(n *transfer.Notification, err error) {
		t.Helper()
		require.NoError(t, err)
		require.NoError(t, n.WaitTimeout(-1))
	}
}

// newDriver is the emulated device, or the real driver when the run asks
// for it with KVBM_DEVICE=cuda (scripts/gpu-check.sh on a GPU machine).
func newDriver(t *testing.T) cuda.Driver {
	if os.Getenv(cuda.EnvDevice) == cuda.RealName {
		drv, err := cuda.Default()
		require.NoError(t, err)
		return drv
	}
	drv := cuda.NewEmulated(1)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	return drv
}

func TestPhysicalLocalTiersAndLayerwise(t *testing.T) {
	wait := waiter(t)
	drv := newDriver(t)
	w := newWorker(t, drv, 1, nil, nil)
	size := testConfig(1).BlockSize()
	for id := range 8 {
		w.write(t, G1, id, pattern(size, uint64(10+id)))
	}
	// Offload G1 -> G2 -> G3, clear G1, then bring back by two routes.
	wait(w.ExecuteLocalTransfer(G1, G2, []int{0, 1, 2, 3}, []int{8, 9, 10, 11}, transfer.Options{}))
	wait(w.ExecuteLocalTransfer(G2, G3, []int{8, 9, 10, 11}, []int{0, 1, 2, 3}, transfer.Options{}))
	for id := range 8 {
		w.write(t, G1, id, make([]byte, size))
	}
	wait(w.ExecuteLocalTransfer(G3, G1, []int{0, 1}, []int{0, 1}, transfer.Options{}))
	events := make([]cuda.Event, 3)
	for i := range events {
		ev, err := drv.EventCreate(0)
		require.NoError(t, err)
		events[i] = ev
		defer drv.EventDestroy(ev)
	}
	wait(w.ExecuteLayerwiseOnboard([]int{10, 11}, []int{2, 3}, events, nil))
	for _, ev := range events {
		done, err := drv.EventQuery(ev)
		require.NoError(t, err)
		require.True(t, done)
	}
	for id := range 4 {
		require.Equal(t, pattern(size, uint64(10+id)), w.read(t, G1, id), "block %d", id)
	}
	require.Equal(t, make([]byte, size), w.read(t, G1, 4))

	_, err := w.ExecuteLayerwiseOnboard([]int{1}, []int{1, 2}, events, nil)
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, "layer-wise onboard: invalid argument: 1 source block ids but 2 destination block ids")
	_, err = w.ExecuteLayerwiseOnboard([]int{1}, []int{2}, events[:2], nil)
	require.ErrorContains(t, err, "2 layer events given, the layout has 3 layers")
	_, err = w.ExecuteLocalTransfer(G4, G1, []int{0}, []int{0}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrUnsupported)
	_, err = w.AllocateG2(testConfig(4), transfer.FullyContiguous)
	require.ErrorIs(t, err, ErrAlreadyExists)

	bare, err := NewPhysical(PhysicalConfig{Manager: w.m})
	require.NoError(t, err)
	_, err = bare.ExecuteLocalTransfer(G2, G1, []int{0}, []int{0}, transfer.Options{})
	require.ErrorContains(t, err, "source layout G2 is not registered")
	_, err = bare.ExecuteLayerwiseOnboard([]int{0}, []int{0}, events, nil)
	require.ErrorContains(t, err, "G2 is not registered")
}

func TestMetadataRoundTrip(t *testing.T) {
	drv := newDriver(t)
	w := newWorker(t, drv, 0xBEEF, nil, nil)
	b, err := w.ExportMetadata()
	require.NoError(t, err)
	md, err := DecodeMetadata(b)
	require.NoError(t, err)
	require.Equal(t, uint64(0xBEEF), md.WorkerID)
	require.Len(t, md.Layouts, 3)
	for i, tier := range []Tier{G1, G2, G3} {
		l := md.Layouts[i]
		require.Equal(t, tier, l.Tier)
		want, err := w.m.Describe(*w.Handles().get(tier))
		require.NoError(t, err)
		require.Equal(t, want, l.Descriptor)
	}
	require.Equal(t, storage.Device, md.Layouts[0].Kind)
	require.Len(t, md.Layouts[0].Bases, 3)
	again, err := md.Encode()
	require.NoError(t, err)
	require.Equal(t, b, again)

	// Every truncation and every single-byte change is an error.
	for n := range len(b) {
		_, err := DecodeMetadata(b[:n])
		require.ErrorIs(t, err, ErrBadMetadata, "truncated to %d", n)
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		_, err := DecodeMetadata(c)
		require.ErrorIs(t, err, ErrBadMetadata, "byte %d changed", i)
	}
	_, err = DecodeMetadata(append(bytes.Clone(b), 0))
	require.ErrorIs(t, err, ErrBadMetadata)
}

func FuzzDecodeMetadata(f *testing.F) {
	md := Metadata{WorkerID: 7, Layouts: []LogicalDescriptor{{Tier: G2, Descriptor: transfer.Descriptor{
		Handle: transfer.LayoutHandle{Worker: 7, Layout: 1}, Kind: storage.Pinned, Config: testConfig(4),
		Shape: transfer.FullyContiguous, Bases: []uint64{4096}}}}}
	b, err := md.Encode()
	require.NoError(f, err)
	f.Add(b)
	md.Endpoints = []Endpoint{{Transport: "loopback", Address: make([]byte, 16)}, {Transport: "tcp", Address: []byte("\x01\x07\x00\x00\x00\x00\x00\x00\x00127.0.0.1:4000")}}
	b, err = md.Encode()
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte("KVBM"))
	f.Fuzz(func(t *testing.T, data []byte) {
		md, err := DecodeMetadata(data)
		if err != nil {
			return
		}
		again, err := md.Encode()
		require.NoError(t, err)
		require.Equal(t, data, again, "what decodes re-encodes to the same bytes")
	})
}

// Two workers in one process: export, import over the loopback transport,
// pull blocks from the remote's G2 and G1 into local tiers.
func TestRemoteTransferBetweenWorkers(t *testing.T) {
	wait := waiter(t)
	drv := newDriver(t)
	loop := remote.NewLoopback()
	prefill := newWorker(t, drv, 0xA, loop, nil)
	decode := newWorker(t, drv, 0xB, loop, nil)
	size := testConfig(1).BlockSize()
	for id := range 8 {
		prefill.write(t, G1, id, pattern(size, uint64(100+id)))
	}
	wait(prefill.ExecuteLocalTransfer(G1, G2, []int{0, 1, 2}, []int{0, 1, 2}, transfer.Options{}))
	md, err := prefill.ExportMetadata()
	require.NoError(t, err)

	require.ErrorContains(t, decode.ConnectRemote(1, nil), "exactly 1 metadata item, got 0")
	require.ErrorContains(t, decode.ConnectRemote(1, [][]byte{md, md}), "exactly 1 metadata item, got 2")
	require.ErrorIs(t, decode.ConnectRemote(1, [][]byte{md[:10]}), ErrBadMetadata)
	require.False(t, decode.HasRemoteMetadata(1))
	require.NoError(t, decode.ConnectRemote(1, [][]byte{md}))
	require.True(t, decode.HasRemoteMetadata(1))
	require.False(t, decode.HasRemoteMetadata(2))

	wait(decode.ExecuteRemoteOnboardForInstance(1, G2, []int{0, 1, 2}, G1, []int{7, 6, 5}, transfer.Options{}))
	wait(decode.ExecuteRemoteOnboardForInstance(1, G1, []int{3}, G2, []int{0}, transfer.Options{}))
	for i, d := range []int{7, 6, 5} {
		require.Equal(t, pattern(size, uint64(100+i)), decode.read(t, G1, d))
	}
	require.Equal(t, pattern(size, 103), decode.read(t, G2, 0))
	_, err = decode.ExecuteRemoteOnboardForInstance(2, G2, []int{0}, G1, []int{0}, transfer.Options{})
	require.ErrorContains(t, err, "no remote G2 handle for instance 2")

	// Own metadata is refused; a worker without transport cannot import.
	_, err = prefill.ImportMetadata(md)
	require.ErrorContains(t, err, "this worker's own")
	bare, err := NewPhysical(PhysicalConfig{Manager: decode.m})
	require.NoError(t, err)
	_, err = bare.ImportMetadata(md)
	require.ErrorContains(t, err, "no transport")

	// Offload into the remote's G2.
	g2, ok := decode.remote[remoteTier{1, G2}]
	require.True(t, ok)
	wait(decode.ExecuteRemoteOffload(G1, []int{7}, RemoteLayout(g2, []int{15}), transfer.Options{}))
	require.Equal(t, pattern(size, 100), prefill.read(t, G2, 15))
}

func TestCoordinatedWorker(t *testing.T) {
	wait := waiter(t)
	drv := newDriver(t)
	loop := remote.NewLoopback()
	prefill := newWorker(t, drv, 0xA, loop, nil)
	decode := newWorker(t, drv, 0xB, loop, nil)
	size := testConfig(1).BlockSize()
	for id := range 4 {
		prefill.write(t, G2, id, pattern(size, uint64(200+id)))
	}

	c := NewCoordinated(decode, 3, 0xD)
	require.Equal(t, 3, c.Rank())
	require.Equal(t, InstanceID(0xD), c.HostInstance())
	_, ok := c.Local(G1)
	require.False(t, ok)
	resp, err := decode.ExportMetadata()
	require.NoError(t, err)
	require.NoError(t, c.ApplyLayoutResponse(resp))
	require.NoError(t, c.ApplyLayoutResponse(resp), "the same response again is fine")
	g1, ok := c.Local(G1)
	require.True(t, ok)
	require.Equal(t, *decode.Handles().G1, g1)
	require.ErrorIs(t, c.SetLocal(G2, transfer.LayoutHandle{Worker: 0xB, Layout: 99}), ErrAlreadyExists)

	fresh := NewCoordinated(decode, 0, 0xD)
	require.NoError(t, fresh.SetLocal(G1, g1))
	require.ErrorContains(t, fresh.SetLocal(G1, g1), "G1 handle was already set")
	require.NoError(t, fresh.SetLocal(G3, transfer.LayoutHandle{Worker: 0xB, Layout: 77}))
	require.ErrorIs(t, fresh.ApplyLayoutResponse(resp), ErrAlreadyExists)
	_, ok = fresh.Local(G2)
	require.False(t, ok, "a refused response applies nothing")
	require.ErrorIs(t, c.ApplyLayoutResponse([]byte("junk")), ErrBadMetadata)

	const leader = InstanceID(0x9)
	_, err = c.TransferFromRemote(leader, 0, G2, []int{0}, G1, []int{0}, transfer.Options{})
	require.ErrorContains(t, err, "no metadata imported for leader 9 rank 0")
	md, err := prefill.ExportMetadata()
	require.NoError(t, err)
	require.NoError(t, c.ImportRemoteMetadata(leader, 0, md))
	require.True(t, c.HasRemoteMetadata(leader, 0))
	require.False(t, c.HasRemoteMetadata(leader, 1))
	h, ok := c.ResolveRemoteHandle(leader, 0, G2)
	require.True(t, ok)
	require.Equal(t, *prefill.Handles().G2, h)
	_, ok = c.ResolveRemoteHandle(leader, 1, G2)
	require.False(t, ok)

	wait(c.TransferFromRemote(leader, 0, G2, []int{0, 1, 2, 3}, G1, []int{4, 5, 6, 7}, transfer.Options{}))
	for i := range 4 {
		require.Equal(t, pattern(size, uint64(200+i)), decode.read(t, G1, 4+i))
	}
	_, err = c.TransferFromRemote(leader, 0, G2, []int{0, 1}, G1, []int{0}, transfer.Options{})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorIs(t, c.ImportRemoteMetadata(leader, 1, md[:20]), ErrBadMetadata)
}

func TestObjectTier(t *testing.T) {
	wait := waiter(t)
	drv := newDriver(t)
	dir := t.TempDir()
	store, err := object.NewFSStore(object.FSConfig{Dir: dir, HasRank: true, Rank: 2})
	require.NoError(t, err)
	w := newWorker(t, drv, 1, nil, store)
	c := NewCoordinated(w, 2, 1)
	size := testConfig(1).BlockSize()
	keys := make([]object.Key, 3)
	for i := range keys {
		keys[i], err = object.NewKey([]byte{byte(i), 0xAB})
		require.NoError(t, err)
		w.write(t, G2, i, pattern(size, uint64(300+i)))
	}
	ctx := context.Background()
	for _, p := range c.HasBlocks(ctx, keys) {
		require.False(t, p.Found)
	}
	for _, r := range c.PutBlocks(ctx, keys, G2, []int{0, 1, 2}) {
		require.NoError(t, r.Err)
	}
	for _, p := range c.HasBlocks(ctx, keys) {
		require.True(t, p.Found)
		require.Equal(t, int64(size), p.Size)
	}
	for _, r := range c.GetBlocks(ctx, keys, G1, []int{5, 6, 7}) {
		require.NoError(t, r.Err)
	}
	require.Equal(t, pattern(size, 301), w.read(t, G1, 6))
	// Through the remote descriptors, with one missing object.
	missing, _ := object.NewKey([]byte("missing"))
	n, err := w.ExecuteRemoteOnboard(RemoteObjects([]object.Key{keys[2], missing}), G3, []int{4, 5}, transfer.Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, object.ErrNotFound)
	require.ErrorContains(t, err, "1 of 2 blocks failed to download")
	require.Equal(t, []int{5}, n.FailedBlocks())
	require.Equal(t, pattern(size, 302), w.read(t, G3, 4))
	wait(w.ExecuteRemoteOffload(G3, []int{4}, RemoteObjects([]object.Key{missing}), transfer.Options{}))
	require.True(t, c.HasBlocks(ctx, []object.Key{missing})[0].Found)

	for _, r := range c.GetBlocks(ctx, keys, G4, []int{0, 1, 2}) {
		require.ErrorIs(t, r.Err, transfer.ErrUnsupported)
	}
	noStore := newWorker(t, drv, 2, nil, nil)
	for _, r := range noStore.PutBlocks(ctx, keys, G2, []int{0, 1, 2}) {
		require.ErrorContains(t, r.Err, "no object store configured")
	}
	require.False(t, noStore.HasBlocks(ctx, keys)[0].Found)
}

// An object file replaced by another key's object fails that block of an
// onboard as corrupt data, leaves its destination untouched, and is
// reported unusable by HasBlocks.
func TestObjectOfAnotherKeyFailsItsBlock(t *testing.T) {
	wait := waiter(t)
	drv := newDriver(t)
	store, err := object.NewFSStore(object.FSConfig{Dir: t.TempDir(), HasRank: true, Rank: 0})
	require.NoError(t, err)
	w := newWorker(t, drv, 1, nil, store)
	size := testConfig(1).BlockSize()
	keys := make([]object.Key, 3)
	for i := range keys {
		keys[i], err = object.NewKey([]byte{byte(i), 0xCD})
		require.NoError(t, err)
		w.write(t, G2, i, pattern(size, uint64(400+i)))
	}
	wait(w.ExecuteRemoteOffload(G2, []int{0, 1, 2}, RemoteObjects(keys), transfer.Options{}))
	a, err := os.ReadFile(store.Path(keys[0]))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(store.Path(keys[1]), a, 0o644))

	guard := pattern(size, 999)
	for id := 4; id < 7; id++ {
		w.write(t, G2, id, guard)
	}
	n, err := w.ExecuteRemoteOnboard(RemoteObjects(keys), G2, []int{4, 5, 6}, transfer.Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, object.ErrCorrupt)
	require.ErrorContains(t, err, "1 of 3 blocks failed to download")
	require.Equal(t, []int{5}, n.FailedBlocks())
	require.Equal(t, pattern(size, 400), w.read(t, G2, 4))
	require.Equal(t, guard, w.read(t, G2, 5), "the refused object's destination is untouched")
	require.Equal(t, pattern(size, 402), w.read(t, G2, 6))

	has := w.HasBlocks(context.Background(), keys)
	require.True(t, has[0].Found)
	require.False(t, has[1].Found)
	require.ErrorIs(t, has[1].Err, object.ErrCorrupt)
	require.True(t, has[2].Found)
}
