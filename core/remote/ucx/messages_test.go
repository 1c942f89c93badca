//go:build cgo

package ucx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

// The message mode between two managers of one process: blocks pulled
// from the exporter's pinned (G2) and emulated device (G1) layouts of
// both shapes, every byte checked, blocks not moved unchanged; a push is
// refused and changes nothing; every sink (pull.go) is freed.
func TestMessagesPull(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{Options: tc.opts}, 10*time.Second)
			imp := newSide(t, emu, 0x1, Config{Options: tc.opts}, 10*time.Second)
			for _, kind := range []storage.Kind{storage.Pinned, storage.Device} {
				for _, shape := range []transfer.Shape{transfer.FullyContiguous, {Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}} {
					src := exp.alloc(t, kind, smallConfig(8), shape)
					exp.fill(t, src, 0x100)
					dst := imp.alloc(t, storage.Pinned, smallConfig(8), transfer.FullyContiguous)
					imp.fill(t, dst, 0x900)
					p := imp.importAll(t, exp)
					require.NoError(t, move(t, imp.m, src, []int{1, 2, 5}, dst, []int{0, 3, 7}))
					for i, id := range []int{0, 3, 7} {
						imp.check(t, dst, id, 0x100+uint64([]int{1, 2, 5}[i]))
					}
					for _, id := range []int{1, 2, 4, 5, 6} {
						imp.check(t, dst, id, 0x900+uint64(id))
					}
					err := move(t, imp.m, dst, []int{0}, src, []int{4})
					require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
					require.ErrorContains(t, err, "pulls only")
					exp.check(t, src, 4, 0x104)
					require.NoError(t, p.Close())
				}
			}
			require.Zero(t, sinksLive())
		})
	}
}

// Many reads at once through one session: the exporter serves
// maxServingReads of them at a time and queues the rest; every one is
// answered, every byte where it belongs.
func TestMessagesManyReadsAtOnce(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{}, 10*time.Second)
	imp := newSide(t, emu, 0x1, Config{}, 10*time.Second)
	const n = 4 * maxServingReads
	src := exp.alloc(t, storage.Pinned, smallConfig(n), transfer.FullyContiguous)
	exp.fill(t, src, 0x100)
	dst := imp.alloc(t, storage.Pinned, smallConfig(n), transfer.FullyContiguous)
	imp.importAll(t, exp)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- move(t, imp.m, src, []int{i}, dst, []int{n - 1 - i}) }()
	}
	for i := 0; i < n; i++ {
		require.NoError(t, <-errs)
	}
	for i := 0; i < n; i++ {
		imp.check(t, dst, n-1-i, 0x100+uint64(i))
	}
}

// A pull that ends while one of its data messages is being received
// (its deadline, here forced on the progress thread the moment part of
// the message has landed) gets no byte more: UCX goes on receiving the
// message, its pieces are dropped, and the destination holds exactly
// what it held when the pull was answered; the sink is freed once UCX is
// done with it, and the next pull is whole.
func TestMessagesPullEndedMidMessageLandsNoMore(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{Options: tc.opts}, 10*time.Second)
			imp := newSide(t, emu, 0x1, Config{Options: tc.opts}, 10*time.Second)
			cfg := smallConfig(64)
			cfg.InnerDim = 1024 // 64 KiB blocks: one data message of 4 MiB
			src := exp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			exp.fill(t, src, 0x100)
			dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			imp.importAll(t, exp)
			ids := seq(0, 64)
			for round := 0; round < 3; round++ {
				imp.fill(t, dst, 0x900)
				cause := errors.New("the deadline (forced)")
				var (
					ended            *pull
					sink             *_Ctype_struct_kvbm_ucx_sink
					atAnswer, landed []byte
				)
				// The progress thread is held from before the pull is asked,
				// and turned by hand, one progress at a time.
				driving, started := make(chan error, 1), make(chan struct{})
				go func() {
					driving <- imp.tr.do(func() error {
						close(started)
						for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
							select {
							case fn := <-imp.tr.cmds:
								fn()
							default:
							}
							imp.tr.progress(1)
							imp.tr.deliver()
							imp.tr.reapInflight()
							for _, r := range imp.tr.pulls {
								for _, s := range r.sinks {
									if s.landed > 0 && s.landed < s.total {
										ended, sink = r, s
									}
								}
							}
							if ended == nil {
								continue
							}
							sink.refs++ // kept, to read its counts once UCX is done with it
							imp.tr.endPull(ended, cause)
							for _, l := range ended.local {
								atAnswer = append(atAnswer, storage.HostBytes(l.addr, l.size)...)
							}
							return nil
						}
						return errors.New("no data message was seen part-way")
					})
				}()
				<-started
				errs := make(chan error, 1)
				go func() { errs <- move(t, imp.m, src, ids, dst, ids) }()
				require.NoError(t, <-driving)
				require.ErrorIs(t, <-errs, cause)
				// UCX receives the rest of the message; it is dropped.
				require.Eventually(t, func() bool {
					var done bool
					require.NoError(t, imp.tr.do(func() error { done = sink.refs == 1; return nil }))
					return done
				}, 10*time.Second, 5*time.Millisecond, "UCX finishes the receive")
				// Read on the progress thread, checked here (a failed require
				// would end the progress thread).
				var total, got, dropped uint64
				require.NoError(t, imp.tr.do(func() error {
					total, got, dropped = uint64(sink.total), uint64(sink.landed), uint64(sink.dropped)
					releaseSink(sink)
					for _, l := range ended.local {
						landed = append(landed, storage.HostBytes(l.addr, l.size)...)
					}
					return nil
				}))
				require.Positive(t, dropped, "pieces came after the pull ended")
				require.Equal(t, total, got+dropped)
				require.True(t, bytes.Equal(atAnswer, landed), "a byte landed after the pull was answered")
				require.Zero(t, sinksLive())
				require.NoError(t, move(t, imp.m, src, ids, dst, ids))
				for _, id := range ids {
					imp.check(t, dst, id, 0x100+uint64(id))
				}
			}
		})
	}
}

// A pull whose exporter does not answer within the deadline fails, and
// the exporter's answer that comes after (its progress thread frozen,
// then thawed) lands nowhere: the destination blocks hold what they held
// before, byte for byte, every sink is freed once UCX is done with it, and the peer pulls again (a deadline fails the pull, not
// the session).
func TestMessagesLateRepliesLandNowhere(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases {
		for _, kind := range []storage.Kind{storage.Pinned, storage.Device} {
			t.Run(tc.name+"/"+kind.String(), func(t *testing.T) {
				emu := newEmu(t)
				exp := newSide(t, emu, 0xE, Config{Options: tc.opts}, 10*time.Second)
				const deadline = 300 * time.Millisecond
				imp := newSide(t, emu, 0x1, Config{Options: tc.opts}, deadline)
				cfg := smallConfig(64)
				cfg.InnerDim = 1024 // 64 KiB blocks: 4 MiB in all, sent by rendezvous
				src := exp.alloc(t, kind, cfg, transfer.FullyContiguous)
				exp.fill(t, src, 0x100)
				dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
				imp.fill(t, dst, 0x900)
				imp.importAll(t, exp)
				ids := seq(0, 64)
				for round := 0; round < 3; round++ {
					late := imp.tr.lateDropped.Load()
					thaw := freeze(t, exp.tr)
					err := move(t, imp.m, src, ids, dst, ids)
					require.ErrorIs(t, err, remote.ErrPeerUnavailable)
					require.ErrorIs(t, err, kvbmerr.ErrTimeout)
					thaw()
					// The late answer arrives and is dropped.
					require.Eventually(t, func() bool { return imp.tr.lateDropped.Load() > late }, 5*time.Second, 5*time.Millisecond)
					require.Eventually(t, func() bool { return sinksLive() == 0 }, 5*time.Second, 10*time.Millisecond)
					time.Sleep(50 * time.Millisecond)
					for _, id := range ids {
						imp.check(t, dst, id, 0x900+uint64(id))
					}
				}
				require.NoError(t, move(t, imp.m, src, ids, dst, ids))
				for _, id := range ids {
					imp.check(t, dst, id, 0x100+uint64(id))
				}
			})
		}
	}
}

// The endpoint is the capability: an importer holding another worker's,
// a damaged one or one whose key was replaced (the address alone) is
// refused at the hello and reads nothing; the exporter counts it.
func TestMessagesNeedTheCapability(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{}, 5*time.Second)
	other := newSide(t, emu, 0xF, Config{}, 5*time.Second)
	imp := newSide(t, emu, 0x1, Config{}, 5*time.Second)
	exp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	otherEp, err := other.tr.Endpoint()
	require.NoError(t, err)
	info, err := decodeEndpoint(ep)
	require.NoError(t, err)
	oi, err := decodeEndpoint(otherEp)
	require.NoError(t, err)

	forged := *info
	forged.key = oi.key // a key of another worker, the address of this one
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	before := exp.tr.Refused()
	_, err = imp.tr.Connect(ctx, forged.encode())
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorContains(t, err, "refused the hello")
	require.Greater(t, exp.tr.Refused(), before)

	// The right capability connects.
	p, err := imp.tr.Connect(ctx, ep)
	require.NoError(t, err)
	require.NoError(t, p.Close())
}

// A worker that exported no endpoint serves no peer: before it exported
// or connected it has no UCX worker (exposure_test.go), and once it has
// one, to pull from others, a hello to its address goes unanswered.
func TestMessagesNothingIsServedBeforeAnExport(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{}, 5*time.Second)
	imp := newSide(t, emu, 0x1, Config{}, 5*time.Second)
	var address []byte
	var before []byte
	require.NoError(t, exp.tr.do(func() error {
		before = exp.tr.address
		err := exp.tr.openWorker() // as a connect to another exporter does
		address = exp.tr.address
		return err
	}))
	require.Nil(t, before, "a UCX worker before an export or a connect")
	info := endpointInfo{address: address, proc: thisProcess(), segs: exp.tr.segs, worker: 0xE, scope: capability.ScopeReadWrite}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := imp.tr.Connect(ctx, info.encode())
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorContains(t, err, "did not answer the hello")
}

// pair is an exporter and an importer of one process, each with a layout
// of n blocks: the exporter's filled with pattern(0x100+id), the
// importer's with pattern(0x900+id). exporter, when not nil, adjusts the
// exporter's transport (on its progress thread) before anything is
// imported.
type pair struct {
	emu      *cuda.Emulated
	exp, imp *side
	src, dst transfer.LayoutHandle
}

func newPair(t *testing.T, n int, exporter func(*Transport)) pair {
	t.Helper()
	emu := newEmu(t)
	pr := pair{emu: emu, exp: newSide(t, emu, 0xE, Config{}, 5*time.Second)}
	if exporter != nil {
		require.NoError(t, pr.exp.tr.do(func() error { exporter(pr.exp.tr); return nil }))
	}
	pr.imp = newSide(t, emu, 0x1, Config{}, 5*time.Second)
	pr.src = pr.exp.alloc(t, storage.Pinned, smallConfig(n), transfer.FullyContiguous)
	pr.exp.fill(t, pr.src, 0x100)
	pr.dst = pr.imp.alloc(t, storage.Pinned, smallConfig(n), transfer.FullyContiguous)
	pr.imp.fill(t, pr.dst, 0x900)
	return pr
}

// A peer without a session reads nothing: a read naming a session the
// exporter does not have (guessed, or one it ended) is counted and
// answered "no session" and nothing else; the peer fails, and importing
// the metadata again connects a new session.
func TestMessagesReadWithoutASessionReadsNothing(t *testing.T) {
	needUCX(t)
	pr := newPair(t, 4, nil)
	exp, imp, src, dst := pr.exp, pr.imp, pr.src, pr.dst
	p := imp.importAll(t, exp)
	p.session = sessionID{1, 2, 3} // guessed
	before := exp.tr.Refused()
	err := move(t, imp.m, src, []int{0}, dst, []int{0})
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorContains(t, err, "has no session for this peer")
	require.Greater(t, exp.tr.Refused(), before)
	require.Error(t, p.Broken())
	imp.check(t, dst, 0, 0x900)

	imp.importAll(t, exp)
	require.NoError(t, move(t, imp.m, src, []int{0}, dst, []int{0}))
	imp.check(t, dst, 0, 0x100)
}

// An importer that opens sessions without end evicts its own, never
// another importer's: past the limit, the oldest session of the importer
// holding the most is closed.
func TestMessagesSessionsPastTheLimitEvictTheirOwn(t *testing.T) {
	needUCX(t)
	pr := newPair(t, 2, func(tr *Transport) { tr.maxSessions = 4 })
	exp, good, src, dst := pr.exp, pr.imp, pr.src, pr.dst
	flood := newSide(t, pr.emu, 0x2, Config{}, 5*time.Second)
	good.importAll(t, exp)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := flood.tr.Connect(ctx, ep)
		cancel()
		require.NoError(t, err)
		defer p.Close()
	}
	held := map[[32]byte]int{}
	require.NoError(t, exp.tr.do(func() error {
		for _, s := range exp.tr.sessions {
			held[s.importer]++
		}
		return nil
	}))
	require.Len(t, held, 2, "both importers keep sessions")
	require.Equal(t, 1, held[sha256.Sum256(good.tr.address)], "%v", held)
	require.Equal(t, 3, held[sha256.Sum256(flood.tr.address)], "%v", held)
	require.NoError(t, move(t, good.m, src, []int{0, 1}, dst, []int{1, 0}))
	good.check(t, dst, 1, 0x100)
	good.check(t, dst, 0, 0x101)
}

// The ops that reads hold while served or queued are bounded: a read that
// could never fit is refused and costs nothing; one that does not fit now
// is answered busy and asked again until it fits; what reads held is
// given back once they are answered.
func TestMessagesHeldOpsAreBounded(t *testing.T) {
	needUCX(t)
	pr := newPair(t, 8, func(tr *Transport) { tr.maxHeldOps = 4 })
	exp, imp, src, dst := pr.exp, pr.imp, pr.src, pr.dst
	imp.importAll(t, exp)
	// Reversed, so that no two blocks coalesce into one op.
	err := move(t, imp.m, src, []int{0, 1, 2, 3, 4, 5}, dst, []int{5, 4, 3, 2, 1, 0})
	require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
	require.ErrorContains(t, err, "a read of 6 ops, more than a session's reads may hold (4)")
	for id := 0; id < 8; id++ {
		imp.check(t, dst, id, 0x900+uint64(id))
	}

	// Others' reads hold 3 ops for a while: a read of 3 waits, then goes.
	require.NoError(t, exp.tr.do(func() error { exp.tr.ops = 3; return nil }))
	release := time.AfterFunc(100*time.Millisecond, func() { exp.tr.post(func() { exp.tr.ops = 0 }) })
	defer release.Stop()
	start := time.Now()
	require.NoError(t, move(t, imp.m, src, []int{0, 1, 2}, dst, []int{2, 1, 0}))
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "the read went before the ops were given back")
	require.NoError(t, move(t, imp.m, src, []int{3, 4, 5}, dst, []int{5, 4, 3}))
	for i := 0; i < 3; i++ {
		imp.check(t, dst, 2-i, 0x100+uint64(i))
		imp.check(t, dst, 5-i, 0x103+uint64(i))
	}
	var held int
	require.NoError(t, exp.tr.do(func() error { held = exp.tr.ops; return nil }))
	require.Zero(t, held)
}

// A pull of more ops than a read carries is asked as several reads.
func TestMessagesLargePullsAreSeveralReads(t *testing.T) {
	needUCX(t)
	was := readOps
	readOps = 2
	t.Cleanup(func() { readOps = was })
	pr := newPair(t, 8, nil)
	exp, imp, src, dst := pr.exp, pr.imp, pr.src, pr.dst
	imp.importAll(t, exp)
	before := exp.tr.Served()
	require.NoError(t, move(t, imp.m, src, []int{0, 1, 2, 3, 4}, dst, []int{4, 3, 2, 1, 0}))
	for i := 0; i < 5; i++ {
		imp.check(t, dst, 4-i, 0x100+uint64(i))
	}
	// Served counts a read once its status went: the importer may be first.
	require.Eventually(t, func() bool { return exp.tr.Served() == before+3 }, 5*time.Second, time.Millisecond)
}

// An exporter that sends a read's bytes again, bytes the read did not ask
// for, an empty message or more messages than the read allows (a kvbm
// that breaks the protocol, or one that is not kvbm) fails the pull at
// the first such message, which reaches nothing and holds no receive of
// the importer: every sink is freed, and the next pull is whole.
func TestMessagesAPullTakesOnlyWhatItAskedFor(t *testing.T) {
	needUCX(t)
	const blocks = 8
	cfg := smallConfig(blocks)
	cfg.InnerDim = 1024 // 64 KiB blocks: 8 ops, sent by rendezvous
	const total = blocks * 64 << 10
	cases := []struct {
		name   string
		break_ func(cs []dataChunk) []dataChunk
		err    string
	}{
		{"again", func(cs []dataChunk) []dataChunk { return append(cs, cs...) }, "of the read again"},
		{"beyond", func(cs []dataChunk) []dataChunk {
			c := cs[len(cs)-1]
			c.offset += total
			return append(cs[:len(cs)-1], c)
		}, "of a read of 524288 bytes"},
		{"empty", func(cs []dataChunk) []dataChunk {
			return append([]dataChunk{{offset: 0, pieces: []piece{{cs[0].pieces[0].addr, 0}}}}, cs...)
		}, "a data message of no bytes"},
		{"too many", func(cs []dataChunk) []dataChunk {
			var out []dataChunk // 4 KiB messages: 128, where the read allows 8+2+1
			for _, c := range cs {
				for _, p := range c.pieces {
					for off := uint64(0); off < p.size; off += 4 << 10 {
						out = append(out, dataChunk{offset: c.offset + off, size: 4 << 10, pieces: []piece{{p.addr + off, 4 << 10}}})
					}
				}
			}
			return out
		}, "more than 11 data messages for a read of 524288 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{}, 5*time.Second)
			var reads atomic.Int32
			require.NoError(t, exp.tr.do(func() error {
				exp.tr.breakChunks = func(cs []dataChunk) []dataChunk {
					if reads.Add(1) > 1 {
						return cs // the next read is served as it should be
					}
					return tc.break_(cs)
				}
				return nil
			}))
			imp := newSide(t, emu, 0x1, Config{}, 5*time.Second)
			src := exp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			exp.fill(t, src, 0x100)
			dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			imp.fill(t, dst, 0x900)
			imp.importAll(t, exp)
			ids := seq(0, blocks)
			err := move(t, imp.m, src, ids, dst, ids)
			require.ErrorIs(t, err, kvbmerr.ErrIO)
			require.ErrorContains(t, err, "the exporting worker e sent ")
			require.ErrorContains(t, err, tc.err)
			require.Eventually(t, func() bool { return sinksLive() == 0 }, 5*time.Second, 5*time.Millisecond, "%d sinks live", sinksLive())
			require.NoError(t, move(t, imp.m, src, ids, dst, ids))
			for _, id := range ids {
				imp.check(t, dst, id, 0x100+uint64(id))
			}
		})
	}
}

// A block-scoped endpoint reads its blocks and nothing else: another
// block, once the scope's blocks are revoked, is refused by the exporter.
func TestMessagesBlockScope(t *testing.T) {
	needUCX(t)
	pr := newPair(t, 8, nil)
	exp, imp, src, dst := pr.exp, pr.imp, pr.src, pr.dst
	ep, err := exp.tr.ScopedEndpoint(remote.Scope{Layouts: []remote.ScopedLayout{{Layout: src, Blocks: []int{2, 3}}}})
	require.NoError(t, err)
	d, err := exp.m.Describe(src)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := imp.tr.Connect(ctx, ep)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	require.IsType(t, &remote.ScopedPeer{}, p, "a block scope's peer joins others of its exporter")
	_, err = imp.m.Import(p, []transfer.Descriptor{d})
	require.NoError(t, err)

	require.NoError(t, move(t, imp.m, src, []int{2, 3}, dst, []int{0, 1}))
	imp.check(t, dst, 0, 0x102)
	imp.check(t, dst, 1, 0x103)
	// Past the importer's own routing, the exporter refuses.
	own := p.(*remote.ScopedPeer).Own().(*Peer)
	l, _, err := exp.m.Layout(src)
	require.NoError(t, err)
	b4, err := l.BlockRegion(4)
	require.NoError(t, err)
	buf := make([]byte, b4.Size)
	local := uint64(uintptr(unsafe.Pointer(&buf[0])))
	err = own.Read(ctx, src, []transfer.RemoteOp{{Remote: b4.Addr, Local: local, Size: b4.Size}})
	require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
	require.ErrorContains(t, err, "does not cover blocks 4 to 4")
	err = move(t, imp.m, src, []int{4}, dst, []int{2})
	require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
	imp.check(t, dst, 2, 0x902)

	require.NoError(t, exp.tr.RevokeBlocks([]remote.ScopedLayout{{Layout: src, Blocks: []int{3}}}))
	err = own.Read(ctx, src, []transfer.RemoteOp{{Remote: b4.Addr - b4.Size, Local: local, Size: b4.Size}}) // block 3
	require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
	require.ErrorContains(t, err, "revoked")
	imp.check(t, dst, 3, 0x903)
	require.NoError(t, move(t, imp.m, src, []int{2}, dst, []int{4}), "the blocks not revoked still read")
	imp.check(t, dst, 4, 0x102)
}

// A layout withdrawn by its owner is refused to peers with the reason,
// and the exporter keeps serving its other layouts: no rkey of it ever
// left the process.
func TestMessagesWithdrawnLayout(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{}, 5*time.Second)
	imp := newSide(t, emu, 0x1, Config{}, 5*time.Second)
	cfg := smallConfig(4)
	mem, err := storage.AllocDevice(emu, 0, uint64(cfg.BlockSize()*cfg.NumBlocks))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, mem.Close()) })
	gone, err := exp.m.RegisterExternal(storage.Device, cfg, transfer.FullyContiguous, []uint64{mem.Addr()})
	require.NoError(t, err)
	kept := exp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	exp.fill(t, kept, 0x100)
	dst := imp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	imp.fill(t, dst, 0x900)
	imp.importAll(t, exp)
	require.NoError(t, exp.m.Withdraw(gone, "the engine slept"))
	require.NoError(t, exp.tr.Withdrawn(gone))
	err = move(t, imp.m, gone, []int{0}, dst, []int{0})
	require.ErrorIs(t, err, transfer.ErrWithdrawn)
	require.ErrorContains(t, err, "the engine slept")
	imp.check(t, dst, 0, 0x900)
	require.NoError(t, move(t, imp.m, kept, []int{1}, dst, []int{1}))
	imp.check(t, dst, 1, 0x101)
}

// The modes do not mix: an importer of the other mode is told why.
func TestMessagesAndOneSidedDoNotMix(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{}, 5*time.Second)
	imp := newSide(t, emu, 0x1, Config{OneSided: true}, 5*time.Second)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	_, err = imp.tr.Connect(context.Background(), ep)
	require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
	require.ErrorContains(t, err, EnvOneSided)
}

// A read's bytes are cut into data messages that keep their order and
// offsets: contiguous pieces join, up to 4 MiB a message; small separate
// pieces (a block's fragments) travel together; large ones alone.
func TestChunksKeepEveryByteInOrder(t *testing.T) {
	mem := make([]byte, 64<<20)
	at := func(off, n int) []byte { return mem[off : off+n] }
	for _, tc := range []struct {
		name   string
		pieces [][]byte
		chunks int
	}{
		{"one contiguous run of 10 MiB", [][]byte{at(0, 4<<20), at(4<<20, 6<<20)}, 3},
		{"256 separate fragments of 32 KiB", func() (ps [][]byte) {
			for i := 0; i < 256; i++ {
				ps = append(ps, at(i*64<<10, 32<<10))
			}
			return
		}(), 2},
		{"separate 2 MiB blocks", [][]byte{at(0, 2<<20), at(8<<20, 2<<20), at(16<<20, 2<<20)}, 3},
		{"a fragment, then a block", [][]byte{at(0, 32<<10), at(1<<20, 2<<20)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const base = 1000
			cs := chunk(tc.pieces, base)
			require.Len(t, cs, tc.chunks)
			var want, got []uint64 // every byte's address, in request order
			for _, p := range tc.pieces {
				a := uint64(uintptr(unsafe.Pointer(&p[0])))
				for i := range uint64(len(p)) {
					want = append(want, a+i)
				}
			}
			off := uint64(base)
			for _, c := range cs {
				require.Equal(t, off, c.offset)
				require.LessOrEqual(t, c.size, uint64(chunkBytes))
				require.LessOrEqual(t, len(c.pieces), maxPieces)
				n := uint64(0)
				for _, p := range c.pieces {
					for i := range p.size {
						got = append(got, p.addr+i)
					}
					n += p.size
				}
				require.Equal(t, c.size, n)
				off += c.size
			}
			require.Equal(t, want, got)
		})
	}
}

// With a deployment key (KVBM_AUTH_KEY), the hello is proved under it
// too: an importer with another key, or none, is refused with the
// metadata in hand; one with the same key connects.
func TestMessagesDeploymentKey(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	t.Setenv(capability.EnvAuthKey, "the-deployment-key-0123456789")
	exp := newSide(t, emu, 0xE, Config{}, 5*time.Second)
	same := newSide(t, emu, 0x1, Config{}, 5*time.Second)
	t.Setenv(capability.EnvAuthKey, "another-deployment-key-012345")
	other := newSide(t, emu, 0x2, Config{}, 5*time.Second)
	t.Setenv(capability.EnvAuthKey, "")
	none := newSide(t, emu, 0x3, Config{}, 5*time.Second)
	exp.alloc(t, storage.Pinned, smallConfig(4), transfer.FullyContiguous)
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range []*side{other, none} {
		_, err := s.tr.Connect(ctx, ep)
		require.ErrorIs(t, err, remote.ErrPeerUnavailable)
		require.ErrorContains(t, err, capability.EnvAuthKey+" differs")
	}
	p, err := same.tr.Connect(ctx, ep)
	require.NoError(t, err)
	require.NoError(t, p.Close())
}
