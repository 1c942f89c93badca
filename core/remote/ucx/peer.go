//go:build cgo

package ucx

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Peer is a worker reached through a UCX endpoint, and the RemoteMemory of
// the layouts it published. Safe for concurrent use.
type Peer struct {
	t       *Transport
	proc    procIdentity // the exporting process
	layouts map[transfer.LayoutHandle]*remoteLayout
	closed  chan struct{} // closed once the endpoint is closed
	gone    chan struct{} // closed once the endpoint is closed and released

	mu  sync.Mutex
	err error // why the peer is unavailable; set once

	peak atomic.Int64 // the most bytes in flight seen (for tests)

	oneSided bool      // the exporter serves one-sided (rkeys), not messages
	session  sessionID // the message mode's session, once the hello verified
	worker   uint64    // the exporter's worker
	server   string    // its worker and UCX address (remote.ScopeMember)

	// Owned by the progress thread.
	ep        C.uint64_t
	state     *C.kvbm_ucx_epstate_t
	batches   []*batch
	closing   bool
	epClosed  bool
	rkeysGone bool
	released  bool
}

type remoteLayout struct {
	info    layoutInfo
	regions []remoteRegion // by base
}

type remoteRegion struct {
	base, size uint64
	rkey       C.uint64_t
}

// batch is one Read, Write or flush: its C state and operations live off
// the Go heap (UCX's callbacks write them) and are freed by the progress
// thread when the batch finishes.
type batch struct {
	what    string
	write   bool
	c       *C.kvbm_ucx_batch_t
	ops     *C.kvbm_ucx_op_t
	n, next int
	posted  int64
	flushed bool
	done    chan error // buffered: the progress thread never blocks on it
}

// Connect creates an endpoint to the worker that published endpoint,
// unpacks its rkeys and checks, within ctx, that the worker answers.
func (t *Transport) Connect(ctx context.Context, endpoint []byte) (remote.Peer, error) {
	info, err := decodeEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if (info.mode == modeOneSided) != t.cfg.OneSided {
		return nil, fmt.Errorf("%w: ucx: the exporter serves in the %s mode, this transport in the %s mode (%s must be the same on both)",
			kvbmerr.ErrUnsupported, modeName(info.mode == modeOneSided), modeName(t.cfg.OneSided), EnvOneSided)
	}
	if err := checkSegs(info, t.segs); err != nil {
		return nil, err
	}
	p := &Peer{t: t, proc: info.proc, layouts: map[transfer.LayoutHandle]*remoteLayout{}, closed: make(chan struct{}), gone: make(chan struct{}),
		oneSided: info.mode == modeOneSided, worker: info.worker, server: fmt.Sprintf("%x %x", info.worker, info.address)}
	var setup error
	created := false
	err = t.do(func() error {
		if err := t.openWorker(); err != nil {
			return err
		}
		p.state = (*C.kvbm_ucx_epstate_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvbm_ucx_epstate_t{}))))
		addr := C.CBytes(info.address)
		defer C.free(addr)
		if err := status(C.kvbm_ucx_ep_create(t.worker, addr, p.state, &p.ep)); err != nil {
			C.free(unsafe.Pointer(p.state))
			return fmt.Errorf("%w: ucx: ucp_ep_create: %w", remote.ErrPeerUnavailable, err)
		}
		t.peers[p] = struct{}{}
		created = true
		for _, l := range info.layouts {
			rl := &remoteLayout{info: l}
			p.layouts[l.handle] = rl
			for _, r := range l.regions {
				if !p.oneSided {
					rl.regions = append(rl.regions, remoteRegion{base: r.base, size: r.size})
					continue
				}
				// Padding after the key: nothing UCX reads past a key
				// that checkRkey let through is outside the copy. Its
				// first byte is "system device unknown", which UCX 1.20
				// reads after the domains of a key from an older UCX
				// that packed none.
				buf := C.CBytes(append(slices.Clip(r.rkey), rkeyPadding...))
				var rkey C.uint64_t
				err := status(C.kvbm_ucx_rkey_unpack(p.ep, buf, &rkey))
				C.free(buf)
				if err != nil {
					setup = fmt.Errorf("%w: ucx: rkey of layout %v region at %#x: %w", remote.ErrBadEndpoint, l.handle, r.base, err)
					p.fail(setup)
					return nil
				}
				rl.regions = append(rl.regions, remoteRegion{base: r.base, size: r.size, rkey: rkey})
			}
			sort.Slice(rl.regions, func(i, j int) bool { return rl.regions[i].base < rl.regions[j].base })
		}
		return nil
	})
	if err == nil {
		err = setup
	}
	if err == nil && p.oneSided {
		// The endpoint connects lazily: a flush makes it reach the peer.
		err = p.run(ctx, &batch{what: "connect", write: true})
	} else if err == nil {
		err = p.hello(ctx, info)
	}
	if err != nil {
		if created {
			_ = p.Close()
		}
		return nil, err
	}
	if info.scope == capability.ScopeBlocks {
		// One peer per request's scope, joined per exporter (remote.Joiner).
		return remote.NewScopedPeer(p, info.desc)
	}
	return p, nil
}

// Server names the exporter p reaches (remote.ScopeMember).
func (p *Peer) Server() string { return p.server }

// Worker is the exporter's worker id (remote.ScopeMember).
func (p *Peer) Worker() uint64 { return p.worker }

// Broken says why p can no longer be used, or nil (remote.ScopeMember).
func (p *Peer) Broken() error { return p.failure() }

// Attach checks d against what the peer published and returns the peer
// as the layout's remote memory.
func (p *Peer) Attach(d transfer.Descriptor) (transfer.Attachment, error) {
	if err := p.failure(); err != nil {
		return transfer.Attachment{}, err
	}
	l, ok := p.layouts[d.Handle]
	switch {
	case !ok:
		return transfer.Attachment{}, fmt.Errorf("%w: ucx: layout %v is not in the endpoint its worker published "+
			"(registered after that metadata was exported? export and import it again)", transfer.ErrNotFound, d.Handle)
	case l.info.reason != "":
		return transfer.Attachment{}, fmt.Errorf("%w: ucx: %s", kvbmerr.ErrUnsupported, l.info.reason)
	case d.Kind != l.info.kind:
		return transfer.Attachment{}, fmt.Errorf("%w: ucx: layout %v is %v in the descriptor, %v in the endpoint",
			kvbmerr.ErrInvalidArgument, d.Handle, d.Kind, l.info.kind)
	}
	sizes, err := layout.RegionSizes(d.Config, d.Shape.Kind, d.Shape.BlockDim)
	if err != nil {
		return transfer.Attachment{}, fmt.Errorf("%w: ucx: layout %v: %w", kvbmerr.ErrInvalidArgument, d.Handle, err)
	}
	if len(sizes) != len(d.Bases) || len(sizes) != len(l.info.regions) {
		return transfer.Attachment{}, fmt.Errorf("%w: ucx: layout %v has %d regions in the descriptor (%d bases), %d in the endpoint",
			kvbmerr.ErrInvalidArgument, d.Handle, len(sizes), len(d.Bases), len(l.info.regions))
	}
	for i, r := range l.info.regions {
		if r.base != d.Bases[i] || r.size != sizes[i] {
			return transfer.Attachment{}, fmt.Errorf("%w: ucx: layout %v region %d is [%#x, +%d) in the descriptor, [%#x, +%d) in the endpoint",
				kvbmerr.ErrInvalidArgument, d.Handle, i, d.Bases[i], sizes[i], r.base, r.size)
		}
	}
	return transfer.Attachment{Memory: p}, nil
}

// OpBytes is the size a transfer's operations should be
// (transfer.OpSizer): in the message mode each read is a request, a
// goroutine at the exporter and an answer, which 16 MiB reads pay a
// quarter as often as the manager's 4 MiB ones (over shared memory on two
// cores, 20 to 35 % more bytes a second for 2 MiB blocks and 32 KiB
// fragments of host memory; BenchmarkPull); in the one-sided mode each
// ends with a flush of the endpoint, a round trip too (pushes 20 to 50 %
// more; BenchmarkPush). kvbm's TCP transport names none: its four
// connections stream.
func (p *Peer) OpBytes() uint64 { return readBytes }

var _ transfer.OpSizer = (*Peer)(nil)

// readBytes is Peer.OpBytes.
const readBytes = 16 << 20

// Read copies each op's bytes from the peer's layout h into local host
// memory: asked of the exporter and copied in through sinks (pull.go), or in the one-sided
// mode with ucp_get_nbx.
func (p *Peer) Read(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	return p.rma(ctx, h, ops, false)
}

// Write copies each op's bytes from local host memory into the peer's
// layout h, in the one-sided mode only (ucp_put_nbx, then a flush of the
// endpoint so that they are in place at the peer): in the message mode a
// push across processes is a pull by the receiver.
func (p *Peer) Write(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	if !p.oneSided {
		return fmt.Errorf("%w: ucx: writes into a peer's layout %v: the UCX transport moves blocks by pulls only "+
			"(the receiver pulls, as the P/D integrations do), so that no late write can land in blocks the peer reused", kvbmerr.ErrUnsupported, h)
	}
	return p.rma(ctx, h, ops, true)
}

func (p *Peer) rma(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp, write bool) error {
	if err := p.failure(); err != nil {
		return err
	}
	// Memory shared with a process of this host stays readable after the
	// process died: ask the process table.
	if why := p.proc.gone(); why != "" {
		err := fmt.Errorf("%w: ucx: the exporting %s", remote.ErrPeerUnavailable, why)
		p.t.post(func() { p.fail(err) })
		return err
	}
	l, ok := p.layouts[h]
	if !ok || l.info.reason != "" {
		return fmt.Errorf("%w: ucx: layout %v is not reachable through this peer", transfer.ErrNotFound, h)
	}
	verb, total := "read", uint64(0)
	if write {
		verb = "write"
	}
	if !p.oneSided {
		for _, op := range ops {
			if op.Size == 0 {
				continue
			}
			if _, err := l.region(op); err != nil {
				return fmt.Errorf("%w: ucx: %s of %d ops on layout %v: %w", kvbmerr.ErrOutOfRange, verb, len(ops), h, err)
			}
			total += op.Size
		}
		if total == 0 {
			return nil
		}
		return p.pullInReads(ctx, h, ops, fmt.Sprintf("%s of %d bytes in %d ops on layout %v", verb, total, len(ops), h))
	}
	b := &batch{what: fmt.Sprintf("%s of %d ops on layout %v", verb, len(ops), h), write: write}
	if len(ops) > 0 {
		b.ops = (*C.kvbm_ucx_op_t)(C.calloc(C.size_t(len(ops)), C.size_t(unsafe.Sizeof(C.kvbm_ucx_op_t{}))))
	}
	cops := unsafe.Slice(b.ops, len(ops))
	for _, op := range ops {
		if op.Size == 0 {
			continue
		}
		r, err := l.region(op)
		if err != nil {
			C.free(unsafe.Pointer(b.ops))
			return fmt.Errorf("%w: ucx: %s: %v", kvbmerr.ErrOutOfRange, b.what, err)
		}
		cops[b.n] = C.kvbm_ucx_op_t{remote: C.uint64_t(op.Remote), local: C.uint64_t(op.Local), size: C.uint64_t(op.Size), rkey: r.rkey}
		b.n++
		total += op.Size
	}
	b.what = fmt.Sprintf("%s of %d bytes in %d ops on layout %v", verb, total, b.n, h)
	return p.run(ctx, b)
}

// run hands b to the progress thread and waits for it, or for ctx: then
// the endpoint is closed (its operations cannot be taken back otherwise)
// and the peer fails.
func (p *Peer) run(ctx context.Context, b *batch) error {
	b.c = (*C.kvbm_ucx_batch_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvbm_ucx_batch_t{}))))
	ops := unsafe.Slice(b.ops, b.n)
	for i := range ops {
		ops[i].batch = b.c
	}
	b.done = make(chan error, 1)
	if !p.t.post(func() { p.submit(b) }) {
		b.free()
		return fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, b.what, errClosed)
	}
	select {
	case err := <-b.done:
		return err
	case <-p.t.done:
		return fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, b.what, errClosed)
	case <-ctx.Done():
	}
	cause := fmt.Errorf("%w: ucx: %s: not complete within the deadline: %w", remote.ErrPeerUnavailable, b.what, kvbmerr.ErrTimeout)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		cause = fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, b.what, ctx.Err())
	}
	p.t.post(func() { p.fail(cause) })
	select {
	case err := <-b.done:
		return err
	case <-p.t.done:
	case <-time.After(abortGrace):
	}
	return cause
}

// failure is why the peer cannot be used, or nil.
func (p *Peer) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close closes the endpoint; operations in flight fail. In the message
// mode the exporter is told first (bye), so that it ends the session.
func (p *Peer) Close() error {
	closed := fmt.Errorf("%w: ucx: the peer was closed", remote.ErrPeerUnavailable)
	if !p.t.post(func() {
		if p.oneSided || p.session == (sessionID{}) || p.closing || p.failure() != nil {
			p.fail(closed)
			return
		}
		p.t.send(p.ep, byeHeader(p.session), nil, nil, sendEager, func(error) { p.fail(closed) })
	}) {
		return nil // the transport closed it
	}
	select {
	case <-p.closed:
	case <-p.t.done:
	case <-time.After(closeGrace):
		p.t.post(func() { p.fail(closed) }) // a bye that never went: close anyway
	}
	return nil
}

// Lanes is UCX's description of the endpoint (ucp_ep_print_info): the
// transports and devices it chose for each kind of operation.
func (p *Peer) Lanes() (string, error) {
	var out string
	err := p.t.do(func() error {
		if p.closing {
			return fmt.Errorf("%w: ucx: the endpoint is closed", remote.ErrPeerUnavailable)
		}
		buf := make([]byte, 16<<10)
		n := C.kvbm_ucx_print_ep(p.ep, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
		out = string(buf[:n])
		return nil
	})
	return out, err
}

// The methods below run on the progress thread.

func (p *Peer) submit(b *batch) {
	if err := p.failure(); err != nil {
		b.done <- err
		b.free()
		return
	}
	p.batches = append(p.batches, b)
}

// fail makes the peer unavailable with err (the first reason stays),
// closes the endpoint and fails the operations not yet posted; those
// posted are cancelled by the close and finish in reap.
func (p *Peer) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.t.failPulls(p, p.failure())
	if p.closing {
		return
	}
	p.closing = true
	// Force: the peer may be dead or frozen, and operations posted to it
	// are cancelled rather than waited for.
	C.kvbm_ucx_ep_close(p.ep, 1, p.state)
}

// postQueued posts the operations of p's batches in order while the bytes
// in flight are under max; it reports whether any batch is pending.
func (p *Peer) postQueued(max int64) bool {
	if len(p.batches) == 0 {
		return false
	}
	if p.closing {
		return true
	}
	var inflight int64
	for _, b := range p.batches {
		inflight += b.posted - int64(b.c.done_bytes)
	}
	for _, b := range p.batches {
		if b.next >= b.n || b.c.status != 0 {
			continue
		}
		budget := max - inflight
		if budget <= 0 && inflight > 0 {
			break
		}
		var posted C.int64_t
		b.next = int(C.kvbm_ucx_post(p.ep, boolInt(b.write), b.ops, C.int(b.next), C.int(b.n), C.int64_t(budget), &posted))
		b.posted += int64(posted)
		inflight += int64(posted)
		if inflight > p.peak.Load() {
			p.peak.Store(inflight)
		}
	}
	return true
}

// reap finishes the batches that are complete, fails the peer when UCX
// reported its failure, and releases the endpoint once closed; it reports
// whether any batch is pending.
func (p *Peer) reap() bool {
	if f := ucsError(p.state.failed); f != 0 && !p.closing {
		p.fail(fmt.Errorf("%w: ucx: the endpoint failed: %w", remote.ErrPeerUnavailable, f))
	}
	kept := p.batches[:0]
	for _, b := range p.batches {
		if st := ucsError(b.c.status); st != 0 && st.peerFailure() && !p.closing {
			p.fail(fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, b.what, st))
		}
		stopped := b.next >= b.n || b.c.status != 0 || p.closing
		if !stopped || b.c.outstanding != 0 || b.c.flush_pending != 0 {
			kept = append(kept, b)
			continue
		}
		if b.write && !b.flushed && b.c.status == 0 && !p.closing {
			b.flushed = true
			C.kvbm_ucx_flush(p.ep, b.c)
			if b.c.flush_pending != 0 {
				kept = append(kept, b)
				continue
			}
		}
		p.finish(b)
	}
	clear(p.batches[len(kept):])
	p.batches = kept
	if p.closing && p.state.closing == 0 {
		p.markClosed()
		if len(p.batches) == 0 {
			p.release()
		}
	}
	return len(p.batches) > 0
}

func (p *Peer) finish(b *batch) {
	var err error
	switch st := ucsError(b.c.status); {
	case p.failure() != nil:
		if st == 0 && b.next >= b.n && !b.write {
			break // every byte arrived before the peer failed
		}
		err = p.failure()
		if !strings.Contains(err.Error(), b.what) {
			err = fmt.Errorf("%s: %w", b.what, err)
		}
	case st != 0:
		err = fmt.Errorf("ucx: %s: %w", b.what, st)
	}
	b.done <- err
	b.free()
}

// release destroys the rkeys and the endpoint state once the endpoint is
// closed.
func (p *Peer) release() {
	p.destroyRkeys()
	p.freeState()
}

// destroyRkeys destroys the rkeys once; callers of rma that still see
// them find the peer failed when their batch is submitted.
func (p *Peer) destroyRkeys() {
	if p.rkeysGone || !p.oneSided {
		return
	}
	p.rkeysGone = true
	for _, l := range p.layouts {
		for _, r := range l.regions {
			C.kvbm_ucx_rkey_destroy(r.rkey)
		}
	}
}

func (p *Peer) freeState() {
	p.released = true
	C.free(unsafe.Pointer(p.state))
	p.state = nil
	delete(p.t.peers, p)
	p.markClosed()
	close(p.gone)
}

// markClosed tells Close that the endpoint is closed.
func (p *Peer) markClosed() {
	if !p.epClosed {
		p.epClosed = true
		close(p.closed)
	}
}

func (b *batch) free() {
	C.free(unsafe.Pointer(b.c))
	C.free(unsafe.Pointer(b.ops))
	b.c, b.ops = nil, nil
}

// region is the region the exporter published that holds op (a
// non-empty op).
func (l *remoteLayout) region(op transfer.RemoteOp) (*remoteRegion, error) {
	rs := l.regions
	i := sort.Search(len(rs), func(i int) bool { return rs[i].base > op.Remote }) - 1
	if i < 0 || op.Remote+op.Size < op.Remote || op.Remote+op.Size > rs[i].base+rs[i].size {
		return nil, fmt.Errorf("bytes [%#x, +%d) are not inside one region of the peer's layout", op.Remote, op.Size)
	}
	return &rs[i], nil
}

func modeName(oneSided bool) string {
	if oneSided {
		return "one-sided"
	}
	return "message"
}

func boolInt(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

var _ remote.Transport = (*Transport)(nil)
var _ transfer.RemoteMemory = (*Peer)(nil)
