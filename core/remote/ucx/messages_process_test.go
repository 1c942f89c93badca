//go:build cgo

package ucx

import (
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
	"github.com/stretchr/testify/require"
)

// The message mode between two processes: a pull of every block, every
// byte checked; then, the exporter stopped (SIGSTOP) before it answers, a
// pull fails at its deadline, and once the exporter runs again its late
// answer lands nowhere: the destination holds what the importer wrote
// after the failure, and the next pull reads the exporter's blocks.
func TestMessagesBetweenTwoProcesses(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := layout.Config{NumBlocks: 64, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 64, DtypeWidth: 2}
			h := startHelper(t, helperSpec{Config: cfg, Kind: storage.Pinned, Tag: 0x700, Options: tc.opts})
			s := newSide(t, newEmu(t), 0x1, Config{Options: tc.opts}, 500*time.Millisecond)
			p, src := h.connect(t, s)
			dst := s.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			ids := seq(0, 64)
			require.NoError(t, move(t, s.m, src, ids, dst, ids))
			for _, id := range ids {
				s.check(t, dst, id, 0x700+uint64(id))
			}
			for round := 0; round < 3; round++ {
				s.fill(t, dst, 0x100)
				require.NoError(t, h.cmd.Process.Signal(syscall.SIGSTOP))
				err := move(t, s.m, src, ids, dst, ids)
				require.ErrorIs(t, err, remote.ErrPeerUnavailable)
				require.ErrorIs(t, err, kvbmerr.ErrTimeout)
				s.fill(t, dst, 0xBEEF00) // reused at once
				require.NoError(t, h.cmd.Process.Signal(syscall.SIGCONT))
				require.Eventually(t, func() bool { return p.t.lateDropped.Load() > uint64(round) }, 10*time.Second, 5*time.Millisecond,
					"the exporter's late answer reaches the importer")
				for _, id := range ids {
					s.check(t, dst, id, 0xBEEF00+uint64(id))
				}
			}
			require.NoError(t, move(t, s.m, src, ids, dst, ids))
			for _, id := range ids {
				s.check(t, dst, id, 0x700+uint64(id))
			}
			require.Zero(t, sinksLive())
		})
	}
}

// An importing process killed while it pulls leaves the exporter
// serving (the one-sided mode's UCX aborts the exporter there,
// TestImporterProcessKilled): the exporter answers on an endpoint of its
// own, whose failure it handles, and another importer pulls from it.
func TestMessagesImporterProcessKilled(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := layout.Config{NumBlocks: 64, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 64, DtypeWidth: 2}
			exp := newSide(t, newEmu(t), 0xE, Config{Options: tc.opts}, time.Second)
			src := exp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			exp.fill(t, src, 0x300)
			ep, err := exp.tr.Endpoint()
			require.NoError(t, err)
			d, err := exp.m.Describe(src)
			require.NoError(t, err)
			hello := &helperHello{Endpoint: ep, Descs: []transfer.Descriptor{d}}
			for round := 0; round < 5; round++ {
				h := startPuller(t, helperSpec{Config: cfg, Kind: storage.Pinned, Options: tc.opts, Pull: hello})
				time.Sleep(20 * time.Millisecond)
				require.NoError(t, h.cmd.Process.Kill())
				h.stop()
			}
			imp := newSide(t, newEmu(t), 0x1, Config{Options: tc.opts}, time.Second)
			imp.importAll(t, exp)
			dst := imp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
			require.NoError(t, move(t, imp.m, src, seq(0, 64), dst, seq(0, 64)))
			for id := 0; id < 64; id++ {
				imp.check(t, dst, id, 0x300+uint64(id))
			}
		})
	}
}
