//go:build cgo

package ucx

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
)

// BenchmarkPull: a process pulls another process's blocks over UCX (with
// UCX's own choice of transports, then TCP only), 256 blocks of 2 MiB and
// 2,048 of 32 KiB, each block its own operation (the destination order is
// reversed, so nothing coalesces), in the message mode (through sinks,
// kvbm copying each piece UCX received: "staged"; beside it, in the same
// run, UCX receiving into the destination itself, "in place", and the
// ratio: what the sink costs) and in the one-sided mode. Beside each, measured in the same
// run: an in-process memcpy of the same bytes, block by block, and the
// ratio.
func BenchmarkPull(b *testing.B) { benchRemote(b, false) }

// BenchmarkPush is BenchmarkPull the other way, in the one-sided mode
// (the message mode pulls only): the importer writes its blocks into the
// exporter's layout (checked by the exporter once).
func BenchmarkPush(b *testing.B) { benchRemote(b, true) }

func benchRemote(b *testing.B, push bool) {
	needUCX(b)
	sizes := []struct {
		name string
		cfg  layout.Config
	}{
		// A Llama-3-8B block of 16 tokens: 32 layers × 2 × 16 × 1024 × bf16.
		{"256x2MiB", layout.Config{NumBlocks: 256, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}},
		// One fragment of such a block per block.
		{"2048x32KiB", layout.Config{NumBlocks: 2048, NumLayers: 1, OuterDim: 1, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}},
	}
	for _, size := range sizes {
		for _, tc := range tlsCases {
			if !push {
				b.Run(size.name+"/messages/"+tc.name, func(b *testing.B) {
					benchMove(b, size.cfg, Config{Options: tc.opts}, false, push)
				})
				// From the exporter's G1 (the emulated device): served
				// through its pinned staging buffer, a device copy first.
				b.Run(size.name+"/messages-from-g1/"+tc.name, func(b *testing.B) {
					benchMoveFrom(b, storage.Device, size.cfg, Config{Options: tc.opts}, false, push)
				})
			}
			b.Run(size.name+"/one-sided/"+tc.name, func(b *testing.B) {
				benchMove(b, size.cfg, Config{OneSided: true, Options: tc.opts}, false, push)
			})
		}
		// The exporter's layout in memory UCX allocated (AllocHost):
		// shared memory that the importer reads itself.
		b.Run(size.name+"/one-sided/default-ucx-memory", func(b *testing.B) {
			benchMove(b, size.cfg, Config{OneSided: true}, true, push)
		})
	}
}

func benchMove(b *testing.B, cfg layout.Config, tcfg Config, ucxMem, push bool) {
	benchMoveFrom(b, storage.Pinned, cfg, tcfg, ucxMem, push)
}

func benchMoveFrom(b *testing.B, kind storage.Kind, cfg layout.Config, tcfg Config, ucxMem, push bool) {
	opts := tcfg.Options
	h := startHelper(b, helperSpec{OneSided: tcfg.OneSided, Config: cfg, Kind: kind, Tag: 0x10000, Options: opts, UCXMemory: ucxMem})
	s := newSide(b, newEmu(b), 0x1, tcfg, time.Minute)
	_, remote := h.connect(b, s)
	local := s.alloc(b, storage.Pinned, cfg, transfer.FullyContiguous)
	n := cfg.NumBlocks
	src := seq(0, n)
	dst := slices.Clone(src)
	slices.Reverse(dst)
	total := int64(n) * int64(cfg.BlockSize())

	run := func() error { return move(b, s.m, remote, src, local, dst) }
	if push {
		s.fill(b, local, 0x20000)
		run = func() error { return move(b, s.m, local, dst, remote, src) }
	}
	// Once, checked: every block where it belongs.
	if err := run(); err != nil {
		b.Fatal(err)
	}
	for i := range src {
		if push {
			h.check(src[i], 0x20000+uint64(dst[i]))
		} else {
			s.check(b, local, dst[i], 0x10000+uint64(src[i]))
		}
	}

	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := run(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	pull := float64(total) * float64(b.N) / b.Elapsed().Seconds() / 1e9

	// The message mode received in place, without sinks, pull for pull
	// with the staged one, alternating, so that both meet the same
	// moments of this noisy machine: what the sinks cost.
	inPlace, staged := 0.0, 0.0
	if !tcfg.OneSided {
		tcfg.inPlace = true
		s2 := newSide(b, newEmu(b), 0x2, tcfg, time.Minute)
		_, remote2 := h.connect(b, s2)
		local2 := s2.alloc(b, storage.Pinned, cfg, transfer.FullyContiguous)
		reps := max(5, b.N)
		var tStaged, tInPlace time.Duration
		for i := 0; i < reps; i++ {
			t0 := time.Now()
			if err := run(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := move(b, s2.m, remote2, src, local2, dst); err != nil {
				b.Fatal(err)
			}
			tStaged, tInPlace = tStaged+t1.Sub(t0), tInPlace+time.Since(t1)
		}
		staged = float64(total) * float64(reps) / tStaged.Seconds() / 1e9
		inPlace = float64(total) * float64(reps) / tInPlace.Seconds() / 1e9
		for i := range src {
			s2.check(b, local2, dst[i], 0x10000+uint64(src[i]))
		}
	}

	// The limit: the same bytes copied in this process, block by block.
	l, _, err := s.m.Layout(local)
	if err != nil {
		b.Fatal(err)
	}
	region := l.Regions()[0]
	to := storage.HostBytes(region.Addr, region.Size)
	from := make([]byte, len(to))
	bs := cfg.BlockSize()
	reps := max(3, b.N)
	start := time.Now()
	for r := 0; r < reps; r++ {
		for i := range src {
			copy(to[dst[i]*bs:(dst[i]+1)*bs], from[src[i]*bs:(src[i]+1)*bs])
		}
	}
	memcpy := float64(total) * float64(reps) / time.Since(start).Seconds() / 1e9
	b.ReportMetric(pull, "GB/s")
	b.ReportMetric(memcpy, "memcpy-GB/s")
	b.ReportMetric(pull/memcpy, "ratio")
	verb := "pull"
	if push {
		verb = "push"
	}
	staging := ""
	if inPlace > 0 {
		b.ReportMetric(inPlace, "in-place-GB/s")
		b.ReportMetric(staged/inPlace, "staged/in-place")
		staging = fmt.Sprintf("; alternating pull for pull, staged %.2f GB/s, received in place %.2f GB/s, staged/in-place %.2f",
			staged, inPlace, staged/inPlace)
	}
	b.Logf("%s %.2f GB/s, in-process memcpy %.2f GB/s, ratio %.2f (%s)%s", verb, pull, memcpy, pull/memcpy, fmt.Sprint(opts), staging)
}
