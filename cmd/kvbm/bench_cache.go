package main

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvbm/kvbm/core/cache"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
)

// The prefix cache's paths, on a grid point's worker once its other paths
// are done (the cache then owns G2): offload of blocks under keys it has
// not seen (G1→G2, evicting the oldest; G3 and G4 are not written) and the
// layer-wise onboard of blocks it holds in G2, as the demo's request B
// does.
const (
	cacheOffloadPath = "prefix cache offload G1→G2"
	cacheOnboardPath = "prefix cache onboard G2→G1 layer-wise"
)

// cachePaths makes w's cache (closed with w) and the two paths.
func cachePaths(drv cuda.Driver, w *tierWorker, parts [][]int, ref *baseline.Copy, bytes int64) ([]benchPath, error) {
	c, err := w.node.EnableCache(cache.Config{G3: cache.WriteOff, G4: cache.WriteOff})
	if err != nil {
		return nil, fmt.Errorf("prefix cache: %w", err)
	}
	var gen atomic.Uint64
	// keys of part for generation g: never seen before g.
	keysFor := func(g uint64, part []int) [][]byte {
		ks := make([][]byte, len(part))
		for i, id := range part {
			ks[i] = fmt.Appendf(nil, "bench-gen-%d-block-%d", g, id)
		}
		return ks
	}
	offload := func(g uint64) (time.Duration, error) {
		return inParallel(parts, func(part []int) error {
			nt, _, err := c.Offload(keysFor(g, part), part, 0)
			if err != nil {
				return fmt.Errorf("prefix cache offload: %w", err)
			}
			if err := nt.WaitTimeout(waitLimit); err != nil {
				return fmt.Errorf("prefix cache offload: %w (failed G1 blocks %v)", err, nt.FailedBlocks())
			}
			return nil
		})
	}
	copyBase := func() (time.Duration, error) { return ref.Run(bytes, gomaxprocs()), nil }
	copyName := fmt.Sprintf("copy ×%d", gomaxprocs())
	paths := []benchPath{
		{cacheOffloadPath, copyName, func() (time.Duration, error) { return offload(gen.Add(1)) }, copyBase},
		{cacheOnboardPath, copyName, func() (time.Duration, error) {
			g := gen.Load()
			if g == 0 { // nothing offloaded yet (-paths chose onboard only)
				if _, err := offload(gen.Add(1)); err != nil {
					return 0, err
				}
				g = gen.Load()
			}
			return inParallel(parts, func(part []int) error {
				_, err := cacheOnboardLayerwise(drv, c, keysFor(g, part), part)
				return err
			})
		}, copyBase},
	}
	return paths, nil
}
