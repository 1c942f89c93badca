package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
)

// benchRemote measures the network transport: 64 × 2 MiB blocks pulled
// from and pushed to another worker's G2 over TCP on the loopback
// interface (two workers of this process, each with its own transport:
// the same wire, server and peer as between processes), beside a plain TCP
// stream of the same bytes in the same run. (The two-process figures are
// core/worker's BenchmarkCrossProcess, in make bench.)
func benchRemote(drv cuda.Driver, cfg benchConfig, p *progress) (_ []benchResult, err error) {
	names := []string{"remote pull G2←G2 (tcp)", "remote push G2→G2 (tcp)"}
	if !cfg.wants(names[0]) && !cfg.wants(names[1]) {
		return nil, nil
	}
	const blocks = 64
	lc := layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}
	bytes := int64(blocks * lc.BlockSize())
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i]())
		}
	}()
	side := func(id uint64) (*transfer.Manager, *remote.TCP, transfer.LayoutHandle, error) {
		m, err := transfer.NewManager(transfer.Config{WorkerID: id, Driver: drv})
		if err != nil {
			return nil, nil, transfer.LayoutHandle{}, err
		}
		closers = append(closers, m.Close)
		t := remote.NewTCP(remote.TCPConfig{Listen: "127.0.0.1:0"})
		closers = append(closers, t.Close)
		if err := t.Serve(m); err != nil {
			return nil, nil, transfer.LayoutHandle{}, err
		}
		h, err := m.AllocateLayout(storage.Pinned, lc, transfer.FullyContiguous)
		return m, t, h, err
	}
	exp, expTCP, remoteG2, err := side(0xE0)
	if err != nil {
		return nil, fmt.Errorf("remote bench: %w", err)
	}
	imp, impTCP, localG2, err := side(0x10)
	if err != nil {
		return nil, fmt.Errorf("remote bench: %w", err)
	}
	ep, err := expTCP.Endpoint()
	if err != nil {
		return nil, err
	}
	peer, err := impTCP.Connect(context.Background(), ep)
	if err != nil {
		return nil, fmt.Errorf("remote bench: %w", err)
	}
	d, err := exp.Describe(remoteG2)
	if err != nil {
		return nil, err
	}
	if _, err := imp.Import(peer, []transfer.Descriptor{d}); err != nil {
		return nil, fmt.Errorf("remote bench: %w", err)
	}
	stream, closeStream, err := plainStream(int(bytes))
	if err != nil {
		return nil, fmt.Errorf("remote bench: plain stream: %w", err)
	}
	closers = append(closers, closeStream)
	ids := seq(0, blocks)
	paths := []benchPath{
		{names[0], "plain TCP stream", func() (time.Duration, error) {
			return timed(names[0], func() (*transfer.Notification, error) {
				return imp.ExecuteTransfer(remoteG2, ids, localG2, ids, transfer.Options{})
			})
		}, stream},
		{names[1], "plain TCP stream", func() (time.Duration, error) {
			return timed(names[1], func() (*transfer.Notification, error) {
				return imp.ExecuteTransfer(localG2, ids, remoteG2, ids, transfer.Options{})
			})
		}, stream},
	}
	var results []benchResult
	for _, bp := range paths {
		if !cfg.wants(bp.name) {
			continue
		}
		r := benchResult{Path: bp.name, BlockBytes: lc.BlockSize(), Blocks: blocks, Concurrency: 1, Unit: "GB/s", Baseline: bp.baseline}
		results = append(results, runPath(cfg.reps, r, bp, func(rep int) { p.say(bp.name, rep, cfg.reps) }, bytes, 0))
	}
	return results, nil
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
