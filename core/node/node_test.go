package node

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/cache"
	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

func newDriver(t *testing.T) *cuda.Emulated {
	emu := cuda.NewEmulated(1)
	t.Cleanup(func() { require.NoError(t, emu.Close()) })
	return emu
}

// The transport is the one Transport names, KVBM_TRANSPORT when it names
// none; the worker serves on it from create.
func TestNewServesOnTheTransportItNames(t *testing.T) {
	drv := newDriver(t)
	for _, c := range []struct {
		transport, env string
		want           []string
	}{
		{transport: "loopback", want: []string{"loopback"}},
		{transport: "tcp", want: []string{"loopback", "tcp"}},
		{env: "loopback", want: []string{"loopback"}},
		{env: "", want: []string{"loopback", "tcp"}}, // auto
	} {
		t.Setenv("KVBM_TRANSPORT", c.env)
		t.Setenv("KVBM_TCP_LISTEN", "127.0.0.1:0")
		n, err := New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv, Loopback: remote.NewLoopback()},
			Transport: c.transport})
		require.NoError(t, err)
		require.Equal(t, c.want, n.Worker().Transports(), "%+v", c)
		_, err = n.Worker().ExportMetadata()
		require.NoError(t, err, "every transport has its endpoint: it listens")
		require.NoError(t, n.Close())
	}
}

func TestNewRefusesAnUnknownTransportSayingWhereItCameFrom(t *testing.T) {
	drv := newDriver(t)
	_, err := New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv}, Transport: "carrier-pigeon"})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.ErrorContains(t, err, `transport: invalid argument: transport "carrier-pigeon" is not one of`)
	t.Setenv("KVBM_TRANSPORT", "carrier-pigeon")
	_, err = New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv}})
	require.ErrorContains(t, err, `KVBM_TRANSPORT: invalid argument: transport "carrier-pigeon"`)
	_, err = New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv, Network: &probe{}}, Transport: "loopback"})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument, "the node opens the transport itself")
}

// probe is a transport that records its Close, and fails Serve when told.
type probe struct {
	failServe      bool
	served, closed bool
}

func (p *probe) Name() string { return "probe" }
func (p *probe) Serve(*transfer.Manager) error {
	if p.failServe {
		return errors.New("probe: no")
	}
	p.served = true
	return nil
}
func (p *probe) Endpoint() ([]byte, error) { return []byte("probe"), nil }
func (p *probe) Connect(context.Context, []byte) (remote.Peer, error) {
	return nil, errors.New("probe")
}
func (p *probe) Close() error { p.closed = true; return nil }

// A create that fails closes the transport it opened: a worker that cannot
// be made (no such device), or one whose transport cannot serve.
func TestAFailedCreateClosesTheTransport(t *testing.T) {
	drv := newDriver(t)
	var last *probe
	failServe := false
	remote.Register("node-probe", func(remote.OpenOptions) (remote.Transport, error) {
		last = &probe{failServe: failServe}
		return last, nil
	})
	_, err := New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv, Device: 3}, Transport: "node-probe"})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	require.True(t, last.closed, "no worker: its transport is closed")
	require.False(t, last.served)

	failServe = true
	loop := remote.NewLoopback()
	_, err = New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv, Loopback: loop}, Transport: "node-probe"})
	require.ErrorContains(t, err, "serve on probe: probe: no")
	require.True(t, last.closed, "it cannot serve: closed")
	_, err = loop.Attach(transfer.Descriptor{Handle: transfer.LayoutHandle{Worker: 1}})
	require.ErrorIs(t, err, transfer.ErrNotFound, "the worker that was made is closed, and left the loopback")
}

// One cache per node, made once G1 and G2 are registered; Close closes it
// before the worker.
func TestOneCacheClosedWithTheNode(t *testing.T) {
	drv := newDriver(t)
	n, err := New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv}, Transport: "loopback"})
	require.NoError(t, err)
	_, err = n.EnableCache(cache.Config{})
	require.ErrorIs(t, err, transfer.ErrNotFound, "G1 and G2 first")
	require.Nil(t, n.Cache())

	cfg := layout.Config{NumBlocks: 4, NumLayers: 2, OuterDim: 2, PageSize: 4, InnerDim: 32, DtypeWidth: 2}
	g1, err := storage.AllocDevice(drv, 0, uint64(cfg.NumBlocks*cfg.BlockSize()))
	require.NoError(t, err)
	defer g1.Close()
	_, err = n.Worker().RegisterG1(cfg, transfer.FullyContiguous, []uint64{g1.Addr()})
	require.NoError(t, err)
	_, err = n.Worker().AllocateG2(cfg, transfer.FullyContiguous)
	require.NoError(t, err)
	c, err := n.EnableCache(cache.Config{})
	require.NoError(t, err)
	require.Same(t, c, n.Cache())
	_, err = n.EnableCache(cache.Config{})
	require.ErrorIs(t, err, transfer.ErrAlreadyExists)
	require.ErrorContains(t, err, "the worker has a cache already")

	require.NoError(t, n.Close())
	_, _, err = c.Offload([][]byte{[]byte("k")}, []int{0}, 0)
	require.ErrorIs(t, err, transfer.ErrClosed)
	require.ErrorContains(t, err, "the cache is closed", "the cache went first")
}

// listening is the listening sockets this process holds: TCP ("tcp
// ip:port", hex as /proc/net/tcp writes it) and Unix ("unix @name").
func listening(t *testing.T) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if f := strings.Fields(line); len(f) > 9 && f[3] == "0A" && inodes[f[9]] {
				out = append(out, "tcp "+f[1])
			}
		}
	}
	b, err := os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Flags 00010000 is __SO_ACCEPTCON: listening.
		if f := strings.Fields(line); len(f) > 7 && f[3] == "00010000" && inodes[f[6]] {
			out = append(out, "unix "+f[7])
		}
	}
	return out
}

// A worker made with nothing configured listens on nothing until its
// metadata is first exported, and then on the loopback interface only
// (and its same-host socket); KVBM_TCP_LISTEN makes it listen at create.
func TestANodeListensOnlyOnceItExportsItsMetadata(t *testing.T) {
	drv := newDriver(t)
	for _, k := range []string{"KVBM_TRANSPORT", "KVBM_TCP_LISTEN", "KVBM_TCP_ADVERTISE", "KVBM_SAME_HOST"} {
		t.Setenv(k, "")
	}
	before := listening(t)
	n, err := New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv, Loopback: remote.NewLoopback()}})
	require.NoError(t, err)
	require.Equal(t, []string{"loopback", "tcp"}, n.Worker().Transports())
	require.Equal(t, before, listening(t), "made, not exported: no listener")
	_, err = n.Worker().ExportMetadata()
	require.NoError(t, err)
	opened := listening(t)[len(before):]
	require.NotEmpty(t, opened)
	for _, l := range opened {
		if strings.HasPrefix(l, "tcp ") {
			require.True(t, strings.HasPrefix(l, "tcp 0100007F:"), "loopback only: %s", l)
		}
	}
	_, err = n.Worker().ExportMetadata()
	require.NoError(t, err)
	require.Len(t, listening(t), len(before)+len(opened), "one listener, however often it exports")
	require.NoError(t, n.Close())
	require.Equal(t, before, listening(t), "closed: no listener")

	t.Setenv("KVBM_TCP_LISTEN", "127.0.0.1:0")
	n, err = New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv}})
	require.NoError(t, err)
	require.Greater(t, len(listening(t)), len(before), "KVBM_TCP_LISTEN: it listens from create")
	require.NoError(t, n.Close())
}

// The host a node is told to advertise (the address a P/D role is given)
// is where it listens from its first export, and what its metadata names.
func TestANodeListensOnTheHostItIsToldToAdvertise(t *testing.T) {
	drv := newDriver(t)
	for _, k := range []string{"KVBM_TRANSPORT", "KVBM_TCP_LISTEN", "KVBM_TCP_ADVERTISE", "KVBM_SAME_HOST"} {
		t.Setenv(k, "")
	}
	before := listening(t)
	n, err := New(Config{Worker: worker.StandaloneConfig{WorkerID: 1, Driver: drv}, Advertise: "127.0.0.2"})
	require.NoError(t, err)
	defer n.Close()
	md, err := n.Worker().ExportMetadata()
	require.NoError(t, err)
	var tcp []string
	for _, l := range listening(t)[len(before):] {
		if strings.HasPrefix(l, "tcp ") {
			tcp = append(tcp, l)
		}
	}
	require.Len(t, tcp, 1)
	require.True(t, strings.HasPrefix(tcp[0], "tcp 0200007F:"), "on 127.0.0.2 only: %s", tcp[0])
	require.True(t, bytes.Contains(md, []byte("127.0.0.2")), "the metadata names the host peers dial")
}
