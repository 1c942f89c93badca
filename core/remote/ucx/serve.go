//go:build cgo

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// The exporter's side of the message mode: sessions opened by an
// importer's hello, and the reads they ask for, served from the manager
// (transfer.Manager.Serve: bounds, the layout's in-flight gate, device
// memory through its staging) and sent on the session's own endpoint.

// Session budgets: sessions whose hello has not verified (each holds an
// endpoint to the address its open named) and those that have.
const (
	maxPendingSessions = 256
	maxSessions        = 4096
	helloDeadline      = 2 * time.Second
)

// session is one importer's proven capability; owned by the progress
// thread.
type session struct {
	id      sessionID
	conn    uint64
	nonce   []byte
	ep      C.uint64_t
	state   *C.kvbm_ucx_epstate_t
	grant   *capability.Grant // nil until the hello verifies
	created time.Time
	sends   int  // messages in flight on ep
	closing bool // ep is closing; freed once closed and sends are done
}

// serveMessage handles a message to the exporter.
func (t *Transport) serveMessage(m *message) {
	switch m.h.kind {
	case kindOpen:
		t.open1(m)
	case kindHello:
		t.hello(m)
	case kindRead:
		t.read(m)
	case kindBye:
		if s := t.sessions[m.h.session]; s != nil {
			t.endSession(s)
		}
	}
}

// open1 answers an open with a challenge, on an endpoint to the address
// the open named.
func (t *Transport) open1(m *message) {
	if t.m == nil || t.cfg.OneSided {
		return
	}
	if len(m.data) == 0 || len(m.data) > maxAddressLen {
		t.refuse("", "an open", fmt.Sprintf("a worker address of %d bytes", len(m.data)))
		return
	}
	pending := 0
	var oldest *session
	for _, s := range t.sessions {
		if s.grant == nil && !s.closing {
			pending++
			if oldest == nil || s.created.Before(oldest.created) {
				oldest = s
			}
		}
	}
	if pending >= maxPendingSessions {
		t.refuse("", "an open", "too many hellos pending: the oldest is dropped")
		t.endSession(oldest)
	}
	s := &session{conn: m.h.conn, created: time.Now()}
	var err error
	if s.nonce, err = capability.NewNonce(); err == nil {
		_, err = rand.Read(s.id[:])
	}
	if err != nil {
		slog.Error("ucx: draw a session nonce", "err", err)
		return
	}
	s.state = (*C.kvbm_ucx_epstate_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvbm_ucx_epstate_t{}))))
	addr := C.CBytes(m.data)
	defer C.free(addr)
	if err := status(C.kvbm_ucx_ep_create(t.worker, addr, s.state, &s.ep)); err != nil {
		C.free(unsafe.Pointer(s.state))
		t.refuse("", "an open", fmt.Sprintf("cannot reach the worker address it named: %v", err))
		return
	}
	t.sessions[s.id] = s
	t.sendOn(s, challengeHeader(s.conn, s.id, s.nonce), nil, nil, nil)
}

// hello verifies a session's hello: the capability its importer proves.
func (t *Transport) hello(m *message) {
	s := t.sessions[m.h.session]
	if s == nil || s.grant != nil || s.closing {
		t.refuse("", "a hello", "for no session waiting for one")
		return
	}
	why := ""
	h, err := capability.ParseHello(m.data[:min(len(m.data), capability.HelloLen)])
	switch {
	case err != nil:
		why = err.Error()
	case len(m.data) != capability.HelloLen+h.ScopeLen:
		why = fmt.Sprintf("a hello of %d bytes with a %d-byte scope", len(m.data), h.ScopeLen)
	case time.Since(s.created) > helloDeadline:
		why = fmt.Sprintf("the hello came %v after its open, later than %v", time.Since(s.created).Round(time.Millisecond), helloDeadline)
	}
	var answer []byte
	var g capability.Grant
	if why == "" {
		if h.ScopeLen > 0 {
			h.Scope = m.data[capability.HelloLen:]
		}
		g, answer, why = t.verifier.Verify(h, s.nonce, t.m.WorkerID(), time.Now())
	}
	if answer == nil {
		t.refuse("", "a hello", why)
		// Refused with nothing said but that: as the TCP transport's
		// closed connection.
		t.sendOn(s, welcomeHeader(s.conn, false), nil, nil, nil)
		t.endSession(s)
		return
	}
	verified := 0
	var oldest *session
	for _, o := range t.sessions {
		if o.grant != nil && !o.closing {
			verified++
			if oldest == nil || o.created.Before(oldest.created) {
				oldest = o
			}
		}
	}
	if verified >= maxSessions {
		slog.Warn("ucx: too many sessions; the oldest is closed", "limit", maxSessions)
		t.endSession(oldest)
	}
	s.grant, s.nonce = &g, nil
	t.sendOn(s, welcomeHeader(s.conn, true), answer, nil, nil)
}

// read serves a read of a verified session in a goroutine of its own:
// the manager may wait on device copies and the sends on the importer.
func (t *Transport) read(m *message) {
	s := t.sessions[m.h.session]
	if s == nil || s.grant == nil || s.closing {
		// No answer: only a session's own endpoint is answered on.
		t.refuse("", "a read", "for no verified session")
		return
	}
	ops, _, err := parseOps(m.data)
	if err == nil && m.h.handle.Worker != t.m.WorkerID() {
		err = fmt.Errorf("%w: layout %v is not worker %x's", transfer.ErrNotFound, m.h.handle, t.m.WorkerID())
	}
	if err != nil {
		t.sendOn(s, doneHeader(m.h.req, 0, remote.StatusOf(err)), []byte(err.Error()), nil, nil)
		return
	}
	s.sends++ // the session lives until its reads are answered
	t.serves.Add(1)
	go func() {
		defer t.serves.Done()
		t.serveRead(s, m.h.req, m.h.handle, ops)
	}()
}

// serveRead checks a read against the session's capability, sends its
// bytes and then its status; not on the progress thread.
func (t *Transport) serveRead(s *session, req uint64, h transfer.LayoutHandle, ops []transfer.RemoteOp) {
	var sent uint64
	err := t.inScope(s.grant, h, ops, func() error {
		return t.m.Serve(h, ops, false, func(pieces [][]byte) error {
			chunks := chunk(pieces, sent)
			for _, c := range chunks {
				sent += c.size
			}
			return t.sendAndWait(s, req, chunks)
		})
	})
	msg := ""
	if err != nil {
		msg = err.Error()
		if len(msg) > maxDoneMsg {
			msg = msg[:maxDoneMsg]
		}
	}
	hdr := doneHeader(req, sent, remote.StatusOf(err))
	t.post(func() {
		s.sends--
		t.sendOn(s, hdr, []byte(msg), nil, nil)
		t.freeSession(s)
		t.served.Add(1)
	})
}

// chunkBytes bounds a data message: each is received, then copied out of
// staging while the next arrives. Pieces under smallPiece (a block's
// fragments) travel together, up to maxPieces a message, so that each
// does not pay UCX's rendezvous; larger ones alone, contiguous, which
// UCX can send zero-copy.
const (
	chunkBytes = 4 << 20
	smallPiece = 256 << 10
	maxPieces  = 128
)

// dataChunk is one data message: bytes at offset of the request.
type dataChunk struct {
	offset, size uint64
	pieces       []piece
	small        bool // made of pieces under smallPiece
}

// chunk cuts pieces, which start at offset of the request, into data
// messages.
func chunk(pieces [][]byte, offset uint64) []dataChunk {
	var out []dataChunk
	for _, p := range pieces {
		addr, n := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))), uint64(len(p))
		for n > 0 {
			if last := len(out) - 1; last >= 0 && out[last].size < chunkBytes {
				c := &out[last]
				lp := &c.pieces[len(c.pieces)-1]
				k := min(n, chunkBytes-c.size)
				switch {
				case lp.addr+lp.size == addr: // contiguous: one piece
					lp.size += k
				case c.small && n < smallPiece && c.size+n <= chunkBytes && len(c.pieces) < maxPieces:
					c.pieces = append(c.pieces, piece{addr, k})
				default:
					k = 0
				}
				if k > 0 {
					c.size += k
					addr, n, offset = addr+k, n-k, offset+k
					continue
				}
			}
			k := min(n, chunkBytes)
			out = append(out, dataChunk{offset: offset, size: k, pieces: []piece{{addr, k}}, small: k < smallPiece})
			addr, n, offset = addr+k, n-k, offset+k
		}
	}
	return out
}

// inScope runs serve when the grant allows reading ops of h: any range
// for a whole-worker grant, the blocks a block scope covers, unexpired
// and not revoked since it was made (checked and served between
// Revocations.Enter and Exit, so a revocation waits for the read).
func (t *Transport) inScope(g *capability.Grant, h transfer.LayoutHandle, ops []transfer.RemoteOp, serve func() error) error {
	if g.Scope != capability.ScopeBlocks {
		return serve()
	}
	ticket := t.revoked.Enter()
	defer t.revoked.Exit(ticket)
	var err error
	if g.Blocks.Expired(time.Now()) {
		err = fmt.Errorf("%w: the peer's request-scoped capability of worker %x expired", kvbmerr.ErrUnsupported, t.m.WorkerID())
	} else if l, _, lerr := t.m.Layout(h); lerr != nil {
		err = lerr
	} else {
		err = remote.Covers(g.Blocks, &t.revoked, h, l, ops)
	}
	if err != nil {
		if !errors.Is(err, transfer.ErrWithdrawn) {
			t.post(func() { t.refuse("", "a read", err.Error()) })
		}
		return err
	}
	return serve()
}

// sendAndWait sends a read's data messages on the session's endpoint and
// waits until UCX is done with their memory, which the manager lends only
// until this returns: past the manager's remote deadline the session is
// closed, which makes UCX give the sends back.
func (t *Transport) sendAndWait(s *session, req uint64, chunks []dataChunk) error {
	done := make(chan error, len(chunks))
	if !t.post(func() {
		for _, c := range chunks {
			t.sendOn(s, dataHeader(req, c.offset), nil, c.pieces, func(err error) { done <- err })
		}
	}) {
		return fmt.Errorf("%w: ucx: %w", remote.ErrPeerUnavailable, errClosed)
	}
	timer := time.NewTimer(t.m.RemoteDeadline())
	defer timer.Stop()
	var first error
	for got := 0; got < len(chunks); got++ {
		select {
		case err := <-done:
			if first == nil {
				first = err
			}
			continue
		case <-timer.C:
		}
		t.post(func() { t.endSession(s) })
		for ; got < len(chunks); got++ { // the close cancels the sends; the memory is free only then
			<-done
		}
		return fmt.Errorf("%w: ucx: the importer did not take a read's data within %v", remote.ErrPeerUnavailable, t.m.RemoteDeadline())
	}
	return first
}

// sendOn sends on a session's endpoint; a session closing sends nothing
// (onDone gets the reason).
func (t *Transport) sendOn(s *session, hdr, data []byte, pieces []piece, onDone func(error)) {
	if s.closing {
		if onDone != nil {
			onDone(fmt.Errorf("%w: ucx: the importer's session is closed", remote.ErrPeerUnavailable))
		}
		return
	}
	s.sends++
	t.send(s.ep, hdr, data, pieces, data != nil || pieces == nil, func(err error) {
		s.sends--
		if err != nil && !s.closing {
			t.endSession(s)
		}
		if onDone != nil {
			onDone(err)
		}
		t.freeSession(s)
	})
}

// endSession closes a session's endpoint (force: the importer may be
// gone); what is in flight on it fails, and the session is freed once
// the close and its sends are done.
func (t *Transport) endSession(s *session) {
	if s.closing {
		return
	}
	s.closing = true
	delete(t.sessions, s.id)
	t.closingSessions = append(t.closingSessions, s)
	C.kvbm_ucx_ep_close(s.ep, 1, s.state)
	t.freeSession(s)
}

// freeSession frees a closed session's state once nothing uses it.
func (t *Transport) freeSession(s *session) {
	if !s.closing || s.sends > 0 || s.state == nil || s.state.closing != 0 {
		return
	}
	C.free(unsafe.Pointer(s.state))
	s.state = nil
	for i, o := range t.closingSessions {
		if o == s {
			t.closingSessions = append(t.closingSessions[:i], t.closingSessions[i+1:]...)
			break
		}
	}
}

// reapSessions ends sessions whose endpoint failed and hellos that never
// came, and frees closed ones; on the progress thread.
func (t *Transport) reapSessions() {
	for _, s := range t.sessions {
		if s.state.failed != 0 || (s.grant == nil && time.Since(s.created) > helloDeadline) {
			t.endSession(s)
		}
	}
	for _, s := range append([]*session(nil), t.closingSessions...) {
		t.freeSession(s)
	}
}

// refuse logs a refused message, rate limited, and counts it.
func (t *Transport) refuse(from, what, why string) {
	n := t.refused.Add(1)
	if now := time.Now(); now.Sub(t.lastRefusalLog) >= time.Second {
		t.lastRefusalLog = now
		slog.Warn("ucx: refused "+what, "worker", fmt.Sprintf("%#x", t.workerID()), "reason", why, "refused so far", n)
	}
}

func (t *Transport) workerID() uint64 {
	if t.m == nil {
		return 0
	}
	return t.m.WorkerID()
}

// Served counts the reads answered (their status sent).
func (t *Transport) Served() uint64 { return t.served.Load() }

// Refused counts the messages refused: opens, hellos and reads without a
// verified session, malformed ones, reads outside a scope.
func (t *Transport) Refused() uint64 { return t.refused.Load() }
