//go:build cgo

package ucx

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/stretchr/testify/require"
)

var tlsCases = []struct {
	name string
	opts map[string]string
}{
	{"default", nil},
	{"tcp", map[string]string{"TLS": "tcp"}},
}

// Two managers of one process over UCX: blocks pulled from and pushed to
// the exporter's pinned (G2) and emulated device (G1) layouts of both
// shapes, into the importer's pinned and device layouts; every byte
// checked, and the blocks not moved must stay as they were.
func TestRoundTripBetweenTwoManagers(t *testing.T) {
	needUCX(t)
	shapes := map[string]transfer.Shape{
		"fc":       transfer.FullyContiguous,
		"ls-first": {Kind: layout.LayerSeparate, BlockDim: layout.BlockIsFirstDim},
	}
	for _, tc := range tlsCases {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{OneSided: true, Options: tc.opts}, 10*time.Second)
			imp := newSide(t, emu, 0x1, Config{OneSided: true, Options: tc.opts}, 10*time.Second)
			const blocks = 8
			cfg := smallConfig(blocks)
			type remoteLayout struct {
				name string
				h    transfer.LayoutHandle
			}
			var remotes []remoteLayout
			tag := uint64(0x100)
			for _, kind := range []storage.Kind{storage.Pinned, storage.Device} {
				for sname, shape := range shapes {
					h := exp.alloc(t, kind, cfg, shape)
					exp.fill(t, h, tag)
					remotes = append(remotes, remoteLayout{fmt.Sprintf("%v-%s", kind, sname), h})
					tag += 0x100
				}
			}
			p := imp.importAll(t, exp)
			lanes, err := p.Lanes()
			require.NoError(t, err)
			t.Logf("UCX endpoint:\n%s", lanes)

			tag = 0x100
			for _, r := range remotes {
				for _, kind := range []storage.Kind{storage.Pinned, storage.Device} {
					t.Run(fmt.Sprintf("%s-to-%v", r.name, kind), func(t *testing.T) {
						local := imp.alloc(t, kind, cfg, transfer.FullyContiguous)
						defer func() { require.NoError(t, imp.m.Unregister(local)) }()
						imp.fill(t, local, 0x9000)
						// Pull blocks 1..5 of the remote into 2..6 here.
						require.NoError(t, move(t, imp.m, r.h, seq(1, 6), local, seq(2, 7)))
						for id := 0; id < blocks; id++ {
							want := 0x9000 + uint64(id)
							if id >= 2 && id < 7 {
								want = tag + uint64(id-1)
							}
							imp.check(t, local, id, want)
						}
						// Push blocks 0, 1 and 7 of local (not pulled over) into 5..7 of the remote.
						require.NoError(t, move(t, imp.m, local, []int{0, 1, 7}, r.h, seq(5, 8)))
						for id, want := range []uint64{tag, tag + 1, tag + 2, tag + 3, tag + 4, 0x9000, 0x9001, 0x9007} {
							exp.check(t, r.h, id, want)
						}
						exp.fill(t, r.h, tag) // as it was, for the next case
					})
				}
				tag += 0x100
			}
		})
	}
}

// The bytes in flight on an endpoint stay under Config.MaxInFlight (or one
// operation, when it is larger).
func TestBytesInFlightAreBounded(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	const limit = 16 << 10
	opts := map[string]string{"TLS": "tcp"} // operations stay in flight until the exporter answers
	exp := newSide(t, emu, 0xE, Config{OneSided: true, Options: opts}, 10*time.Second)
	imp := newSide(t, emu, 0x1, Config{OneSided: true, Options: opts, MaxInFlight: limit}, 10*time.Second)
	cfg := smallConfig(64) // 4 KiB blocks, 512-byte fragments
	src := exp.alloc(t, storage.Pinned, cfg, transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsFirstDim})
	exp.fill(t, src, 0x40)
	p := imp.importAll(t, exp)
	dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
	require.NoError(t, move(t, imp.m, src, seq(0, 64), dst, seq(0, 64)))
	for id := 0; id < 64; id++ {
		imp.check(t, dst, id, 0x40+uint64(id))
	}
	peak := p.peak.Load()
	require.Positive(t, peak)
	require.LessOrEqual(t, peak, int64(limit), "bytes in flight")
}

// A deadline that passes fails the operation with ErrPeerUnavailable and
// ErrTimeout in about the deadline; the peer then fails later calls at
// once, and connecting again works.
func TestDeadlineFailsTheOperationAndThePeer(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	// Over TCP the exporter's worker serves the reads, so freezing its
	// progress thread freezes the peer.
	opts := map[string]string{"TLS": "tcp"}
	exp := newSide(t, emu, 0xE, Config{OneSided: true, Options: opts}, time.Second)
	const deadline = 300 * time.Millisecond
	imp := newSide(t, emu, 0x1, Config{OneSided: true, Options: opts}, deadline)
	cfg := smallConfig(8)
	src := exp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
	exp.fill(t, src, 0x70)
	imp.importAll(t, exp)
	dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
	require.NoError(t, move(t, imp.m, src, seq(0, 2), dst, seq(0, 2)))

	thaw := freeze(t, exp.tr)
	start := time.Now()
	err := move(t, imp.m, src, seq(2, 8), dst, seq(2, 8))
	took := time.Since(start)
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorIs(t, err, transfer.ErrTimeout)
	require.GreaterOrEqual(t, took, deadline)
	require.Less(t, took, deadline+200*time.Millisecond, "the deadline is %v", deadline)

	start = time.Now()
	err = move(t, imp.m, src, seq(0, 1), dst, seq(0, 1))
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.Less(t, time.Since(start), 50*time.Millisecond, "a failed peer fails later calls at once")
	thaw()

	// Importing the metadata again reconnects.
	imp.importAll(t, exp)
	require.NoError(t, move(t, imp.m, src, seq(2, 8), dst, seq(2, 8)))
	for id := 0; id < 8; id++ {
		imp.check(t, dst, id, 0x70+uint64(id))
	}
}

// freeze stops tr's progress thread until the returned function is called.
func freeze(t testing.TB, tr *Transport) (thaw func()) {
	frozen, release := make(chan struct{}), make(chan struct{})
	require.True(t, tr.post(func() { close(frozen); <-release }))
	<-frozen
	return sync1(func() { close(release) })
}

func sync1(fn func()) func() {
	done := false
	return func() {
		if !done {
			done = true
			fn()
		}
	}
}

// A closed peer fails at once; an exporter whose transport closes makes
// the importer's peer fail soon (its endpoint sees the connection go).
func TestClosedPeersFail(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{OneSided: true, Options: tc.opts}, time.Second)
			imp := newSide(t, emu, 0x1, Config{OneSided: true, Options: tc.opts}, time.Second)
			cfg := smallConfig(4)
			src := exp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			exp.fill(t, src, 0x30)
			dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)

			p := imp.importAll(t, exp)
			require.NoError(t, p.Close())
			start := time.Now()
			err := move(t, imp.m, src, seq(0, 1), dst, seq(0, 1))
			require.ErrorIs(t, err, remote.ErrPeerUnavailable)
			require.ErrorContains(t, err, "the peer was closed")
			require.Less(t, time.Since(start), 50*time.Millisecond)

			imp.importAll(t, exp)
			require.NoError(t, move(t, imp.m, src, seq(0, 4), dst, seq(0, 4)))
			require.NoError(t, exp.tr.Close())
			start = time.Now()
			for {
				err = move(t, imp.m, src, seq(0, 4), dst, seq(0, 4))
				if err != nil {
					break
				}
				// Until the endpoint learns of the close, reads still
				// see the exporter's memory (the manager is open).
				for id := 0; id < 4; id++ {
					imp.check(t, dst, id, 0x30+uint64(id))
				}
				require.Less(t, time.Since(start), 2*time.Second, "the exporter's close was not noticed")
				time.Sleep(5 * time.Millisecond)
			}
			require.ErrorIs(t, err, remote.ErrPeerUnavailable)
			t.Logf("noticed in %v: %v", time.Since(start), err)
		})
	}
}

// Endpoints that do not parse, or carry damaged rkeys, are refused with
// ErrBadEndpoint and never reach UCX unchecked.
func TestBadEndpoints(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{OneSided: true}, time.Second)
	imp := newSide(t, emu, 0x1, Config{OneSided: true}, time.Second)
	exp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	ctx := context.Background()

	for _, bad := range [][]byte{nil, []byte("nonsense"), ep[:len(ep)/2], ep[:len(ep)-1], append(append([]byte{}, ep...), 0)} {
		_, err := imp.tr.Connect(ctx, bad)
		require.ErrorIs(t, err, remote.ErrBadEndpoint, "%d bytes", len(bad))
	}
	flipped := append([]byte{}, ep...)
	flipped[len(flipped)-3] ^= 0x40
	_, err = imp.tr.Connect(ctx, flipped)
	require.ErrorIs(t, err, remote.ErrBadEndpoint)
	require.ErrorContains(t, err, "checksum")

	// A truncated rkey inside an endpoint that is otherwise well formed.
	info, err := decodeEndpoint(ep)
	require.NoError(t, err)
	require.Len(t, info.layouts, 1)
	rk := info.layouts[0].regions[0].rkey
	for _, n := range []int{1, len(rk) / 2, len(rk) - 1} {
		if n == len(rk)-1 && checkRkey(rk[:n]) == nil {
			continue // UCX 1.20+ without its device byte: an older UCX's key, read with the padding's
		}
		info.layouts[0].regions[0].rkey = rk[:n]
		p, err := imp.tr.Connect(ctx, info.encode())
		if err == nil {
			require.NoError(t, p.Close())
		}
		require.ErrorIs(t, err, remote.ErrBadEndpoint, "rkey truncated to %d of %d bytes", n, len(rk))
	}
	_, err = (&Transport{}).Endpoint()
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
}

// A layout registered after the endpoint was published is not attached
// until the metadata is exported again; descriptors that do not match the
// endpoint are refused.
func TestAttachChecksTheEndpoint(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{OneSided: true}, time.Second)
	imp := newSide(t, emu, 0x1, Config{OneSided: true}, time.Second)
	a := exp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	b := exp.alloc(t, storage.Device, smallConfig(4), transfer.FullyContiguous)
	p, err := imp.tr.Connect(context.Background(), ep)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	da, err := exp.m.Describe(a)
	require.NoError(t, err)
	db, err := exp.m.Describe(b)
	require.NoError(t, err)
	_, err = p.Attach(da)
	require.NoError(t, err)
	_, err = p.Attach(db)
	require.ErrorIs(t, err, transfer.ErrNotFound)
	require.ErrorContains(t, err, "export and import it again")
	wrong := da
	wrong.Bases = []uint64{da.Bases[0] + 4096}
	_, err = p.Attach(wrong)
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	wrong = da
	wrong.Config.NumBlocks++
	_, err = p.Attach(wrong)
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)

	// A disk layout is listed with why peers cannot reach it.
	disk := exp.alloc(t, storage.Disk, smallConfig(4), transfer.FullyContiguous)
	ep, err = exp.tr.Endpoint()
	require.NoError(t, err)
	p2, err := imp.tr.Connect(context.Background(), ep)
	require.NoError(t, err)
	defer func() { require.NoError(t, p2.Close()) }()
	dd, err := exp.m.Describe(disk)
	require.NoError(t, err)
	_, err = p2.Attach(dd)
	require.ErrorIs(t, err, transfer.ErrUnsupported)
	require.ErrorContains(t, err, "stage its blocks in host memory")
	_, err = p2.Attach(db)
	require.NoError(t, err, "a layout registered before this endpoint was exported")
}

// Without DeviceIsHost, device layouts are registered as CUDA memory:
// Debian's UCX has no CUDA support, so the endpoint carries why and
// attaching fails with it, while host layouts work.
func TestDeviceMemoryNeedsCUDAEnabledUCX(t *testing.T) {
	needUCX(t)
	if os.Getenv(EnvLib) != "" {
		t.Skipf("%s names another libucp, which may support CUDA", EnvLib)
	}
	emu := newEmu(t)
	m, err := transfer.NewManager(transfer.Config{WorkerID: 0xE, Driver: emu})
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	tr, err := New(Config{OneSided: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	require.NoError(t, tr.Serve(m))
	h, err := m.AllocateLayout(storage.Device, smallConfig(2), transfer.FullyContiguous)
	require.NoError(t, err)
	ep, err := tr.Endpoint()
	require.NoError(t, err)
	imp, err := New(Config{OneSided: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, imp.Close()) }()
	p, err := imp.Connect(context.Background(), ep)
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	d, err := m.Describe(h)
	require.NoError(t, err)
	_, err = p.Attach(d)
	if err == nil {
		t.Skip("this libucp registered the memory as CUDA memory (a CUDA-enabled build)")
	}
	require.ErrorIs(t, err, transfer.ErrUnsupported)
	require.ErrorContains(t, err, "CUDA-enabled libucp")
}

// A transport serves one manager, and a closed transport refuses work.
func TestServeAndClose(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	s := newSide(t, emu, 0xE, Config{OneSided: true}, time.Second)
	other, err := transfer.NewManager(transfer.Config{WorkerID: 0xF, Driver: emu})
	require.NoError(t, err)
	defer func() { require.NoError(t, other.Close()) }()
	require.ErrorIs(t, s.tr.Serve(other), transfer.ErrAlreadyExists)
	ep, err := s.tr.Endpoint()
	require.NoError(t, err)
	require.NoError(t, s.tr.Close())
	require.NoError(t, s.tr.Close())
	_, err = s.tr.Endpoint()
	require.ErrorContains(t, err, "closed")
	_, err = s.tr.Connect(context.Background(), ep)
	require.ErrorContains(t, err, "closed")
	_, err = New(Config{OneSided: true, Options: map[string]string{"RNDV_THRESH": "lots"}})
	require.ErrorContains(t, err, "RNDV_THRESH")
}

// The Go runtime still owns SIGSEGV once libucp is loaded: a nil
// dereference panics and is recovered (UCX_ERROR_SIGNALS is cleared).
func TestGoKeepsItsSignalHandlers(t *testing.T) {
	needUCX(t)
	tr, err := New(Config{OneSided: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	var p *int
	require.Panics(t, func() { _ = *p })
}

// A layout over memory the transport allocated (AllocHost) is served like
// any other: pulled and pushed, every byte checked; the memory is released
// after its layout is unregistered, and a second Close does nothing.
func TestAllocHost(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{OneSided: true}, 10*time.Second)
	imp := newSide(t, emu, 0x1, Config{OneSided: true}, 10*time.Second)
	cfg := smallConfig(8)
	sizes, err := layout.RegionSizes(cfg, layout.FullyContiguous, 0)
	require.NoError(t, err)
	mem, err := exp.tr.AllocHost(sizes[0])
	require.NoError(t, err)
	require.GreaterOrEqual(t, mem.Size(), sizes[0])
	src, err := exp.m.RegisterExternal(storage.System, cfg, transfer.FullyContiguous, []uint64{mem.Addr()})
	require.NoError(t, err)
	exp.fill(t, src, 0x60)
	imp.importAll(t, exp)
	dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
	require.NoError(t, move(t, imp.m, src, seq(0, 8), dst, []int{7, 6, 5, 4, 3, 2, 1, 0}))
	for id := 0; id < 8; id++ {
		imp.check(t, dst, 7-id, 0x60+uint64(id))
	}
	imp.fill(t, dst, 0x80)
	require.NoError(t, move(t, imp.m, dst, seq(0, 4), src, seq(4, 8)))
	for id, want := range []uint64{0x60, 0x61, 0x62, 0x63, 0x80, 0x81, 0x82, 0x83} {
		exp.check(t, src, id, want)
	}
	require.NoError(t, exp.m.Unregister(src))
	require.NoError(t, mem.Close())
	require.NoError(t, mem.Close())
	// Memory left allocated is released by the transport's Close.
	_, err = exp.tr.AllocHost(1 << 20)
	require.NoError(t, err)
}

// KVBM_TRANSPORT=ucx opens in the message mode; its one-sided mode is
// refused, saying why, until the late writes are accepted
// (EnvAcceptLateWrites); New itself is not.
func TestSelectingUCXIsRefusedUntilLateWritesAreAccepted(t *testing.T) {
	needUCX(t)
	t.Setenv(EnvAcceptLateWrites, "")
	t.Setenv(EnvOneSided, "")
	tr, err := remote.Open("ucx", remote.OpenOptions{})
	require.NoError(t, err, "the message mode needs nothing accepted")
	require.False(t, tr.(*Transport).cfg.OneSided)
	require.NoError(t, tr.Close())

	t.Setenv(EnvOneSided, "1")
	_, err = remote.Open("ucx", remote.OpenOptions{})
	require.ErrorIs(t, err, ErrLateWrites)
	require.ErrorContains(t, err, "transport ucx: the UCX transport's one-sided mode is refused")
	require.ErrorContains(t, err, EnvAcceptLateWrites+"=1")
	require.ErrorIs(t, remote.Status()["ucx"], ErrLateWrites, "the info command says why")

	t.Setenv(EnvAcceptLateWrites, "1")
	tr, err = remote.Open("ucx", remote.OpenOptions{})
	require.NoError(t, err)
	require.True(t, tr.(*Transport).cfg.OneSided)
	require.Equal(t, "ucx", tr.Name())
	require.NoError(t, tr.Close())
}
