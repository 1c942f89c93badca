//go:build cgo

package ucx

import (
	"context"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
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
			const size = 4096
			secret, err := emu.HostAlloc(0, size) // the exporter's, never registered
			require.NoError(t, err)
			dst, err := emu.HostAlloc(0, size)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, emu.HostFree(secret)); require.NoError(t, emu.HostFree(dst)) })
			sb, err := emu.Bytes(secret, size)
			require.NoError(t, err)
			copy(sb, pattern(size, 0x5EC))
			p := imp.importAll(t, exp)
			l := p.layouts[h]
			l.regions = l.regions[:1]
			l.regions[0].base, l.regions[0].size = 0, 1<<62 // a client that checks nothing
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = p.Read(ctx, h, []transfer.RemoteOp{{Remote: secret, Local: dst, Size: size}})
			db, berr := emu.Bytes(dst, size)
			require.NoError(t, berr)
			leaked := err == nil && string(db) == string(sb)
			t.Logf("UCX %s, %s: read outside every registered region: err=%v, secret copied: %v", Version(), tc.name, err, leaked)
			require.True(t, leaked, "the emulated read was refused: UCX checks the address here, update docs/data-plane.md")
		})
	}
}
