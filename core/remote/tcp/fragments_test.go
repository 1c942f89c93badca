package tcp

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var layerSeparate = transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}

// engineLayout registers host memory the exporter did not allocate (as an
// engine's KV cache is), as host memory or (kind Device) as the emulated
// device's memory, layer-separate with the block second, each region
// between guard bytes that nothing may write; check reports whether the
// guards are intact.
func engineLayout(t *testing.T, m *transfer.Manager, kind storage.Kind, cfg layout.Config) (h transfer.LayoutHandle, check func()) {
	t.Helper()
	const guard = 4096
	sizes, err := layout.RegionSizes(cfg, layerSeparate.Kind, layerSeparate.BlockDim)
	require.NoError(t, err)
	var ptrs []uint64
	var guards [][]byte
	for _, s := range sizes {
		mem, err := storage.AllocSystem(s + 2*guard)
		require.NoError(t, err)
		t.Cleanup(func() { mem.Close() })
		b, _ := mem.Bytes()
		for i := range b {
			b[i] = 0xEE
		}
		ptrs = append(ptrs, mem.Addr()+guard)
		guards = append(guards, b[:guard], b[guard+s:])
	}
	h, err = m.RegisterExternal(kind, cfg, layerSeparate, ptrs)
	require.NoError(t, err)
	return h, func() {
		for i, g := range guards {
			require.Equal(t, bytes.Repeat([]byte{0xEE}, guard), g, "guard %d around the engine's regions", i)
		}
	}
}

// Scattered fragments (layer-separate layouts, block second: each block
// is NumLayers × OuterDim ranges apart) move between every pair of the
// exporter's host layouts — engine memory, shared memory it allocated,
// contiguous or not — and host layouts here, both ways, on every route:
// same host copying process to process, same host where the kernel
// refuses that (the socket), and TCP. Blocks named side by side make
// ranges that join on one side, the other, or both; every byte of every
// block is checked, the blocks not named and the guards around the
// engine's memory must not change.
func TestScatteredFragmentsMoveEveryByte(t *testing.T) {
	for _, route := range []string{"process", "socket", "tcp"} {
		t.Run(route, func(t *testing.T) {
			if route == "socket" {
				old := reachProcess
				reachProcess = func(int, uint64) error { return unix.EPERM }
				t.Cleanup(func() { reachProcess = old })
			}
			p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: route == "tcp"})
			peer := p.peer.(*tcpPeer)
			engine, guardsIntact := engineLayout(t, p.exp, storage.System, p.cfg)
			engineDev, devGuardsIntact := engineLayout(t, p.exp, storage.Device, p.cfg)
			shared, err := p.exp.AllocateLayout(storage.Pinned, p.cfg, layerSeparate)
			require.NoError(t, err)
			remotes := map[string]transfer.LayoutHandle{"engine": engine, "engine-device": engineDev, "shared": shared, "g2": p.remote["g2"]}
			for _, h := range []transfer.LayoutHandle{engine, engineDev, shared} {
				d, err := p.exp.Describe(h)
				require.NoError(t, err)
				_, err = p.imp.Import(p.peer, []transfer.Descriptor{d})
				require.NoError(t, err)
			}
			switch route {
			case "process":
				require.True(t, peer.shared.has(engine))
				require.NotZero(t, peer.shared.maps[engine][0].pid, "engine memory: copied process to process")
				require.NotZero(t, peer.shared.maps[engineDev][0].pid, "the emulated device's engine memory too")
				require.NotNil(t, peer.shared.maps[shared][0].m, "shared memory: mapped")
			case "socket":
				require.False(t, peer.shared.has(engine), "the kernel refused: through the socket")
				require.False(t, peer.shared.has(engineDev))
				require.True(t, peer.shared.has(shared))
			case "tcp":
				require.False(t, peer.shared.has(engine))
				require.False(t, peer.shared.has(engineDev))
				require.False(t, peer.shared.has(shared))
			}
			ls, err := p.imp.AllocateLayout(storage.Pinned, p.cfg, layerSeparate)
			require.NoError(t, err)
			locals := map[string]transfer.LayoutHandle{"g2": p.local["g2"], "layer-separate": ls}
			for rname, rh := range remotes {
				for lname, lh := range locals {
					t.Run(rname+"<->"+lname, func(t *testing.T) {
						for _, push := range []bool{false, true} {
							src, dst, sm, dm := rh, lh, p.exp, p.imp
							if push {
								src, dst, sm, dm = lh, rh, p.imp, p.exp
							}
							// 1,2,3 side by side at the source; 0 / 4,5 at the destination.
							moveAndCheck(t, p.imp, sm, src, []int{1, 2, 3, 6}, dm, dst, []int{0, 4, 5, 7})
							guardsIntact()
							devGuardsIntact()
						}
					})
				}
			}
		})
	}
}

// vmCopy joins adjacent ranges on each side on its own, splits a request
// into calls of at most maxIOV ranges a side, and moves every byte, the
// bytes around the ranges untouched; both ways, with this process as the
// peer.
func TestVMCopyJoinsAndSplitsRanges(t *testing.T) {
	const size = 8 << 20
	mk := func(seed byte) []byte {
		m, err := storage.AllocSystem(size)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		b, _ := m.Bytes()
		for i := range b {
			b[i] = byte(i*13) ^ seed
		}
		return b
	}
	addr := func(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
	for _, write := range []bool{false, true} {
		t.Run(fmt.Sprintf("write=%v", write), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			remote, local := mk(0x11), mk(0x77)
			wantRemote, wantLocal := bytes.Clone(remote), bytes.Clone(local)
			var ops []transfer.RemoteOp
			var r, l uint64
			for len(ops) < 3000 { // more than maxIOV a side, joined or not
				s := uint64(1 + rng.IntN(1500))
				if r+s+64 > size || l+s+64 > size {
					break
				}
				ops = append(ops, transfer.RemoteOp{Remote: addr(remote) + r, Local: addr(local) + l, Size: s})
				if write {
					copy(wantRemote[r:r+s], local[l:l+s])
				} else {
					copy(wantLocal[l:l+s], remote[r:r+s])
				}
				// The next range is adjacent on neither side, one, or both.
				switch rng.IntN(4) {
				case 0:
					r, l = r+s, l+s
				case 1:
					r, l = r+s, l+s+7
				case 2:
					r, l = r+s+9, l+s
				default:
					r, l = r+s+3, l+s+5
				}
			}
			require.Greater(t, len(ops), 2*maxIOV)
			require.NoError(t, vmCopy(os.Getpid(), write, ops, time.Time{}))
			sameBytes(t, wantRemote, remote, "the peer's memory")
			sameBytes(t, wantLocal, local, "memory here")
		})
	}
	t.Run("deadline", func(t *testing.T) {
		b := mk(0)
		op := transfer.RemoteOp{Remote: addr(b), Local: addr(b) + 4096, Size: 16}
		err := vmCopy(os.Getpid(), false, []transfer.RemoteOp{op}, time.Now().Add(-time.Second))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	})
	t.Run("refused", func(t *testing.T) {
		b := mk(0)
		op := transfer.RemoteOp{Remote: 0x1000, Local: addr(b), Size: 16} // nothing is mapped at 4 KiB
		err := vmCopy(os.Getpid(), false, []transfer.RemoteOp{op}, time.Time{})
		require.ErrorIs(t, err, unix.EFAULT)
		require.ErrorContains(t, err, "process_vm_readv of process")
	})
}

// skip drops what a short call moved, mid-range included.
func TestSkipDropsWhatAShortCallMoved(t *testing.T) {
	spans := []span{{100, 10}, {200, 5}, {300, 8}}
	require.Equal(t, []span{{100, 10}, {200, 5}, {300, 8}}, skip(append([]span(nil), spans...), 0))
	require.Equal(t, []span{{104, 6}, {200, 5}, {300, 8}}, skip(append([]span(nil), spans...), 4))
	require.Equal(t, []span{{200, 5}, {300, 8}}, skip(append([]span(nil), spans...), 10))
	require.Equal(t, []span{{302, 6}}, skip(append([]span(nil), spans...), 17))
	require.Empty(t, skip(append([]span(nil), spans...), 23))
}

// sameBytes checks got against want, naming the first byte that differs
// (not a diff of megabytes).
func sameBytes(t *testing.T, want, got []byte, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		if want[i] != got[i] {
			require.Failf(t, "bytes differ", "%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
		}
	}
}

// readFullv fills more buffers than one readv takes, empty ones among
// them, after bytes the buffered reader already holds; over a socket and
// over a connection without a descriptor (read buffer by buffer); an early
// close is an unexpected EOF.
func TestReadFullvFillsEveryBuffer(t *testing.T) {
	for _, kind := range []string{"tcp", "pipe"} {
		t.Run(kind, func(t *testing.T) {
			var a, b net.Conn
			if kind == "pipe" {
				a, b = net.Pipe()
			} else {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				defer ln.Close()
				a, err = net.Dial("tcp", ln.Addr().String())
				require.NoError(t, err)
				b, err = ln.Accept()
				require.NoError(t, err)
			}
			defer a.Close()
			defer b.Close()
			rng := rand.New(rand.NewPCG(3, 4))
			var bufs [][]byte
			total := 0
			for range 3 * maxIOV {
				n := rng.IntN(300)
				bufs = append(bufs, make([]byte, n))
				total += n
			}
			sent := make([]byte, total+10)
			for i := range sent {
				sent[i] = byte(rng.Uint32())
			}
			go func() {
				a.Write(sent)
				a.Close()
			}()
			r := bufio.NewReaderSize(b, 4<<10)
			_, err := r.Peek(100) // some bytes buffered first
			require.NoError(t, err)
			require.NoError(t, readFullv(b, r, bufs))
			sameBytes(t, sent[:total], bytes.Join(bufs, nil), "the buffers")
			rest := make([]byte, 20)
			require.ErrorIs(t, readFullv(b, r, [][]byte{rest}), io.ErrUnexpectedEOF)
		})
	}
}

func TestJoinAdjacent(t *testing.T) {
	m := make([]byte, 100)
	got := joinAdjacent([][]byte{m[0:10], m[10:20], m[30:40], {}, m[40:45], m[50:60], m[0:5]})
	require.Len(t, got, 4)
	for i, want := range [][]byte{m[0:20], m[30:45], m[50:60], m[0:5]} {
		require.Equal(t, unsafe.SliceData(want), unsafe.SliceData(got[i]), "range %d", i)
		require.Len(t, got[i], len(want), "range %d", i)
	}
}

// An exporter that refuses to lend memory the importer copies process to
// process (a kvbm from before it lent memory it does not share; here a
// disk layout, which no lend reaches) is asked again through the socket,
// and the layout is reached through the socket from then on; the peer is
// kept.
func TestARefusedLendIsRetriedThroughTheSocket(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	exp, err := transfer.NewManager(transfer.Config{WorkerID: 0xE1, Driver: emu, DiskDir: t.TempDir()})
	require.NoError(t, err)
	defer exp.Close()
	imp, err := transfer.NewManager(transfer.Config{WorkerID: 0x11, Driver: emu})
	require.NoError(t, err)
	defer imp.Close()
	expT, impT := New(Config{Listen: "127.0.0.1:0"}), New(Config{Listen: "127.0.0.1:0"})
	require.NoError(t, expT.Serve(exp))
	require.NoError(t, impT.Serve(imp))
	defer expT.Close()
	defer impT.Close()
	cfg := smallConfig(4)
	disk, err := exp.AllocateLayout(storage.Disk, cfg, transfer.FullyContiguous)
	require.NoError(t, err)
	ep, err := expT.Endpoint()
	require.NoError(t, err)
	p, err := impT.Connect(context.Background(), ep)
	require.NoError(t, err)
	defer p.Close()
	peer := p.(*tcpPeer)
	d, err := exp.Describe(disk)
	require.NoError(t, err)
	peer.shared.set(disk, []sharedMap{{addr: d.Bases[0], size: uint64(4 * cfg.BlockSize()), pid: os.Getpid()}})
	buf, err := storage.AllocSystem(64)
	require.NoError(t, err)
	defer buf.Close()
	before := expT.Served()
	err = peer.Read(context.Background(), disk, []transfer.RemoteOp{{Remote: d.Bases[0], Local: buf.Addr(), Size: 64}})
	require.ErrorIs(t, err, transfer.ErrUnsupported, "the socket's read is refused too: disk is not served")
	require.NotErrorIs(t, err, errNotLent, "the error is the socket's")
	// The server counts a request just after answering it: the client can
	// be back first.
	require.Eventually(t, func() bool { return expT.Served() == before+2 }, 5*time.Second, time.Millisecond,
		"the lend, then the read through the socket")
	require.False(t, peer.shared.has(disk), "through the socket from now on")
	require.NoError(t, peer.brokenErr())
}

// moveAndCheck moves blocks sids of src (in manager sm) to dids of dst (in
// dm) with p's importer, and checks every block of dst: the moved ones
// hold their source's pattern, the others are untouched.
func moveAndCheck(t *testing.T, imp, sm *transfer.Manager, src transfer.LayoutHandle, sids []int, dm *transfer.Manager, dst transfer.LayoutHandle, dids []int) {
	t.Helper()
	fill(t, sm, src, 0x5A)
	fill(t, dm, dst, 0x00)
	n, err := imp.ExecuteTransfer(src, sids, dst, dids, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
	moved := map[int]int{}
	for i := range dids {
		moved[dids[i]] = sids[i]
	}
	bio, err := dm.BlockIO(dst)
	require.NoError(t, err)
	for id := range bio.NumBlocks() {
		want := pattern(bio.BlockSize(), 0x00, id) // untouched
		if s, ok := moved[id]; ok {
			want = pattern(bio.BlockSize(), 0x5A, s)
		}
		sameBytes(t, want, block(t, dm, dst, id), fmt.Sprintf("block %d of the destination", id))
	}
}

// Device fragments served through the socket move through the staging
// buffer's two halves in turn: requests of several halves, fragments that
// straddle two, every byte checked both ways.
func TestDeviceFragmentsThroughTheStageEveryByte(t *testing.T) {
	p := newTCPPair(t, 10*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	// 64 fragments of 67,200 bytes a block: a request is one block of more
	// than two halves (4,300,800 bytes), and a half (2 MiB) is no whole
	// number of fragments.
	cfg := layout.Config{NumBlocks: 6, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 2100, DtypeWidth: 2}
	dev, err := p.exp.AllocateLayout(storage.Device, cfg, layerSeparate)
	require.NoError(t, err)
	d, err := p.exp.Describe(dev)
	require.NoError(t, err)
	_, err = p.imp.Import(p.peer, []transfer.Descriptor{d})
	require.NoError(t, err)
	local, err := p.imp.AllocateLayout(storage.Pinned, cfg, transfer.FullyContiguous)
	require.NoError(t, err)
	moveAndCheck(t, p.imp, p.exp, dev, []int{1, 2, 3, 5, 0}, p.imp, local, []int{0, 1, 2, 4, 5})
	moveAndCheck(t, p.imp, p.imp, local, []int{4, 0, 1, 2, 3}, p.exp, dev, []int{0, 1, 2, 4, 5})
}
