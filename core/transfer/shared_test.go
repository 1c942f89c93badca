package transfer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
)

// Host layouts are shared memory (a peer on this host may map them) unless
// the manager is private, or the driver will not pin shared pages: then
// they are allocated privately as before, and Shared says they are not.
func TestHostLayoutsAreSharedWhereTheyCanBe(t *testing.T) {
	cfg := layout.Config{NumBlocks: 4, NumLayers: 2, OuterDim: 2, PageSize: 4, InnerDim: 64, DtypeWidth: 2}
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	for _, c := range []struct {
		name   string
		cfg    Config
		shared map[storage.Kind]bool
	}{
		{"default", Config{WorkerID: 1, Driver: emu}, map[storage.Kind]bool{storage.Pinned: true, storage.System: true}},
		{"private", Config{WorkerID: 2, Driver: emu, PrivateHost: true}, map[storage.Kind]bool{}},
		{"driver refuses to pin shared pages", Config{WorkerID: 3, Driver: noSharedPins{emu}},
			map[storage.Kind]bool{storage.System: true}}, // pageable memory needs no pinning
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := NewManager(c.cfg)
			require.NoError(t, err)
			defer m.Close()
			for _, kind := range []storage.Kind{storage.Pinned, storage.System} {
				h, err := m.AllocateLayout(kind, cfg, FullyContiguous)
				require.NoError(t, err)
				regions, err := m.Shared(h)
				if !c.shared[kind] {
					require.ErrorIs(t, err, ErrUnsupported)
					continue
				}
				require.NoError(t, err)
				require.Len(t, regions, 1)
				require.NotNil(t, regions[0].File)
				CloseRegions(regions)
			}
		})
	}
}

type noSharedPins struct{ *cuda.Emulated }

func (noSharedPins) HostRegister(ptr, size uint64) error {
	return cuda.NewError("cuMemHostRegister", cuda.ErrCodeNotSupported, "refused for the test")
}
