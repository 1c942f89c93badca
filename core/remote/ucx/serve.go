//go:build cgo

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
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

// statusNoSession answers a read of a session the exporter does not have;
// statusBusy one that would hold more than the bounds below (the importer
// retries it).
const (
	statusNoSession = 0xFF
	statusBusy      = 0xFE
)

// Session budget, and how long after its challenge a hello is taken.
const (
	maxSessions   = 4096
	helloDeadline = 2 * time.Second
)

// session is one importer's proven capability; owned by the progress
// thread.
type session struct {
	id       sessionID
	ep       C.uint64_t // to the address the hello named
	state    *C.kvbm_ucx_epstate_t
	grant    *capability.Grant
	created  time.Time
	importer [32]byte // the hash of the importer's worker address
	sends    int      // messages in flight on ep, and reads being served or queued
	closing  bool     // ep is closing; freed once closed and sends are done
	serving  int      // reads being served (startReads)
	ops      int      // the ops of its reads being served or queued
	queued   []queuedRead
}

// serveMessage handles a message to the exporter.
func (t *Transport) serveMessage(m *message) {
	if t.m == nil || t.cfg.OneSided || t.quitting || !t.exported {
		return // serving only once asked: an endpoint was exported
	}
	switch m.h.kind {
	case kindOpen:
		t.challenge(m)
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

// challengeNonce is the nonce the exporter challenges conn with at, for
// the importer at address: an HMAC under the transport's cookie key, so
// that the exporter keeps nothing until a hello verifies, and a hello
// naming another address fails.
func (t *Transport) challengeNonce(conn, at uint64, address []byte) []byte {
	m := hmac.New(sha256.New, t.cookie[:])
	m.Write([]byte("kvbm-ucx challenge"))
	m.Write(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, conn), at))
	sum := sha256.Sum256(address)
	m.Write(sum[:])
	return m.Sum(nil)
}

// challenge answers an open, on the endpoint it came on.
func (t *Transport) challenge(m *message) {
	if m.reply == 0 || len(m.data) == 0 || len(m.data) > maxAddressLen {
		t.refuse("an open", fmt.Sprintf("sent without a reply endpoint or with an address of %d bytes", len(m.data)))
		return
	}
	at := uint64(time.Now().UnixNano())
	t.send(m.reply, challengeHeader(m.h.conn, at, t.challengeNonce(m.h.conn, at, m.data)), nil, nil, sendEager, nil)
}

// hello verifies an importer's hello: the capability its metadata
// carries, for the address it names, within helloDeadline of the
// challenge. Only then does the exporter make an endpoint (to that
// address) and a session.
func (t *Transport) hello(m *message) {
	address, hb, err := parseHelloData(m.data)
	why := ""
	var h capability.Hello
	now := time.Now()
	switch {
	case err != nil:
		why = err.Error()
	case m.h.at > uint64(now.UnixNano()) || uint64(now.UnixNano())-m.h.at > uint64(helloDeadline):
		why = fmt.Sprintf("the hello came later than %v after its challenge", helloDeadline)
	default:
		if h, err = capability.ParseHello(hb[:min(len(hb), capability.HelloLen)]); err != nil {
			why = err.Error()
		} else if len(hb) != capability.HelloLen+h.ScopeLen {
			why = fmt.Sprintf("a hello of %d bytes with a %d-byte scope", len(hb), h.ScopeLen)
		} else if h.ScopeLen > 0 {
			h.Scope = hb[capability.HelloLen:]
		}
	}
	var answer []byte
	var g capability.Grant
	if why == "" {
		g, answer, why = t.verifier.Verify(h, t.challengeNonce(m.h.conn, m.h.at, address), t.m.WorkerID(), now)
	}
	if answer == nil {
		t.refuse("a hello", why)
		if m.reply != 0 { // refused with nothing said but that, as TCP's closed connection
			t.send(m.reply, welcomeHeader(m.h.conn, false, sessionID{}), nil, nil, sendEager, nil)
		}
		return
	}
	importer := sha256.Sum256(address)
	if len(t.sessions) >= cmp.Or(t.maxSessions, maxSessions) {
		t.evictSession(importer)
	}
	s := &session{grant: &g, created: now, importer: importer}
	if _, err := rand.Read(s.id[:]); err != nil {
		slog.Error("ucx: draw a session id", "err", err)
		return
	}
	s.state = (*C.kvbm_ucx_epstate_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvbm_ucx_epstate_t{}))))
	caddr := C.CBytes(address)
	defer C.free(caddr)
	if err := status(C.kvbm_ucx_ep_create(t.worker, caddr, s.state, &s.ep)); err != nil {
		C.free(unsafe.Pointer(s.state))
		t.refuse("a hello", fmt.Sprintf("cannot reach the worker address it named: %v", err))
		return
	}
	t.sessions[s.id] = s
	t.sendOn(s, welcomeHeader(m.h.conn, true, s.id), answer, nil, nil)
}

// evictSession makes room for a session of importer: it closes the
// oldest session of the importer holding the most (counting the one to
// come), so that an importer that opens sessions without end evicts its
// own, not another's. An importer is the worker address its hello named,
// which a capability holder chooses: one with many workers holds more.
func (t *Transport) evictSession(importer [32]byte) {
	held := map[[32]byte]int{importer: 1}
	most := 1
	for _, o := range t.sessions {
		held[o.importer]++
		most = max(most, held[o.importer])
	}
	var oldest *session
	for _, o := range t.sessions {
		if held[o.importer] == most && (oldest == nil || o.created.Before(oldest.created)) {
			oldest = o
		}
	}
	if onceASecond(&t.lastEvictLog) {
		slog.Warn("ucx: too many sessions; the oldest of the importer holding the most is closed", "limit", cmp.Or(t.maxSessions, maxSessions), "held by that importer", most)
	}
	t.endSession(oldest)
}

// read serves a read of a verified session in a goroutine of its own:
// the manager may wait on device copies and the sends on the importer.
func (t *Transport) read(m *message) {
	s := t.sessions[m.h.session]
	if s == nil || s.closing {
		// Nothing but that, on the endpoint the read came on (not even the
		// worker's id): an importer whose session the exporter ended
		// (evicted, or after a send to it failed) learns it and connects
		// again; a peer that guessed learns nothing.
		t.refuse("a read", "for no verified session")
		if m.reply != 0 {
			t.send(m.reply, doneHeader(m.h.session, m.h.req, 0, statusNoSession),
				[]byte("the exporting worker has no session for this peer (ended: import its metadata again)"), nil, sendEager, nil)
		}
		return
	}
	ops, _, err := parseOps(m.data)
	if err == nil && m.h.handle.Worker != t.m.WorkerID() {
		err = fmt.Errorf("%w: layout %v is not worker %x's", transfer.ErrNotFound, m.h.handle, t.m.WorkerID())
	}
	if err != nil {
		t.sendOn(s, doneHeader(s.id, m.h.req, 0, remote.StatusOf(err)), []byte(err.Error()), nil, nil)
		return
	}
	if st, err := t.admitRead(s, len(ops)); err != nil {
		t.sendOn(s, doneHeader(s.id, m.h.req, 0, st), []byte(err.Error()), nil, nil)
		return
	}
	s.sends++ // the session lives until its reads are answered
	t.holdOps(s, len(ops))
	s.queued = append(s.queued, queuedRead{m.h.req, m.h.handle, ops})
	t.startReads(s)
}

// Reads served at once per session, and queued beyond those; and the ops
// the reads being served or queued hold (24 bytes each in memory), per
// session and in all: a holder of a capability cannot make the exporter
// start unbounded work, nor hold unbounded memory. A read past a bound is
// answered "busy", and the importer asks again a little later (peer.go),
// until its deadline.
const (
	maxServingReads = 16
	maxQueuedReads  = 1024
	maxSessionOps   = 1 << 21 // 48 MiB of ops
	maxHeldOps      = 1 << 23 // 192 MiB
)

// admitRead says whether a read of n ops may be queued for s: nil, or the
// status to answer (statusBusy: asked again later, it may fit) and why.
func (t *Transport) admitRead(s *session, n int) (byte, error) {
	limit := cmp.Or(t.maxHeldOps, maxHeldOps)
	perSession := min(maxSessionOps, limit)
	switch {
	case n > perSession:
		return remote.StatusOf(kvbmerr.ErrUnsupported), fmt.Errorf("%w: ucx: a read of %d ops, more than a session's reads may hold (%d)",
			kvbmerr.ErrUnsupported, n, perSession)
	case len(s.queued) >= maxQueuedReads:
		return statusBusy, fmt.Errorf("the session has %d reads being served and %d queued", s.serving, len(s.queued))
	case s.ops+n > perSession:
		return statusBusy, fmt.Errorf("the session's reads being served or queued hold %d ops, and this one %d more (at most %d)",
			s.ops, n, perSession)
	case t.ops+n > limit:
		return statusBusy, fmt.Errorf("the exporter's reads being served or queued hold %d ops, and this one %d more (at most %d)",
			t.ops, n, limit)
	}
	return 0, nil
}

// holdOps counts n more ops (fewer when negative) held by s's reads.
func (t *Transport) holdOps(s *session, n int) {
	s.ops += n
	t.ops += n
}

type queuedRead struct {
	req uint64
	h   transfer.LayoutHandle
	ops []transfer.RemoteOp
}

// startReads serves a session's queued reads, up to maxServingReads at
// once, each in a goroutine of its own.
func (t *Transport) startReads(s *session) {
	for s.serving < maxServingReads && len(s.queued) > 0 {
		q := s.queued[0]
		s.queued = s.queued[1:]
		s.serving++
		t.servingReads++
		t.serves.Add(1)
		go func() {
			defer t.serves.Done()
			t.serveRead(s, q.req, q.h, q.ops)
		}()
	}
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
			if t.breakChunks != nil {
				chunks = t.breakChunks(chunks)
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
	hdr := doneHeader(s.id, req, sent, remote.StatusOf(err))
	t.post(func() {
		s.sends--
		s.serving--
		t.servingReads--
		t.holdOps(s, -len(ops))
		t.sendOn(s, hdr, []byte(msg), nil, nil)
		t.freeSession(s)
		t.served.Add(1)
		t.startReads(s)
	})
}

// A data message holds at most chunkBytes (accept.go). Pieces under
// smallPiece (a block's fragments) travel together, up to maxPieces a
// message, so that each does not pay UCX's rendezvous; larger ones
// alone, contiguous, which UCX can send zero-copy.
const (
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
			t.post(func() { t.refuse("a read", err.Error()) })
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
			t.sendOn(s, dataHeader(s.id, req, c.offset), nil, c.pieces, func(err error) { done <- err })
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
	flags := 0
	if data != nil || pieces == nil {
		flags = sendEager
	}
	t.send(s.ep, hdr, data, pieces, flags, func(err error) {
		s.sends--
		if err != nil && !s.closing && !t.quitting {
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
	s.sends -= len(s.queued) // queued reads are not served
	for _, q := range s.queued {
		t.holdOps(s, -len(q.ops))
	}
	s.queued = nil
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

// reapSessions ends sessions whose endpoint failed, and frees closed
// ones; on the progress thread.
func (t *Transport) reapSessions() {
	for _, s := range t.sessions {
		if s.state.failed != 0 {
			t.endSession(s)
		}
	}
	for _, s := range append([]*session(nil), t.closingSessions...) {
		t.freeSession(s)
	}
}

// onceASecond says whether a second has passed since *last, and if so
// sets it to now: a warning a peer can repeat is logged at most that often.
func onceASecond(last *time.Time) bool {
	now := time.Now()
	if now.Sub(*last) < time.Second {
		return false
	}
	*last = now
	return true
}

// refuse logs a refused message, rate limited, and counts it.
func (t *Transport) refuse(what, why string) {
	n := t.refused.Add(1)
	if onceASecond(&t.lastRefusalLog) {
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
