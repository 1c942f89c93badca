//go:build cgo

package ucx

import (
	"context"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

// What an rkey guards where UCX emulates reads with messages (tcp, here
// between two workers of one process): a peer that holds any rkey of the
// exporter asks for bytes at an address outside every registered region,
// here a secret in memory the exporter never registered. Our own client
// refuses such an address (rma); a peer that is not our client need not,
// so this widens the importer's view of the region to stand in for one.
// The test records what the exporter's UCX does: it reads and sends the
// bytes, whatever the rkey covers (a hardware rkey would fault instead).
func TestEmulatedReadsAreNotBoundedByTheRkey(t *testing.T) {
	needUCX(t)
	// TCP only: in one process UCX's default may pick its self transport,
	// which reads the process's own memory by design.
	for _, tc := range tlsCases[1:] {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{OneSided: true, Options: tc.opts}, 5*time.Second)
			imp := newSide(t, emu, 0x1, Config{OneSided: true, Options: tc.opts}, 5*time.Second)
			h := exp.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			secret, sb, dst := secretAndDestination(t, emu)
			p := imp.importAll(t, exp)
			l := p.layouts[h]
			l.regions = l.regions[:1]
			l.regions[0].base, l.regions[0].size = 0, 1<<62 // a client that checks nothing
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := p.Read(ctx, h, []transfer.RemoteOp{{Remote: secret, Local: dst, Size: secretSize}})
			db, berr := emu.Bytes(dst, secretSize)
			require.NoError(t, berr)
			leaked := err == nil && string(db) == string(sb)
			t.Logf("UCX %s, %s: read outside every registered region: err=%v, secret copied: %v", Version(), tc.name, err, leaked)
			require.True(t, leaked, "the emulated read was refused: UCX checks the address here, update docs/data-plane.md")
		})
	}
}

// The message mode's exporter has no RMA: the same forged read (UCX's
// software RMA, an rkey of another worker, an address the exporter never
// registered) reaches no handler there. The read fails at its deadline,
// the secret stays where it is, and the exporter serves its own importers
// on.
func TestTheMessageModeServesNoRMA(t *testing.T) {
	needUCX(t)
	for _, tc := range tlsCases[1:] {
		t.Run(tc.name, func(t *testing.T) {
			emu := newEmu(t)
			exp := newSide(t, emu, 0xE, Config{Options: tc.opts}, 5*time.Second)
			keys := newSide(t, emu, 0xF, Config{OneSided: true, Options: tc.opts}, 5*time.Second)
			attacker := newSide(t, emu, 0x1, Config{OneSided: true, Options: tc.opts}, 300*time.Millisecond)
			h := exp.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			exp.fill(t, h, 0x100)
			keys.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			secret, sb, dst := secretAndDestination(t, emu)

			// The exporter's address, with an rkey UCX will unpack.
			ep, err := exp.tr.Endpoint()
			require.NoError(t, err)
			info, err := decodeEndpoint(ep)
			require.NoError(t, err)
			kep, err := keys.tr.Endpoint()
			require.NoError(t, err)
			kinfo, err := decodeEndpoint(kep)
			require.NoError(t, err)
			info.mode = modeOneSided
			info.layouts[0].regions = []regionInfo{{base: 0, size: 1 << 62, rkey: kinfo.layouts[0].regions[0].rkey}}
			info.layouts = info.layouts[:1]
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			p, err := attacker.tr.Connect(ctx, info.encode())
			require.NoError(t, err, "UCX connects: the endpoint is reachable")
			t.Cleanup(func() { require.NoError(t, p.Close()) })
			rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer rcancel()
			err = p.(*Peer).Read(rctx, info.layouts[0].handle, []transfer.RemoteOp{{Remote: secret, Local: dst, Size: secretSize}})
			require.ErrorIs(t, err, remote.ErrPeerUnavailable)
			db, err := emu.Bytes(dst, secretSize)
			require.NoError(t, err)
			require.NotEqual(t, string(sb), string(db), "the secret was read")

			imp := newSide(t, emu, 0x2, Config{Options: tc.opts}, 5*time.Second)
			imp.importAll(t, exp)
			local := imp.alloc(t, storage.Pinned, smallConfig(2), transfer.FullyContiguous)
			require.NoError(t, move(t, imp.m, h, []int{0, 1}, local, []int{0, 1}))
			imp.check(t, local, 1, 0x101)
		})
	}
}

// secretSize is the size of secretAndDestination's buffers.
const secretSize = 4096

// secretAndDestination allocates host memory of the process that no
// layout registers, holding a pattern (the secret, and its bytes), and a
// buffer to read it into.
func secretAndDestination(t *testing.T, emu *cuda.Emulated) (secret uint64, sb []byte, dst uint64) {
	t.Helper()
	secret, err := emu.HostAlloc(0, secretSize)
	require.NoError(t, err)
	dst, err = emu.HostAlloc(0, secretSize)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, emu.HostFree(secret)); require.NoError(t, emu.HostFree(dst)) })
	sb, err = emu.Bytes(secret, secretSize)
	require.NoError(t, err)
	copy(sb, pattern(secretSize, 0x5EC))
	return secret, sb, dst
}
