package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
)

// scopedRead reads bytes [off, off+size) of layout name through m (a
// scoped peer, or one of its members' connections).
func scopedRead(t *testing.T, p *tcpPair, m transfer.RemoteMemory, name string, off, size uint64) ([]byte, error) {
	t.Helper()
	d, err := p.exp.Describe(p.remote[name])
	require.NoError(t, err)
	buf, err := storage.AllocSystem(size)
	require.NoError(t, err)
	defer buf.Close()
	err = m.Read(context.Background(), p.remote[name], []transfer.RemoteOp{{Remote: d.Bases[0] + off, Local: buf.Addr(), Size: size}})
	return append([]byte(nil), storage.HostBytes(buf.Addr(), size)...), err
}

// connectScoped connects with a block scope of the pair's exporter and
// attaches its G2 and G1.
func connectScoped(t *testing.T, p *tcpPair, s remote.Scope) *remote.ScopedPeer {
	t.Helper()
	ep, err := p.expTCP.ScopedEndpoint(s)
	require.NoError(t, err)
	peer, err := p.impTCP.Connect(context.Background(), ep)
	require.NoError(t, err)
	t.Cleanup(func() { peer.Close() })
	sp, ok := peer.(*remote.ScopedPeer)
	require.True(t, ok, "a block-scoped endpoint connects a scoped peer")
	for _, name := range []string{"g2", "g1"} {
		d, err := p.exp.Describe(p.remote[name])
		require.NoError(t, err)
		a, err := sp.Attach(d)
		require.NoError(t, err)
		require.Same(t, sp, a.Memory)
	}
	return sp
}

// A block-scoped capability reads the blocks it names and nothing else:
// the server refuses (and counts, and logs) any other block, a range that
// reaches past its blocks, another layout, and any write, on TCP and on
// the same host, keeping the connection; the client refuses them too
// before asking.
func TestABlockScopeReadsItsBlocksOnly(t *testing.T) {
	for _, sameHost := range []bool{false, true} {
		l := captureLogs(t)
		p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: !sameHost})
		fill(t, p.exp, p.remote["g2"], 0x31)
		fill(t, p.exp, p.remote["g1"], 0x32)
		sp := connectScoped(t, p, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{2, 1, 5}}}})
		require.Equal(t, sameHost, SameHost(sp.Own().(*tcpPeer)))
		bs := uint64(p.cfg.BlockSize())
		for _, b := range []int{1, 2, 5} {
			got, err := scopedRead(t, p, sp, "g2", uint64(b)*bs, bs)
			require.NoError(t, err, "block %d is in scope", b)
			require.Equal(t, block(t, p.exp, p.remote["g2"], b), got)
		}
		got, err := scopedRead(t, p, sp, "g2", bs, 2*bs)
		require.NoError(t, err, "blocks 1 and 2 at once")
		require.Equal(t, append(block(t, p.exp, p.remote["g2"], 1), block(t, p.exp, p.remote["g2"], 2)...), got)

		d1, err := p.exp.Describe(p.remote["g1"])
		require.NoError(t, err)
		for name, read := range map[string]func(m transfer.RemoteMemory) error{
			"block 0":            func(m transfer.RemoteMemory) error { _, err := scopedRead(t, p, m, "g2", 0, bs); return err },
			"block 3":            func(m transfer.RemoteMemory) error { _, err := scopedRead(t, p, m, "g2", 3*bs, bs); return err },
			"blocks 2 and 3":     func(m transfer.RemoteMemory) error { _, err := scopedRead(t, p, m, "g2", 2*bs, 2*bs); return err },
			"the last byte of 4": func(m transfer.RemoteMemory) error { _, err := scopedRead(t, p, m, "g2", 5*bs-1, 2); return err },
			"G1":                 func(m transfer.RemoteMemory) error { _, err := scopedRead(t, p, m, "g1", 0, 64); return err },
			"a write": func(m transfer.RemoteMemory) error {
				return m.Write(context.Background(), p.remote["g2"], []transfer.RemoteOp{{Remote: d1.Bases[0], Local: 0, Size: 0}})
			},
		} {
			err := read(sp)
			require.ErrorIs(t, err, transfer.ErrUnsupported, "the client refuses %s", name)
			before := p.expTCP.RefusedOutOfScope()
			if name == "a write" {
				buf, err := storage.AllocSystem(bs)
				require.NoError(t, err)
				d, _ := p.exp.Describe(p.remote["g2"])
				err = sp.Own().Write(context.Background(), p.remote["g2"], []transfer.RemoteOp{{Remote: d.Bases[0] + bs, Local: buf.Addr(), Size: bs}})
				buf.Close()
				require.ErrorIs(t, err, transfer.ErrUnsupported, "the server refuses a write")
				require.ErrorContains(t, err, "reads only")
			} else {
				err = read(sp.Own().(*tcpPeer)) // past the client's check: the server's
				require.ErrorIs(t, err, transfer.ErrUnsupported, "the server refuses %s", name)
				require.ErrorContains(t, err, "request-scoped capability does not cover", name)
			}
			require.Equal(t, before+1, p.expTCP.RefusedOutOfScope(), "counted: %s", name)
			got, err := scopedRead(t, p, sp.Own().(*tcpPeer), "g2", 2*bs, bs)
			require.NoError(t, err, "the connection stays usable after refusing %s", name)
			require.Equal(t, block(t, p.exp, p.remote["g2"], 2), got)
		}
		require.Equal(t, block(t, p.exp, p.remote["g2"], 1), block(t, p.exp, p.remote["g2"], 1))
		require.Contains(t, l.String(), "refused a request outside its request-scoped capability")
	}
}

// A block scope of a device layout (layer-separate, block second): each
// fragment of its blocks reads, a fragment of another block is refused.
func TestABlockScopeOfADeviceLayout(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	fill(t, p.exp, p.remote["g1"], 0x33)
	sp := connectScoped(t, p, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g1"], Blocks: []int{3}}}})
	l, _, err := p.exp.Layout(p.remote["g1"])
	require.NoError(t, err)
	d, err := p.exp.Describe(p.remote["g1"])
	require.NoError(t, err)
	for layer := range p.cfg.NumLayers {
		for o := range p.cfg.OuterDim {
			f := l.Fragment(3, layer, o)
			_, err := scopedRead(t, p, sp.Own().(*tcpPeer), "g1", f.Addr-d.Bases[0], f.Size)
			require.NoError(t, err, "layer %d outer %d of block 3", layer, o)
			f = l.Fragment(4, layer, o)
			_, err = scopedRead(t, p, sp.Own().(*tcpPeer), "g1", f.Addr-d.Bases[0], f.Size)
			require.ErrorIs(t, err, transfer.ErrUnsupported, "layer %d outer %d of block 4", layer, o)
		}
	}
}

// A tampered descriptor (another block named under the same key), an
// expired scope, and one of another worker are refused at the hello; a
// scope that expires reads until then and is refused after.
func TestABlockScopeCannotBeWidenedOrOutlived(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	s := remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{1}}}}
	ep, err := p.expTCP.ScopedEndpoint(s)
	require.NoError(t, err)
	e, err := parseTCPEndpoint(ep)
	require.NoError(t, err)
	bs, err := capability.ParseBlockScope(e.desc)
	require.NoError(t, err)
	wider := bs
	wider.Layouts = []capability.LayoutRanges{{Layout: bs.Layouts[0].Layout, Ranges: capability.Ranges{{First: 0, Count: 8}}}}
	widened := e
	widened.desc = wider.AppendTo(nil)
	before := p.expTCP.Refused()
	_, err = p.impTCP.Connect(context.Background(), widened.append(nil))
	require.ErrorContains(t, err, "closed the connection at the hello", "widened")
	require.Equal(t, before+1, p.expTCP.Refused())

	stale := bs
	stale.Expires = uint64(time.Now().Unix() - 1)
	expired := e
	expired.desc = stale.AppendTo(nil)
	expired.key = p.expTCP.secret.Blocks(expired.desc) // as if exported then
	_, err = p.impTCP.Connect(context.Background(), expired.append(nil))
	require.ErrorContains(t, err, "closed the connection at the hello", "expired")

	_, err = p.expTCP.ScopedEndpoint(remote.Scope{Layouts: s.Layouts, Expires: time.Now().Add(-time.Second)})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument, "an expiry in the past")
	_, err = p.expTCP.ScopedEndpoint(remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{8}}}})
	require.ErrorIs(t, err, transfer.ErrOutOfRange, "a block the layout lacks")
	_, err = p.expTCP.ScopedEndpoint(remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.local["g2"], Blocks: []int{1}}}})
	require.ErrorIs(t, err, transfer.ErrNotFound, "another worker's layout")

	sp := connectScoped(t, p, remote.Scope{Layouts: s.Layouts, Expires: time.Now().Add(time.Second)})
	size := uint64(p.cfg.BlockSize())
	_, err = scopedRead(t, p, sp, "g2", size, size)
	require.NoError(t, err, "before it expires")
	require.Eventually(t, func() bool {
		_, err := scopedRead(t, p, sp, "g2", size, size)
		return err != nil
	}, 5*time.Second, 50*time.Millisecond, "refused once it expired")
	_, err = scopedRead(t, p, sp, "g2", size, size)
	require.ErrorContains(t, err, "expired")
}

// Scoped peers of one server join: a layout reached through the set
// reads the blocks of every member's scope, and a member that leaves
// takes its blocks with it; a peer of another server does not join.
func TestScopedPeersOfOneServerJoin(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	fill(t, p.exp, p.remote["g2"], 0x34)
	a := connectScoped(t, p, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{1}}}})
	b := connectScoped(t, p, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{6}}}})
	q := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	other := connectScoped(t, q, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: q.remote["g2"], Blocks: []int{6}}}})
	require.False(t, a.Join(other), "another server")
	require.False(t, a.Join(p.peer), "not a scoped peer")
	require.True(t, a.Join(b))
	bs := uint64(p.cfg.BlockSize())
	for _, blk := range []int{1, 6} {
		got, err := scopedRead(t, p, a, "g2", uint64(blk)*bs, bs)
		require.NoError(t, err, "block %d through the set", blk)
		require.Equal(t, block(t, p.exp, p.remote["g2"], blk), got)
	}
	_, err := scopedRead(t, p, a, "g2", 3*bs, bs)
	require.ErrorIs(t, err, transfer.ErrUnsupported, "block 3: nobody's")
	require.False(t, a.Leave(b))
	_, err = scopedRead(t, p, a, "g2", 6*bs, bs)
	require.ErrorIs(t, err, transfer.ErrUnsupported, "block 6 left with b")
	_, err = scopedRead(t, p, a, "g2", bs, bs)
	require.NoError(t, err, "a's own still reads")
	require.True(t, a.Leave(a), "empty")
}

// A read of one G2 block through a block-scoped capability, beside the
// same read through the read-only one in the same run: the scope's check
// per request, as a ratio (limit: ≥ 0.97 of the unscoped rate).
func BenchmarkScopedReadBesideReadOnly(b *testing.B) {
	p := newTCPPair(b, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	ro, err := p.expTCP.ReadOnlyEndpoint()
	require.NoError(b, err)
	plain, err := p.impTCP.Connect(context.Background(), ro)
	require.NoError(b, err)
	defer plain.Close()
	ep, err := p.expTCP.ScopedEndpoint(remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{0, 2, 4, 6}}}})
	require.NoError(b, err)
	sp, err := p.impTCP.Connect(context.Background(), ep)
	require.NoError(b, err)
	defer sp.Close()
	d, err := p.exp.Describe(p.remote["g2"])
	require.NoError(b, err)
	bs := uint64(p.cfg.BlockSize())
	buf, err := storage.AllocSystem(bs)
	require.NoError(b, err)
	defer buf.Close()
	ops := []transfer.RemoteOp{{Remote: d.Bases[0] + 2*bs, Local: buf.Addr(), Size: bs}}
	var mems [2]transfer.RemoteMemory // read-only, scoped
	var took [2]time.Duration
	for i, m := range []remote.Peer{plain, sp} {
		a, err := m.Attach(d)
		require.NoError(b, err)
		mems[i] = a.Memory
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += 100 { // interleaved rounds: both see the same machine
		for i, m := range mems {
			start := time.Now()
			for range min(100, b.N-done) {
				if err := m.Read(context.Background(), p.remote["g2"], ops); err != nil {
					b.Fatal(err)
				}
			}
			took[i] += time.Since(start)
		}
	}
	unscoped, scoped := float64(b.N)/took[0].Seconds(), float64(b.N)/took[1].Seconds()
	b.ReportMetric(unscoped, "read-only-reads/s")
	b.ReportMetric(scoped, "scoped-reads/s")
	b.ReportMetric(scoped/unscoped, "scoped/read-only")
}
