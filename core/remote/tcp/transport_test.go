package tcp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tcpPair is an exporter and an importer, each with its own TCP transport
// on the loopback interface, in one process: the wire protocol, the server
// and the peer are the same as between processes.
type tcpPair struct {
	emu            *cuda.Emulated
	exp, imp       *transfer.Manager
	expTCP, impTCP *Transport
	peer           remote.Peer
	cfg            layout.Config
	remote         map[string]transfer.LayoutHandle // exporter's layouts by name
	local          map[string]transfer.LayoutHandle
}

func newTCPPair(t testing.TB, deadline time.Duration, cfgs ...Config) *tcpPair {
	t.Helper()
	p := newUnconnectedPair(t, deadline, smallConfig(8), cfgs...)
	p.connect(t)
	return p
}

// newUnconnectedPair is a pair whose importer has not connected yet, with
// layouts of lc.
func newUnconnectedPair(t testing.TB, deadline time.Duration, lc layout.Config, cfgs ...Config) *tcpPair {
	t.Helper()
	tcpCfg := Config{Listen: "127.0.0.1:0"}
	if len(cfgs) > 0 {
		tcpCfg = cfgs[0]
	}
	impCfg := tcpCfg // cfgs[1], when given, is the importer's
	if len(cfgs) > 1 {
		impCfg = cfgs[1]
	}
	p := &tcpPair{emu: cuda.NewEmulated(1), cfg: lc,
		remote: map[string]transfer.LayoutHandle{}, local: map[string]transfer.LayoutHandle{}}
	var err error
	p.exp, err = transfer.NewManager(transfer.Config{WorkerID: 0xE1, Driver: p.emu, RemoteDeadline: deadline})
	require.NoError(t, err)
	p.imp, err = transfer.NewManager(transfer.Config{WorkerID: 0x11, Driver: p.emu, RemoteDeadline: deadline})
	require.NoError(t, err)
	p.expTCP = New(tcpCfg)
	p.impTCP = New(impCfg)
	require.NoError(t, p.expTCP.Serve(p.exp))
	require.NoError(t, p.impTCP.Serve(p.imp))
	t.Cleanup(func() {
		require.NoError(t, p.impTCP.Close())
		require.NoError(t, p.expTCP.Close())
		require.NoError(t, p.imp.Close())
		require.NoError(t, p.exp.Close())
		require.NoError(t, p.emu.Close())
	})
	for name, s := range map[string]struct {
		kind  storage.Kind
		shape transfer.Shape
	}{"g2": {storage.Pinned, transfer.FullyContiguous}, "g1": {storage.Device, transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}}} {
		p.remote[name], err = p.exp.AllocateLayout(s.kind, p.cfg, s.shape)
		require.NoError(t, err)
		p.local[name], err = p.imp.AllocateLayout(s.kind, p.cfg, s.shape)
		require.NoError(t, err)
	}
	return p
}

// connect connects the importer to the exporter and imports its layouts.
func (p *tcpPair) connect(t testing.TB) {
	t.Helper()
	ep, err := p.expTCP.Endpoint()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a server that never answers fails the test, not the run
	defer cancel()
	p.peer, err = p.impTCP.Connect(ctx, ep)
	require.NoError(t, err)
	for _, h := range p.remote {
		d, err := p.exp.Describe(h)
		require.NoError(t, err)
		_, err = p.imp.Import(p.peer, []transfer.Descriptor{d})
		require.NoError(t, err)
	}
}

// fill writes a distinct pattern into every block of a layout.
func fill(t *testing.T, m *transfer.Manager, h transfer.LayoutHandle, seed byte) {
	t.Helper()
	bio, err := m.BlockIO(h)
	require.NoError(t, err)
	for id := range bio.NumBlocks() {
		require.NoError(t, bio.WriteBlock(id, pattern(bio.BlockSize(), seed, id)))
	}
}

// pattern is a block's bytes: no run of them repeats within a block, so
// that bytes moved to the wrong offset never pass for the right ones.
func pattern(size int, seed byte, id int) []byte {
	b := make([]byte, size)
	for i := range b {
		x := uint32(i)*2654435761 ^ uint32(id)*40503 ^ uint32(seed)*16777619
		b[i] = byte(x>>24 ^ x>>13 ^ x)
	}
	return b
}

func block(t *testing.T, m *transfer.Manager, h transfer.LayoutHandle, id int) []byte {
	t.Helper()
	bio, err := m.BlockIO(h)
	require.NoError(t, err)
	b := make([]byte, bio.BlockSize())
	require.NoError(t, bio.ReadBlock(id, b))
	return b
}

// Pull and push between every pair of host and device layouts, fragments
// included (the device layouts are layer-separate, block-second), every
// byte checked, and blocks not named left alone.
func TestTCPMovesEveryByteBothWays(t *testing.T) {
	for _, sameHost := range []bool{true, false} {
		t.Run(map[bool]string{true: "same host", false: "tcp"}[sameHost], func(t *testing.T) {
			p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: !sameHost})
			peer := p.peer.(*tcpPeer)
			if sameHost {
				require.Equal(t, "unix", peer.network)
				require.True(t, peer.shared.has(p.remote["g2"]), "the exporter's G2 is mapped here")
				require.False(t, peer.shared.has(p.remote["g1"]), "device memory goes through the socket")
			} else {
				require.Equal(t, "tcp", peer.network)
				require.False(t, peer.shared.has(p.remote["g2"]))
			}
			movesEveryByteBothWays(t, p)
		})
	}
}

func movesEveryByteBothWays(t *testing.T, p *tcpPair) {
	for _, src := range []string{"g2", "g1"} {
		for _, dst := range []string{"g2", "g1"} {
			t.Run(src+"->"+dst, func(t *testing.T) {
				fill(t, p.exp, p.remote[src], 0x5A)
				fill(t, p.imp, p.local[dst], 0x00)
				n, err := p.imp.ExecuteTransfer(p.remote[src], []int{1, 6, 3}, p.local[dst], []int{0, 2, 7}, transfer.Options{})
				require.NoError(t, err)
				require.NoError(t, n.WaitTimeout(-1))
				for i, pair := range [][2]int{{1, 0}, {6, 2}, {3, 7}} {
					require.Equal(t, pattern(p.cfg.BlockSize(), 0x5A, pair[0]), block(t, p.imp, p.local[dst], pair[1]), "pulled block %d", i)
				}
				for _, guard := range []int{1, 3, 4, 5, 6} {
					require.Equal(t, pattern(p.cfg.BlockSize(), 0, guard), block(t, p.imp, p.local[dst], guard), "guard %d", guard)
				}

				// Push back the other way: local src-kind blocks into the remote dst-kind layout.
				fill(t, p.imp, p.local[src], 0xC3)
				fill(t, p.exp, p.remote[dst], 0x00)
				n, err = p.imp.ExecuteTransfer(p.local[src], []int{5, 0}, p.remote[dst], []int{4, 2}, transfer.Options{})
				require.NoError(t, err)
				require.NoError(t, n.WaitTimeout(-1))
				require.Equal(t, pattern(p.cfg.BlockSize(), 0xC3, 5), block(t, p.exp, p.remote[dst], 4))
				require.Equal(t, pattern(p.cfg.BlockSize(), 0xC3, 0), block(t, p.exp, p.remote[dst], 2))
				for _, guard := range []int{0, 1, 3, 5, 6, 7} {
					require.Equal(t, pattern(p.cfg.BlockSize(), 0, guard), block(t, p.exp, p.remote[dst], guard), "guard %d", guard)
				}
			})
		}
	}
	c := p.imp.Counters()
	require.NotZero(t, c[transfer.PathRemoteRead].Transfers)
	require.NotZero(t, c[transfer.PathRemoteWrite].Transfers)
	require.NotZero(t, c[transfer.PathTwoHop].Transfers, "device destinations go through a pinned bounce")
}

// A request the server refuses names the reason and leaves the connection
// usable; the peer is not broken by it.
func TestTCPServerRefusalKeepsThePeer(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	buf, err := storage.AllocSystem(64)
	require.NoError(t, err)
	defer buf.Close()
	d, err := p.exp.Describe(p.remote["g2"])
	require.NoError(t, err)
	mem, err := p.peer.Attach(d)
	require.NoError(t, err)
	err = mem.Memory.Read(context.Background(), p.remote["g2"], []transfer.RemoteOp{{Remote: 0x10, Local: buf.Addr(), Size: 64}})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
	require.ErrorContains(t, err, "not inside one region")
	err = mem.Memory.Read(context.Background(), transfer.LayoutHandle{Worker: 0xE1, Layout: 999}, []transfer.RemoteOp{{Remote: d.Bases[0], Local: buf.Addr(), Size: 64}})
	require.ErrorIs(t, err, transfer.ErrNotFound)
	err = mem.Memory.Write(context.Background(), p.remote["g2"], []transfer.RemoteOp{{Remote: d.Bases[0] - 1, Local: buf.Addr(), Size: 64}})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
	require.NotErrorIs(t, err, remote.ErrPeerUnavailable)

	fill(t, p.exp, p.remote["g2"], 0x77)
	n, err := p.imp.ExecuteTransfer(p.remote["g2"], []int{2}, p.local["g2"], []int{2}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
	require.Equal(t, pattern(p.cfg.BlockSize(), 0x77, 2), block(t, p.imp, p.local["g2"], 2))

	_, err = p.peer.Attach(transfer.Descriptor{Handle: transfer.LayoutHandle{Worker: 0x99, Layout: 1}})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
}

// A closed exporter fails the importer's transfers with the blocks named,
// later ones at once, and a reconnect to a new server works.
func TestTCPPeerGoneFailsBlocksAndReconnects(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	require.NoError(t, p.expTCP.Close())
	n, err := p.imp.ExecuteTransfer(p.remote["g2"], []int{0, 1}, p.local["g2"], []int{4, 5}, transfer.Options{})
	require.NoError(t, err)
	err = n.WaitTimeout(-1)
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	var te *transfer.Error
	require.ErrorAs(t, err, &te)
	require.Equal(t, []int{4, 5}, te.FailedBlocks)
	start := time.Now()
	n, err = p.imp.ExecuteTransfer(p.remote["g2"], []int{2}, p.local["g2"], []int{6}, transfer.Options{})
	require.NoError(t, err)
	require.ErrorIs(t, n.WaitTimeout(-1), remote.ErrPeerUnavailable)
	require.Less(t, time.Since(start), time.Second, "a broken peer fails at once")

	// The exporter serves again on a new transport; importing again reconnects.
	again := New(Config{Listen: "127.0.0.1:0"})
	defer again.Close()
	require.NoError(t, again.Serve(p.exp))
	ep, err := again.Endpoint()
	require.NoError(t, err)
	peer, err := p.impTCP.Connect(context.Background(), ep)
	require.NoError(t, err)
	d, err := p.exp.Describe(p.remote["g2"])
	require.NoError(t, err)
	_, err = p.imp.Import(peer, []transfer.Descriptor{d})
	require.NoError(t, err)
	fill(t, p.exp, p.remote["g2"], 0x42)
	n, err = p.imp.ExecuteTransfer(p.remote["g2"], []int{2}, p.local["g2"], []int{6}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
	require.Equal(t, pattern(p.cfg.BlockSize(), 0x42, 2), block(t, p.imp, p.local["g2"], 6))
}

// A server that accepts and then says nothing — a frozen process — fails
// the connect within the deadline.
func TestTCPSilentPeerFailsWithinTheDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	ep := tcpEndpoint{worker: 0xE1, addr: ln.Addr().String()}.append(nil)
	tr := New(Config{})
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = tr.Connect(ctx, ep)
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorIs(t, err, transfer.ErrTimeout)
	require.Less(t, time.Since(start), 2*time.Second)
	ln.Close()
	for c := range accepted {
		c.Close()
	}
}

func TestTCPEndpointAndHelloAreChecked(t *testing.T) {
	tr := New(Config{})
	defer tr.Close()
	v1 := append([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0}, "10.0.0.1:4000"...)
	v2 := append(append([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 17)...), "10.0.0.1:4000"...)
	v4 := tcpEndpoint{worker: 1, addr: "127.0.0.1:1"}.append(nil)
	v4[0] = 4
	badScope := tcpEndpoint{worker: 1, scope: 7, addr: "127.0.0.1:1"}.append(nil)
	relative := tcpEndpoint{worker: 1, unix: "/tmp/sock", addr: "127.0.0.1:1"}.append(nil)
	for _, ep := range [][]byte{nil, {9}, v1, v2, v4, badScope, relative, tcpEndpoint{worker: 1, addr: "nohostport"}.append(nil)} {
		_, err := tr.Connect(context.Background(), ep)
		require.ErrorIs(t, err, remote.ErrBadEndpoint, "%q", ep)
	}
	_, err := parseTCPEndpoint(v2)
	require.ErrorContains(t, err, "tcp endpoint version 2, this library reads version 3", "an older kvbm's endpoint names both versions")
	_, err = parseTCPEndpoint(v1)
	require.ErrorContains(t, err, "version 1, this library reads version 3")
	// The hello's checks are package capability's (TestTheHelloIsChecked).
}

// Cancel and a transfer deadline stop a pull the exporter is slow to
// serve: its blocks fail with transfer.ErrCanceled within the bound, nothing is
// written to them once the notification completed, and the peer stays
// connected (the next pull works).
func TestTCPCancelAndDeadlineStopAPullAndKeepThePeer(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	fill(t, p.exp, p.remote["g1"], 0x31)
	for _, how := range []string{"cancel", "deadline"} {
		t.Run(how, func(t *testing.T) {
			fill(t, p.imp, p.local["g2"], 0)
			release := make(chan struct{})
			p.emu.InjectCopyFault(func(kind cuda.CopyKind, c cuda.Copy) error {
				if kind == cuda.DeviceToHost { // the exporter staging its G1 for the socket
					<-release
				}
				return nil
			})
			opts := transfer.Options{}
			if how == "deadline" {
				opts.Deadline = 100 * time.Millisecond
			}
			start := time.Now()
			n, err := p.imp.ExecuteTransfer(p.remote["g1"], []int{0, 1}, p.local["g2"], []int{2, 3}, opts)
			require.NoError(t, err)
			if how == "cancel" {
				time.Sleep(50 * time.Millisecond)
				n.Cancel()
			}
			err = n.WaitTimeout(-1)
			require.ErrorIs(t, err, transfer.ErrCanceled)
			require.NotErrorIs(t, err, remote.ErrPeerUnavailable, "the peer is not at fault")
			require.Equal(t, []int{2, 3}, n.FailedBlocks())
			require.Less(t, time.Since(start), 2*time.Second, "well before the 5 s remote deadline")

			close(release)
			p.emu.InjectCopyFault(nil)
			time.Sleep(50 * time.Millisecond) // the exporter answers the abandoned request now
			for _, b := range []int{2, 3} {
				require.Equal(t, pattern(p.cfg.BlockSize(), 0, b), block(t, p.imp, p.local["g2"], b),
					"nothing lands after the notification completed")
			}
			n, err = p.imp.ExecuteTransfer(p.remote["g1"], []int{4}, p.local["g2"], []int{5}, transfer.Options{})
			require.NoError(t, err)
			require.NoError(t, n.WaitTimeout(-1))
			require.Equal(t, pattern(p.cfg.BlockSize(), 0x31, 4), block(t, p.imp, p.local["g2"], 5))
		})
	}
}

// On one host, host layouts the exporter allocated are mapped and copied
// directly; memory the engine registered is not shared and goes through
// the socket; a layout the exporter unregistered fails its blocks with
// transfer.ErrNotFound and is unmapped here, the peer kept.
func TestSameHostSharesOnlyAllocatedHostMemory(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	peer := p.peer.(*tcpPeer)
	engine, err := storage.AllocSystem(uint64(8 * p.cfg.BlockSize()))
	require.NoError(t, err)
	defer engine.Close()
	reg, err := p.exp.RegisterExternal(storage.Pinned, p.cfg, transfer.FullyContiguous, []uint64{engine.Addr()})
	require.NoError(t, err)
	d, err := p.exp.Describe(reg)
	require.NoError(t, err)
	_, err = p.imp.Import(p.peer, []transfer.Descriptor{d})
	require.NoError(t, err)
	_, err = p.exp.Shared(reg)
	require.ErrorIs(t, err, transfer.ErrUnsupported, "engine memory is not shared")
	require.True(t, peer.shared.has(reg), "but lent, and copied process to process")
	require.NotZero(t, peer.shared.maps[reg][0].pid)
	require.Nil(t, peer.shared.maps[reg][0].m)

	fill(t, p.exp, reg, 0x21)
	fill(t, p.exp, p.remote["g2"], 0x22)
	for _, src := range []transfer.LayoutHandle{reg, p.remote["g2"]} {
		n, err := p.imp.ExecuteTransfer(src, []int{4, 1}, p.local["g2"], []int{0, 3}, transfer.Options{})
		require.NoError(t, err)
		require.NoError(t, n.WaitTimeout(-1))
		seed := map[transfer.LayoutHandle]byte{reg: 0x21, p.remote["g2"]: 0x22}[src]
		require.Equal(t, pattern(p.cfg.BlockSize(), seed, 4), block(t, p.imp, p.local["g2"], 0))
		require.Equal(t, pattern(p.cfg.BlockSize(), seed, 1), block(t, p.imp, p.local["g2"], 3))
	}

	require.NoError(t, p.exp.Unregister(p.remote["g2"]))
	n, err := p.imp.ExecuteTransfer(p.remote["g2"], []int{2, 5}, p.local["g2"], []int{2, 5}, transfer.Options{})
	require.NoError(t, err)
	require.ErrorIs(t, n.WaitTimeout(-1), transfer.ErrNotFound)
	require.Equal(t, []int{2, 5}, n.FailedBlocks())
	require.False(t, peer.shared.has(p.remote["g2"]), "unmapped once the exporter said it is gone")
	n, err = p.imp.ExecuteTransfer(reg, []int{7}, p.local["g2"], []int{7}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1), "the peer is kept")
	require.Equal(t, pattern(p.cfg.BlockSize(), 0x21, 7), block(t, p.imp, p.local["g2"], 7))
}

// A peer asking for shared memory over TCP (another host, as far as the
// server knows) is refused, and its connection kept.
func TestMapOverTCPIsRefused(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	peer := p.peer.(*tcpPeer)
	c, err := peer.get(context.Background())
	require.NoError(t, err)
	_, err = c.c.Write(appendRequest(nil, opMap, p.remote["g2"], nil))
	require.NoError(t, err)
	err = readStatus(c.r)
	require.ErrorIs(t, err, transfer.ErrUnsupported)
	require.ErrorContains(t, err, "peers on this host only")
	d, err := p.exp.Describe(p.remote["g2"])
	require.NoError(t, err)
	_, err = c.c.Write(appendRequest(nil, opLendRead, p.remote["g2"], []transfer.RemoteOp{{Remote: d.Bases[0], Size: 64}}))
	require.NoError(t, err)
	err = readStatus(c.r)
	require.ErrorIs(t, err, transfer.ErrUnsupported, "nothing is lent over TCP")
	require.ErrorContains(t, err, "this host only")
	peer.put(c)
	n, err := p.imp.ExecuteTransfer(p.remote["g2"], []int{1}, p.local["g2"], []int{1}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
}

// TestSameHostDialerProcess is the other user's process of
// TestSameHostSocketRefusesOtherUsers (it runs only there): it dials the
// socket, says hello, and prints what came back.
func TestSameHostDialerProcess(t *testing.T) {
	name := os.Getenv("KVBM_TEST_DIAL")
	if name == "" {
		t.Skip("a helper process of TestSameHostSocketRefusesOtherUsers")
	}
	c, err := net.Dial("unix", name)
	require.NoError(t, err)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 64))
	fmt.Printf("answered %d bytes, %v\n", n, err)
}

// The same-host socket has no file permissions: a process of another user
// is closed on at once, before its hello is read, so that it cannot map
// our memory. (Needs root, to start a process as another user.)
func TestSameHostSocketRefusesOtherUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	p := newTCPPair(t, 5*time.Second)
	ep, err := p.expTCP.Endpoint()
	require.NoError(t, err)
	e, err := parseTCPEndpoint(ep)
	require.NoError(t, err)
	require.NotEmpty(t, e.unix)
	// A copy of this test binary the other user may run (the build
	// directory is private).
	exe, err := os.Executable()
	require.NoError(t, err)
	bin, err := os.ReadFile(exe)
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "kvbm-dial")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755))
	self := dir + "/tcp.test"
	require.NoError(t, os.WriteFile(self, bin, 0o755))
	for _, uid := range []uint32{0, 65534} {
		cmd := exec.Command(self, "-test.run", "^TestSameHostDialerProcess$", "-test.v")
		cmd.Env = append(os.Environ(), "KVBM_TEST_DIAL="+e.unix)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		if uid == 0 {
			require.Contains(t, string(out), fmt.Sprintf("answered %d bytes, <nil>", capability.NonceLen), "this user is challenged")
		} else {
			require.Contains(t, string(out), "answered 0 bytes, ", "another user is closed on")
			require.NotContains(t, string(out), "<nil>", "closed on (EOF, or reset: its hello was never read)")
		}
	}
}

// A same-host socket that closes on this process (another user's worker:
// SO_PEERCRED) leaves TCP: Connect falls back to it.
func TestSameHostRefusalFallsBackToTCP(t *testing.T) {
	admitPeer = func(c net.Conn) bool { _, unix := c.(*net.UnixConn); return !unix }
	t.Cleanup(func() { admitPeer = samePeerUser }) // after the pair's cleanup: its servers are gone
	p := newTCPPair(t, 5*time.Second)
	require.False(t, SameHost(p.peer), "reached over TCP")
	require.False(t, Mapped(p.peer, p.remote["g2"]))
	fill(t, p.exp, p.remote["g2"], 0x61)
	n, err := p.imp.ExecuteTransfer(p.remote["g2"], []int{3}, p.local["g2"], []int{3}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
	require.Equal(t, pattern(p.cfg.BlockSize(), 0x61, 3), block(t, p.imp, p.local["g2"], 3))
}

// Mappings made while the peer closes are undone at once, not kept.
func TestSharedMapsAfterCloseAreUnmapped(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	mem, err := storage.AllocShared(emu, 0, 4096, false)
	require.NoError(t, err)
	defer mem.Close()
	m, err := storage.MapShared(mem.File(), 4096)
	require.NoError(t, err)
	var s sharedMaps
	h := transfer.LayoutHandle{Worker: 1, Layout: 1}
	s.closeAll()
	s.set(h, []sharedMap{{addr: 0x1000, size: 4096, m: m}})
	require.False(t, s.has(h))
	require.Nil(t, m.Bytes(), "unmapped")
}

// Close while Connect is between its dials: Connect returns (the transport
// is closed), it does not deadlock on the transport's lock.
func TestConnectRacingCloseReturns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	const worker = 0xABC
	second, release := make(chan struct{}), make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(i int, c net.Conn) {
				defer c.Close()
				sn := make([]byte, capability.NonceLen)
				c.Write(sn)
				b := make([]byte, capability.HelloLen)
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if i == 1 { // the watch connection's hello: Close comes now
					close(second)
					<-release
				}
				h, _ := capability.ParseHello(b)
				c.Write(serverProofUnder(capability.Key{}, sn, h.CN, worker, h.Client))
				io.Copy(io.Discard, c)
			}(i, c)
		}
	}()
	tr := New(Config{NoSameHost: true})
	done := make(chan error, 1)
	go func() {
		_, err := tr.Connect(context.Background(), tcpEndpoint{worker: worker, addr: ln.Addr().String()}.append(nil))
		done <- err
	}()
	<-second
	require.NoError(t, tr.Close())
	close(release)
	select {
	case err := <-done:
		require.ErrorIs(t, err, transfer.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Connect did not return after Close")
	}
}

// A peer an operation broke first (its request failed) is still let go of
// when its connections close: its mapped memory is unmapped then.
func TestPeerBrokenByAnOperationIsUnmappedWhenItCloses(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	peer := p.peer.(*tcpPeer)
	h := p.remote["g2"]
	require.True(t, Mapped(peer, h))
	a, b := net.Pipe()
	defer b.Close()
	_ = peer.fail(&tcpConn{c: a, r: bufio.NewReader(a)}, context.Background(), io.ErrUnexpectedEOF)
	require.NoError(t, p.expTCP.Close()) // the exporter goes: its server closes the watch connection
	require.Eventually(t, func() bool { return !Mapped(peer, h) }, 5*time.Second, 5*time.Millisecond)
}

// A server sees that its peer closed the connection even while bytes the
// peer sent before are still queued to be read (what keeps a write the
// pusher gave up on from being applied), on TCP and on the same-host Unix
// socket alike; an open peer, or one that only sent, is not closed.
func TestPeerClosedIsSeenWithBytesStillQueued(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = fmt.Sprintf("@kvbm-test-peerclosed-%d", os.Getpid())
			}
			ln, err := net.Listen(network, addr)
			require.NoError(t, err)
			defer ln.Close()
			client, err := net.Dial(network, ln.Addr().String())
			require.NoError(t, err)
			server, err := ln.Accept()
			require.NoError(t, err)
			defer server.Close()
			require.False(t, peerClosed(server))
			_, err = client.Write([]byte("queued bytes"))
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				var pending int
				raw, _ := server.(syscall.Conn).SyscallConn()
				raw.Control(func(fd uintptr) { pending, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
				return pending > 0
			}, time.Second, time.Millisecond)
			require.False(t, peerClosed(server), "bytes queued, the peer still open")
			require.NoError(t, client.Close())
			require.Eventually(t, func() bool { return peerClosed(server) }, time.Second, time.Millisecond)
			b := make([]byte, 12)
			_, err = io.ReadFull(server, b)
			require.NoError(t, err, "the queued bytes are still there to read")
			require.Equal(t, "queued bytes", string(b))
		})
	}
}

func smallConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 4, OuterDim: 2, PageSize: 4, InnerDim: 64, DtypeWidth: 2}
}
