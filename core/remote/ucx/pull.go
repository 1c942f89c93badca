//go:build cgo

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/internal/memcopy"
	"github.com/kvbm/kvbm/kvbmerr"
)

// The importer's side of the message mode: the hello that opens a
// session with the exporter, and pulls (Read) whose data messages reach
// their destination through sinks (receiveData): kvbm copies each piece
// UCX received, only while its pull is under way.

// connecting is a hello under way: the exporter's answers, by conn.
type connecting struct {
	answers chan *message // challenge, then welcome
}

// pull is one Read under way; owned by the progress thread.
type pull struct {
	id     uint64
	peer   *Peer
	total  uint64
	local  []piece              // the destination, in request order
	took   accepted             // of the data messages
	recvd  uint64               // bytes received
	recvs  int                  // receives posted, not complete
	sinks  []*C.kvbm_ucx_sink_t // of the receives not complete: closed when the pull ends
	done   bool                 // the exporter's done came
	status byte
	sent   uint64 // what the exporter's done says it sent
	msg    string
	err    error      // a receive's failure
	ended  bool       // answered on ch: no message reaches it any more
	ch     chan error // buffered: the answer
}

// hello opens a session on p's endpoint with the capability info
// carries: open, the exporter's challenge, the hello (naming this
// worker's address, where the exporter will answer), its proof.
func (p *Peer) hello(ctx context.Context, info *endpointInfo) error {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("ucx: draw a nonce: %w", err)
	}
	conn := binary.LittleEndian.Uint64(b[:])
	c := &connecting{answers: make(chan *message, 2)}
	t := p.t
	defer t.post(func() { delete(t.connects, conn) })
	if err := t.do(func() error {
		t.connects[conn] = c
		t.send(p.ep, openHeader(conn), t.address, nil, sendEager|sendReply, nil)
		return nil
	}); err != nil {
		return err
	}
	wait := func(kind msgKind) (*message, error) {
		select {
		case m := <-c.answers:
			if m.h.kind != kind {
				return nil, fmt.Errorf("%w: ucx: the exporter answered a hello with %v, not %v", remote.ErrPeerUnavailable, m.h.kind, kind)
			}
			return m, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: ucx: the exporting worker %x did not answer the hello (%v): not reachable, "+
				"or not serving the UCX transport's messages (a kvbm of another version, or one in the one-sided mode)",
				remote.ErrPeerUnavailable, info.worker, ctx.Err())
		case <-t.done:
			return nil, fmt.Errorf("%w: ucx: %w", remote.ErrPeerUnavailable, errClosed)
		}
	}
	ch, err := wait(kindChallenge)
	if err != nil {
		return err
	}
	cn, err := capability.NewNonce()
	if err != nil {
		return fmt.Errorf("ucx: draw a nonce: %w", err)
	}
	tr := capability.Transcript{SN: ch.h.nonce, CN: cn, Server: info.worker, Client: t.clientWorker()}
	key := info.key.HelloKey(t.deployment)
	data := helloData(t.address, key.AppendHello(nil, tr, info.desc))
	if err := t.do(func() error {
		t.send(p.ep, helloHeader(conn, ch.h.at), data, nil, sendEager|sendReply, nil)
		return nil
	}); err != nil {
		return err
	}
	w, err := wait(kindWelcome)
	if err != nil {
		return err
	}
	if !w.h.ok || !key.CheckServerProof(tr, w.data) {
		return fmt.Errorf("%w: ucx: worker %x refused the hello: this metadata is not its current capability "+
			"(stale, another worker's, or damaged), or %s differs between the two instances",
			remote.ErrPeerUnavailable, info.worker, capability.EnvAuthKey)
	}
	p.session = w.h.session
	return nil
}

// clientWorker is the worker this transport serves, or 0.
func (t *Transport) clientWorker() uint64 {
	if m := t.manager(); m != nil {
		return m.WorkerID()
	}
	return 0
}

// errBusy: the exporter put a read off (serve.go's bounds); asked again.
var errBusy = kvbmerr.New(kvbmerr.Unsupported, "ucx: the exporting worker is busy")

// pullInReads pulls ops as reads of at most readOps ops, one after
// another.
func (p *Peer) pullInReads(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp, what string) error {
	for len(ops) > 0 {
		part := ops[:min(len(ops), readOps)]
		ops = ops[len(part):]
		var size uint64
		for _, o := range part {
			size += o.Size
		}
		if size == 0 {
			continue
		}
		if err := p.pullWhenFree(ctx, h, part, size, what); err != nil {
			return err
		}
	}
	return nil
}

// pullWhenFree is pull, asked again while the exporter answers busy:
// after 1 ms, doubling up to 50 ms, until ctx ends.
func (p *Peer) pullWhenFree(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp, total uint64, what string) error {
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := p.pull(ctx, h, ops, total, what)
		if !errors.Is(err, errBusy) {
			return err
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w (asked again until: %w)", err, ctx.Err())
		}
	}
}

// pull reads ops of the exporter's layout h through the session. A
// deadline fails the pull, not the session: what comes for it later is
// dropped, and the peer pulls on once the exporter answers again (an
// exporter that ended the session says so, and the peer fails).
func (p *Peer) pull(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp, total uint64, what string) error {
	t := p.t
	r := &pull{id: t.nextReq.Add(1), peer: p, total: total, ch: make(chan error, 1)}
	sent := ops[:0:0]
	for _, o := range ops {
		if o.Size > 0 {
			r.local = append(r.local, piece{o.Local, o.Size})
			sent = append(sent, o)
		}
	}
	hdr, data := readHeader(p.session, r.id, h), appendOps(nil, sent)
	if !t.post(func() { t.startPull(r, hdr, data) }) {
		return fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, what, errClosed)
	}
	var err error
	select {
	case err = <-r.ch:
	case <-ctx.Done():
		cause := fmt.Errorf("%w: ucx: %s: not complete within the deadline: %w", remote.ErrPeerUnavailable, what, kvbmerr.ErrTimeout)
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cause = fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, what, ctx.Err())
		}
		if t.do(func() error { t.endPull(r, cause); return nil }) != nil {
			// Closing: the progress thread may be in its last turn, which
			// can still copy into the destination; the shutdown ends the
			// pull, and the answer waits for it.
			<-t.done
			return cause
		}
		err = <-r.ch // cause, or nil when it completed first
	case <-t.done:
		return fmt.Errorf("%w: ucx: %s: %w", remote.ErrPeerUnavailable, what, errClosed)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// The methods below run on the progress thread.

func (t *Transport) startPull(r *pull, hdr, data []byte) {
	p := r.peer
	if err := p.failure(); err != nil {
		t.endPull(r, err)
		return
	}
	t.pulls[r.id] = r
	t.send(p.ep, hdr, data, nil, sendEager|sendReply, func(err error) {
		if err != nil {
			st, _ := err.(ucsError)
			f := fmt.Errorf("%w: ucx: sending the read: %w", remote.ErrPeerUnavailable, err)
			if st.peerFailure() {
				p.fail(f)
			}
			t.endPull(r, f)
		}
	})
}

// pullMessage handles a message to the importer.
func (t *Transport) pullMessage(m *message) {
	switch m.h.kind {
	case kindChallenge, kindWelcome:
		if c := t.connects[m.h.conn]; c != nil {
			select {
			case c.answers <- m:
			default:
			}
		}
	case kindData:
		r := t.pulls[m.h.req]
		if r == nil || m.h.session != r.peer.session {
			// Late (its pull ended) or not this session's: it reaches
			// nothing.
			t.drop(m)
			t.lateDropped.Add(1)
			return
		}
		if err := r.took.take(m.h.offset, m.size, r.total, maxDataMessages(len(r.local), r.total)); err != nil {
			// Not what was asked for (accept.go): it reaches nothing, and
			// the pull fails.
			t.drop(m)
			t.endPull(r, fmt.Errorf("%w: ucx: the exporting worker %x sent %w", kvbmerr.ErrIO, r.peer.worker, err))
			return
		}
		if m.desc == 0 {
			// Eager: the bytes are here, whole; copied to their
			// destination at once.
			r.scatter(m.h.offset, unsafe.Slice((*byte)(m.c.data), m.size))
			r.recvd += m.size
			t.checkPull(r)
			return
		}
		r.recvs++
		t.receiveData(r, m.desc, m.h.offset, m.size)
		m.desc = 0
	case kindDone:
		r := t.pulls[m.h.req]
		if r == nil || m.h.session != r.peer.session {
			t.lateDropped.Add(1)
			return
		}
		r.done, r.status, r.sent, r.msg = true, m.h.status, m.h.total, string(m.data)
		t.checkPull(r)
	}
}

// receiveData receives a data message through a sink (shim.h): UCX hands
// kvbm each piece of it as it arrives, in UCX's own receive memory, and
// kvbm copies it to its destination only while the pull is under way;
// endPull closes the pull's sinks, on this thread, so no byte of a pull
// lands after it was answered, whatever UCX still delivers. UCX is never
// given the destination's address, nor sends any peer a key to it: the
// rendezvous is "am" (exposure.go), and a datatype of kvbm's cannot be
// registered.
func (t *Transport) receiveData(r *pull, desc C.uint64_t, off, size uint64) {
	dst := pieces(r.local, off, size)
	if t.cfg.inPlace {
		t.receive(desc, dst, func(err error, n uint64) {
			r.recvs--
			t.received(r, err, n)
		})
		return
	}
	s := newSink(dst, size)
	if s == nil {
		C.kvbm_ucx_am_drop(t.worker, desc)
		r.recvs--
		t.received(r, fmt.Errorf("ucx: no memory for a receive of %d pieces", len(dst)), 0)
		return
	}
	r.sinks = append(r.sinks, s)
	t.receiveSink(desc, s, func(err error, n uint64) {
		// Closed as well: UCX 1.13 never finishes with a sink after some
		// failures (it stays allocated, a few dozen bytes), and nothing
		// may land through it once its receive completed.
		s.open = 0
		r.recvs--
		r.sinks = slices.DeleteFunc(r.sinks, func(o *C.kvbm_ucx_sink_t) bool { return o == s })
		if err == nil && !r.ended && uint64(s.landed) != n {
			err = fmt.Errorf("ucx: a receive completed with %d of its %d bytes copied", uint64(s.landed), n)
		}
		t.received(r, err, n)
	})
}

// received accounts for a completed receive of r.
func (t *Transport) received(r *pull, err error, n uint64) {
	if err != nil && r.err == nil {
		r.err = err
	} else if err == nil {
		r.recvd += n
	}
	t.checkPull(r)
}

// scatter copies src, bytes [off, off+len(src)) of r's data, to their
// destination, as a copy engine does: the destination is not pulled
// through the cache (32 KiB fragments included).
func (r *pull) scatter(off uint64, src []byte) {
	for _, d := range pieces(r.local, off, uint64(len(src))) {
		src = src[memcopy.Copy(storage.HostBytes(d.addr, d.size), src):]
	}
}

// pieces is the memory of bytes [off, off+n) of a request's data laid
// out in local.
func pieces(local []piece, off, n uint64) []piece {
	var out []piece
	for _, l := range local {
		if off >= l.size {
			off -= l.size
			continue
		}
		k := min(l.size-off, n)
		out = append(out, piece{l.addr + off, k})
		n -= k
		off = 0
		if n == 0 {
			break
		}
	}
	return out
}

// checkPull answers r once the exporter's done came and every receive
// completed.
func (t *Transport) checkPull(r *pull) {
	if r.ended || !r.done || r.recvs > 0 {
		return
	}
	var err error
	switch {
	case r.err != nil:
		err = fmt.Errorf("%w: ucx: receiving the data: %w", remote.ErrPeerUnavailable, r.err)
	case r.status == statusBusy:
		err = fmt.Errorf("%w: worker %x: %s", errBusy, r.peer.worker, r.msg)
	case r.status == statusNoSession:
		err = fmt.Errorf("%w: ucx: worker %x: %s", remote.ErrPeerUnavailable, r.peer.worker, r.msg)
		r.peer.fail(err)
	case r.status != remote.StatusOK:
		err = fmt.Errorf("ucx: the exporting worker: %w", &remote.StatusError{Status: r.status, Msg: r.msg})
	case r.recvd != r.total || r.sent != r.total:
		err = fmt.Errorf("%w: ucx: the exporter sent %d bytes, %d arrived, %d were asked for", kvbmerr.ErrIO, r.sent, r.recvd, r.total)
	}
	t.endPull(r, err)
}

// endPull answers r with err once; later messages for it are dropped,
// and its sinks closed: of the receives under way, nothing lands any more.
func (t *Transport) endPull(r *pull, err error) {
	if r.ended {
		return
	}
	r.ended = true
	delete(t.pulls, r.id)
	for _, s := range r.sinks {
		s.open = 0
	}
	r.ch <- err
}

// failPulls fails the pulls of p.
func (t *Transport) failPulls(p *Peer, err error) {
	for _, r := range t.pulls {
		if r.peer == p {
			t.endPull(r, err)
		}
	}
}
