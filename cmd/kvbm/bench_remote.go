package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote/tcp"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
)

// benchRemote measures the network transport: 64 × 2 MiB blocks pulled
// from and pushed to another worker's G2, two workers of this process,
// each with its own transport (the same wire, server and peer as between
// processes). Once by the same-host route (a Unix socket, the exporter's
// G2 mapped and copied directly), beside a copy of the same bytes on
// GOMAXPROCS goroutines; once over TCP on the
// loopback interface, beside a plain TCP stream of the same bytes. (The
// two-process figures are core/worker's BenchmarkCrossProcess, in make
// bench.)
func benchRemote(drv cuda.Driver, cfg benchConfig, p *progress) (_ []benchResult, err error) {
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i]())
		}
	}()
	const blocks = 64
	lc := layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}
	bytes := int64(blocks * lc.BlockSize())
	var results []benchResult
	for _, route := range []struct {
		name     string
		sameHost bool
	}{{"same host", true}, {"tcp", false}} {
		names := []string{"remote pull G2←G2 (" + route.name + ")", "remote push G2→G2 (" + route.name + ")"}
		if !cfg.wants(names[0]) && !cfg.wants(names[1]) {
			continue
		}
		pull, push, closeAll, err := remotePair(drv, lc, route.sameHost)
		closers = append(closers, closeAll)
		if err != nil {
			return results, fmt.Errorf("remote bench (%s): %w", route.name, err)
		}
		baseName := fmt.Sprintf("copy ×%d", gomaxprocs())
		var base func() (time.Duration, error)
		if route.sameHost {
			ref, err := baseline.NewCopy(int(bytes))
			if err != nil {
				return results, fmt.Errorf("remote bench: %w", err)
			}
			closers = append(closers, ref.Close)
			base = func() (time.Duration, error) { return ref.Run(bytes, gomaxprocs()), nil }
		} else {
			var closeStream func() error
			baseName = "plain TCP stream"
			base, closeStream, err = plainStream(int(bytes))
			if err != nil {
				return results, fmt.Errorf("remote bench: plain stream: %w", err)
			}
			closers = append(closers, closeStream)
		}
		for _, bp := range []benchPath{{names[0], baseName, pull, base}, {names[1], baseName, push, base}} {
			if !cfg.wants(bp.name) {
				continue
			}
			r := benchResult{Path: bp.name, BlockBytes: lc.BlockSize(), Blocks: blocks, Concurrency: 1, Unit: "GB/s", Baseline: bp.baseline}
			results = append(results, runPath(cfg.reps, r, bp, func(rep int) { p.say(bp.name, rep, cfg.reps) }, bytes, 0))
		}
	}
	return results, nil
}

// remotePair makes an exporter and an importer, each a manager with its
// own TCP transport on 127.0.0.1, the exporter's G2 imported, and returns
// a pull and a push of all its blocks.
func remotePair(drv cuda.Driver, lc layout.Config, sameHost bool) (pull, push func() (time.Duration, error), closeAll func() error, err error) {
	var closers []func() error
	closeAll = func() error {
		var err error
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i]())
		}
		return err
	}
	side := func(id uint64) (*transfer.Manager, *tcp.Transport, transfer.LayoutHandle, error) {
		m, err := transfer.NewManager(transfer.Config{WorkerID: id, Driver: drv})
		if err != nil {
			return nil, nil, transfer.LayoutHandle{}, err
		}
		closers = append(closers, m.Close)
		t := tcp.New(tcp.Config{Listen: "127.0.0.1:0", NoSameHost: !sameHost})
		closers = append(closers, t.Close)
		if err := t.Serve(m); err != nil {
			return nil, nil, transfer.LayoutHandle{}, err
		}
		h, err := m.AllocateLayout(storage.Pinned, lc, transfer.FullyContiguous)
		return m, t, h, err
	}
	exp, expTCP, remoteG2, err := side(0xE0)
	if err != nil {
		return nil, nil, closeAll, err
	}
	imp, impTCP, localG2, err := side(0x10)
	if err != nil {
		return nil, nil, closeAll, err
	}
	ep, err := expTCP.Endpoint()
	if err != nil {
		return nil, nil, closeAll, err
	}
	peer, err := impTCP.Connect(context.Background(), ep)
	if err != nil {
		return nil, nil, closeAll, err
	}
	if tcp.SameHost(peer) != sameHost {
		return nil, nil, closeAll, fmt.Errorf("the peer is reached by the same-host route: %v, want %v", tcp.SameHost(peer), sameHost)
	}
	d, err := exp.Describe(remoteG2)
	if err != nil {
		return nil, nil, closeAll, err
	}
	if _, err := imp.Import(peer, []transfer.Descriptor{d}); err != nil {
		return nil, nil, closeAll, err
	}
	ids := seq(0, lc.NumBlocks)
	pull = func() (time.Duration, error) {
		return timed("remote pull", func() (*transfer.Notification, error) {
			return imp.ExecuteTransfer(remoteG2, ids, localG2, ids, transfer.Options{})
		})
	}
	push = func() (time.Duration, error) {
		return timed("remote push", func() (*transfer.Notification, error) {
			return imp.ExecuteTransfer(localG2, ids, remoteG2, ids, transfer.Options{})
		})
	}
	return pull, push, closeAll, nil
}

// plainStream returns a function that pulls n bytes over one plain TCP
// connection on the loopback interface (baseline.Stream) into a buffer of
// n bytes, and how long that took.
func plainStream(n int) (func() (time.Duration, error), func() error, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	src, dst := make([]byte, n), make([]byte, n)
	for i := 0; i < n; i += 4096 {
		src[i], dst[i] = 1, 1 // fault both in
	}
	go baseline.ServeStream(ln, src)
	s, err := baseline.DialStream(ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	return func() (time.Duration, error) { return s.Pull(dst) }, func() error { return errors.Join(s.Close(), ln.Close()) }, nil
}
