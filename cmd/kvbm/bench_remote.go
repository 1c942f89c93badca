package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/tcp"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
	"github.com/kvbm/kvbm/internal/testpki"
)

// benchRemote measures the network transport: 64 × 2 MiB blocks pulled
// from and pushed to another worker's G2, two workers of this process,
// each with its own transport (the same wire, server and peer as between
// processes). Once by the same-host route (a Unix socket, the exporter's
// G2 mapped and copied directly), beside a copy of the same bytes on
// GOMAXPROCS goroutines; once over TCP on the loopback interface, and once
// over TLS (throwaway certificates made here), each beside a plain TCP
// stream of the same bytes, and TLS beside TCP as well. Then what a
// connection costs before its first request: connect and hello over TCP
// beside a bare TCP connect, and with TLS beside without. (The
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
	pullName := func(route string) string { return "remote pull G2←G2 (" + route + ")" }
	pushName := func(route string) string { return "remote push G2→G2 (" + route + ")" }
	connName := map[string]string{"tcp": "remote connect + hello (tcp)", "tls": "remote connect + TLS + hello (tls)"}
	wantsAny := func(names ...string) bool { return slices.ContainsFunc(names, cfg.wants) }
	tlsVsTCP := []string{pullName("tls, vs tcp"), pushName("tls, vs tcp")}
	scopedVsTCP := pullName("tcp, request-scoped, vs tcp")
	needs := map[string]bool{
		"same host": wantsAny(pullName("same host"), pushName("same host")),
		"tcp":       wantsAny(pullName("tcp"), pushName("tcp"), connName["tcp"], connName["tls"], tlsVsTCP[0], tlsVsTCP[1], scopedVsTCP),
		"tls":       wantsAny(pullName("tls"), pushName("tls"), connName["tls"], tlsVsTCP[0], tlsVsTCP[1]),
	}
	pairs := map[string]*remoteBench{}
	for _, route := range []string{"same host", "tcp", "tls"} {
		if !needs[route] {
			continue
		}
		tc := tcp.Config{Listen: "127.0.0.1:0", NoSameHost: route != "same host", NoTLS: route != "tls"}
		if route == "tls" {
			dir, err := os.MkdirTemp("", "kvbm-bench-tls-")
			if err != nil {
				return nil, fmt.Errorf("remote bench (tls): %w", err)
			}
			closers = append(closers, func() error { return os.RemoveAll(dir) })
			if tc.TLS, err = throwawayTLS(dir); err != nil {
				return nil, fmt.Errorf("remote bench (tls): throwaway certificates: %w", err)
			}
		}
		rb, closeAll, err := remotePair(drv, lc, tc)
		closers = append(closers, closeAll)
		if err != nil {
			return nil, fmt.Errorf("remote bench (%s): %w", route, err)
		}
		pairs[route] = rb
	}
	var copyBase, streamBase func() (time.Duration, error)
	if needs["same host"] {
		ref, err := baseline.NewCopy(int(bytes))
		if err != nil {
			return nil, fmt.Errorf("remote bench: %w", err)
		}
		closers = append(closers, ref.Close)
		copyBase = func() (time.Duration, error) { return ref.Run(bytes, gomaxprocs()), nil }
	}
	if needs["tcp"] || needs["tls"] {
		var closeStream func() error
		streamBase, closeStream, err = plainStream(int(bytes))
		if err != nil {
			return nil, fmt.Errorf("remote bench: plain stream: %w", err)
		}
		closers = append(closers, closeStream)
	}
	copyName, streamName := fmt.Sprintf("copy ×%d", gomaxprocs()), "plain TCP stream"
	var paths []benchPath
	var results []benchResult
	if sh := pairs["same host"]; sh != nil {
		paths = append(paths, benchPath{pullName("same host"), copyName, sh.pull, copyBase}, benchPath{pushName("same host"), copyName, sh.push, copyBase})
	}
	if tp := pairs["tcp"]; tp != nil {
		paths = append(paths, benchPath{pullName("tcp"), streamName, tp.pull, streamBase}, benchPath{pushName("tcp"), streamName, tp.push, streamBase},
			benchPath{scopedVsTCP, pullName("tcp"), tp.scopedPull, tp.pull})
	}
	if tl := pairs["tls"]; tl != nil {
		paths = append(paths, benchPath{pullName("tls"), streamName, tl.pull, streamBase}, benchPath{pushName("tls"), streamName, tl.push, streamBase})
		if tp := pairs["tcp"]; tp != nil {
			paths = append(paths, benchPath{tlsVsTCP[0], pullName("tcp"), tl.pull, tp.pull}, benchPath{tlsVsTCP[1], pushName("tcp"), tl.push, tp.push})
		}
	}
	for _, bp := range paths {
		if !cfg.wants(bp.name) {
			continue
		}
		r := benchResult{Path: bp.name, BlockBytes: lc.BlockSize(), Blocks: blocks, Concurrency: 1, Unit: "GB/s", Baseline: bp.baseline}
		results = append(results, runPath(cfg.reps, r, bp, func(rep int) { p.say(bp.name, rep, cfg.reps) }, bytes, 0))
	}
	if needs["tcp"] {
		bare, closeBare, err := bareConnect()
		if err != nil {
			return results, fmt.Errorf("remote bench: bare connect: %w", err)
		}
		closers = append(closers, closeBare)
		conn := []benchPath{{connName["tcp"], "bare TCP connect", pairs["tcp"].connect, bare}}
		if tl := pairs["tls"]; tl != nil {
			conn = append(conn, benchPath{connName["tls"], connName["tcp"], tl.connect, pairs["tcp"].connect})
		}
		for _, bp := range conn {
			if !cfg.wants(bp.name) {
				continue
			}
			r := benchResult{Path: bp.name, Blocks: 1, Concurrency: 1, Unit: "us", Baseline: bp.baseline}
			results = append(results, runPath(cfg.reps, r, bp, func(rep int) { p.say(bp.name, rep, cfg.reps) }, 0, connects))
		}
	}
	return results, nil
}

// connects is how many connections one run of a connect figure opens, one
// after another.
const connects = 200

// remoteBench is a pull and a push of all the blocks of another worker's
// G2, and connects one after another to it (connect, TLS where
// configured, and the hello; then close).
// scopedPull (plain TCP only) pulls them with a request-scoped
// capability covering them all, every block revoked once before it was
// made: the server checks each request's blocks against the scope and
// their revocation epochs (docs/data-plane.md).
type remoteBench struct{ pull, push, connect, scopedPull func() (time.Duration, error) }

// remotePair makes an exporter and an importer, each a manager with its
// own TCP transport of configuration tc, the exporter's G2 imported.
func remotePair(drv cuda.Driver, lc layout.Config, tc tcp.Config) (_ *remoteBench, closeAll func() error, err error) {
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
		t := tcp.New(tc)
		closers = append(closers, t.Close)
		if err := t.Serve(m); err != nil {
			return nil, nil, transfer.LayoutHandle{}, err
		}
		h, err := m.AllocateLayout(storage.Pinned, lc, transfer.FullyContiguous)
		return m, t, h, err
	}
	exp, expTCP, remoteG2, err := side(0xE0)
	if err != nil {
		return nil, closeAll, err
	}
	imp, impTCP, localG2, err := side(0x10)
	if err != nil {
		return nil, closeAll, err
	}
	ep, err := expTCP.Endpoint()
	if err != nil {
		return nil, closeAll, err
	}
	peer, err := impTCP.Connect(context.Background(), ep)
	if err != nil {
		return nil, closeAll, err
	}
	if sameHost := !tc.NoSameHost; tcp.SameHost(peer) != sameHost {
		return nil, closeAll, fmt.Errorf("the peer is reached by the same-host route: %v, want %v", tcp.SameHost(peer), sameHost)
	}
	if want := tc.TLS != (tcp.TLSFiles{}); impTCP.TLS() != want {
		return nil, closeAll, fmt.Errorf("the transport speaks TLS: %v, want %v", impTCP.TLS(), want)
	}
	d, err := exp.Describe(remoteG2)
	if err != nil {
		return nil, closeAll, err
	}
	if _, err := imp.Import(peer, []transfer.Descriptor{d}); err != nil {
		return nil, closeAll, err
	}
	ids := seq(0, lc.NumBlocks)
	rb := &remoteBench{}
	rb.pull = func() (time.Duration, error) {
		return timed("remote pull", func() (*transfer.Notification, error) {
			return imp.ExecuteTransfer(remoteG2, ids, localG2, ids, transfer.Options{})
		})
	}
	rb.push = func() (time.Duration, error) {
		return timed("remote push", func() (*transfer.Notification, error) {
			return imp.ExecuteTransfer(localG2, ids, remoteG2, ids, transfer.Options{})
		})
	}
	if tc.NoSameHost && tc.NoTLS {
		imp2, imp2TCP, local2, err := side(0x11)
		if err != nil {
			return nil, closeAll, err
		}
		if rb.scopedPull, err = scopedPuller(expTCP, d, imp2, imp2TCP, local2, ids); err != nil {
			return nil, closeAll, err
		}
	}
	rb.connect = func() (time.Duration, error) {
		t0 := time.Now()
		for range connects {
			if err := impTCP.DialOnce(context.Background(), ep); err != nil {
				return 0, fmt.Errorf("remote connect: %w", err)
			}
		}
		return time.Since(t0), nil
	}
	return rb, closeAll, nil
}

// scopedPuller imports the exporter's layout d into imp through a
// request-scoped capability of all of ids, made after each was revoked
// once, and returns a pull of them into local.
func scopedPuller(expTCP *tcp.Transport, d transfer.Descriptor, imp *transfer.Manager, impTCP *tcp.Transport,
	local transfer.LayoutHandle, ids []int) (func() (time.Duration, error), error) {
	scope := []remote.ScopedLayout{{Layout: d.Handle, Blocks: ids}}
	if err := expTCP.RevokeBlocks(scope); err != nil {
		return nil, err
	}
	ep, err := expTCP.ScopedEndpoint(remote.Scope{Layouts: scope})
	if err != nil {
		return nil, err
	}
	peer, err := impTCP.Connect(context.Background(), ep)
	if err != nil {
		return nil, err
	}
	if _, err := imp.Import(peer, []transfer.Descriptor{d}); err != nil {
		return nil, err
	}
	return func() (time.Duration, error) {
		return timed("scoped remote pull", func() (*transfer.Notification, error) {
			return imp.ExecuteTransfer(d.Handle, ids, local, ids, transfer.Options{})
		})
	}, nil
}

// throwawayTLS makes a CA and one certificate of it for 127.0.0.1 in dir,
// which both workers of the TLS figures present.
func throwawayTLS(dir string) (tcp.TLSFiles, error) {
	ca, err := testpki.NewCA("kvbm bench throwaway CA")
	if err != nil {
		return tcp.TLSFiles{}, err
	}
	f, err := ca.Write(dir, "worker", testpki.Leaf{Name: "kvbm bench worker", Hosts: []string{"127.0.0.1"}})
	return tcp.TLSFiles(f), err
}

// bareConnect returns a function that opens connects TCP connections on
// the loopback interface one after another, each answered with one byte
// by the other side (as the hello's challenge is), and closes them: the
// limit of a connect, nothing proved.
func bareConnect() (func() (time.Duration, error), func() error, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{1})
			c.Close()
		}
	}()
	run := func() (time.Duration, error) {
		t0 := time.Now()
		var b [1]byte
		for range connects {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return 0, err
			}
			_, err = io.ReadFull(c, b[:])
			c.Close()
			if err != nil {
				return 0, err
			}
		}
		return time.Since(t0), nil
	}
	return run, ln.Close, nil
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
