package transfer

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/stretchr/testify/require"
)

func TestRemoteChunkBytes(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		name       string
		total      uint64
		workers    int
		most, want uint64
	}{
		{"large: the peer's most", 512 * MiB, 4, 16 * MiB, 16 * MiB},
		{"every worker gets one", 32 * MiB, 4, 16 * MiB, 8 * MiB},
		{"never under the manager's own", 8 * MiB, 4, 16 * MiB, chunkBytes},
		{"a peer asking for less gets the manager's", 512 * MiB, 4, 1 * MiB, chunkBytes},
		{"no preference", 512 * MiB, 4, 0, chunkBytes},
		{"no workers counted", 512 * MiB, 0, 16 * MiB, 16 * MiB},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, remoteChunkBytes(c.total, c.workers, c.most))
		})
	}
}

// sizedPeer is hostPeer that wants reads of up to most bytes, and
// records the bytes of each read it was asked.
type sizedPeer struct {
	hostPeer
	most  uint64
	mu    *sync.Mutex
	reads *[]uint64
}

func (p sizedPeer) Attach(Descriptor) (Attachment, error) { return Attachment{Memory: p}, nil }

func (p sizedPeer) OpBytes() uint64 { return p.most }

func (p sizedPeer) Read(ctx context.Context, h LayoutHandle, ops []RemoteOp) error {
	var n uint64
	for _, o := range ops {
		n += o.Size
	}
	p.mu.Lock()
	*p.reads = append(*p.reads, n)
	p.mu.Unlock()
	return p.hostPeer.Read(ctx, h, ops)
}

// A peer that names the size of its reads (OpSizer) gets reads of that
// size when the transfer gives every net worker (4, the default) one; a
// peer that names none, or less than the manager's own size, the
// manager's 4 MiB; and every byte lands either way.
func TestReadsTakeThePeersSize(t *testing.T) {
	const MiB = 1 << 20
	cfg := layout.Config{NumBlocks: 64, NumLayers: 1, OuterDim: 1, PageSize: 1, InnerDim: 512 << 10, DtypeWidth: 2} // 1 MiB blocks
	for _, c := range []struct {
		name   string
		most   uint64
		blocks int
		want   []uint64
	}{
		{"16 MiB reads", 16 * MiB, 64, slices.Repeat([]uint64{16 * MiB}, 4)},
		{"spread over the workers", 16 * MiB, 32, slices.Repeat([]uint64{8 * MiB}, 4)},
		{"no preference", 0, 64, slices.Repeat([]uint64{4 * MiB}, 16)},
		{"less than the manager's own", 1 * MiB, 64, slices.Repeat([]uint64{4 * MiB}, 16)},
		{"blocks that do not divide the size", 16 * MiB, 37, []uint64{1 * MiB, 9 * MiB, 9 * MiB, 9 * MiB, 9 * MiB}},
	} {
		t.Run(c.name, func(t *testing.T) {
			exp, dec := newFixture(t), newFixture(t)
			dec.m.cfg.WorkerID = 0xD1
			src := exp.alloc(storage.Pinned, cfg, FullyContiguous)
			exp.fill(src, 100)
			d, err := exp.m.Describe(src)
			require.NoError(t, err)
			var reads []uint64
			hs, err := dec.m.Import(sizedPeer{most: c.most, mu: &sync.Mutex{}, reads: &reads}, []Descriptor{d})
			require.NoError(t, err)
			dst := dec.alloc(storage.Pinned, cfg, FullyContiguous)
			dec.fill(dst, 500)
			ids := seqIDs(c.blocks)
			require.NoError(t, dec.transfer(hs[0], ids, dst, ids, Options{}))
			slices.Sort(reads) // the net workers read at once
			require.Equal(t, c.want, reads)
			for id := range cfg.NumBlocks {
				tag := uint64(100 + id)
				if id >= c.blocks {
					tag = uint64(500 + id) // not moved
				}
				require.Equal(t, pattern(cfg.BlockSize(), tag), dec.readBlock(dst, id), "block %d", id)
			}
		})
	}
}

// seqIDs is block ids 0 … n-1.
func seqIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return ids
}
