//go:build cgo

package ucx

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/kvbm/kvbm/core/remote"
)

// The progress thread's side of the messages (am.go): sending, receiving
// into memory it names, and the completions of both. Everything here runs
// on the progress thread.

// piece is host memory a message's data is sent from or received into.
type piece struct{ addr, size uint64 }

// inflight is a send or receive UCX has not completed: its C state, the C
// memory it uses (freed once complete) and what to do then.
type inflight struct {
	c      *C.kvbm_ucx_req_t
	cmem   []unsafe.Pointer
	sink   *C.kvbm_ucx_sink_t // a receive's, released once complete
	onDone func(err error, length uint64)
}

// message is one taken from the inbox.
type message struct {
	h     header
	reply C.uint64_t // the endpoint back to its sender (sent with reply), valid while it is handled; 0 otherwise
	desc  C.uint64_t // a rendezvous descriptor, 0 when data holds the bytes
	size  uint64
	data  []byte // copied out of C (requests, answers); nil for kindData
	c     *C.kvbm_ucx_msg_t
}

// listen installs the message handler on the worker.
func (t *Transport) listen() error {
	t.inbox = (*C.kvbm_ucx_inbox_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvbm_ucx_inbox_t{}))))
	if err := status(C.kvbm_ucx_am_listen(t.worker, amID, t.inbox)); err != nil {
		C.free(unsafe.Pointer(t.inbox))
		t.inbox = nil
		return fmt.Errorf("ucx: ucp_worker_set_am_recv_handler: %w", err)
	}
	return nil
}

// deliver hands the messages the last progress queued to their handlers;
// it reports whether there were any.
func (t *Transport) deliver() bool {
	if t.inbox == nil || t.inbox.head == nil { // read here: no cgo call on every turn of the loop
		return false
	}
	m := C.kvbm_ucx_am_take(t.inbox)
	for m != nil {
		next := m.next
		t.handle(m)
		m = next
	}
	return true
}

func (t *Transport) handle(cm *C.kvbm_ucx_msg_t) {
	defer C.kvbm_ucx_msg_free(cm)
	hb := C.GoBytes(unsafe.Add(unsafe.Pointer(cm), unsafe.Offsetof(cm.header)), C.int(cm.header_len))
	h, err := parseHeader(hb)
	msg := &message{h: h, reply: cm.reply_ep, desc: cm.desc, size: uint64(cm.length), c: cm}
	if err != nil {
		t.drop(msg)
		t.refuse("a malformed message", err.Error())
		return
	}
	if h.kind != kindData && msg.size > 0 {
		if msg.desc != 0 || msg.size > maxReadOps*16 {
			// Requests and answers are small and sent eager.
			t.drop(msg)
			t.refuse("a malformed message", fmt.Sprintf("a %v message of %d bytes sent by rendezvous", h.kind, msg.size))
			return
		}
		msg.data = C.GoBytes(cm.data, C.int(cm.length))
	}
	switch h.kind {
	case kindOpen, kindHello, kindRead, kindBye:
		t.serveMessage(msg)
	default:
		t.pullMessage(msg)
	}
}

// drop releases a message's data unreceived.
func (t *Transport) drop(m *message) {
	if m.desc != 0 {
		C.kvbm_ucx_am_drop(t.worker, m.desc)
		m.desc = 0
	}
}

// How a message is sent (send's flags).
const (
	sendEager = 1 << iota // requests and small answers: UCX's eager protocol
	sendReply             // the receiver gets an endpoint back (message.reply)
)

// send sends a message on ep: header, then data (copied into C memory)
// or, when data is nil, the pieces (host memory that stays valid until
// onDone).
func (t *Transport) send(ep C.uint64_t, hdr, data []byte, pieces []piece, flags int, onDone func(error)) {
	f := &inflight{c: newReq()}
	f.onDone = func(err error, _ uint64) {
		if onDone != nil {
			onDone(err)
		}
	}
	ch := C.CBytes(hdr)
	f.cmem = append(f.cmem, ch)
	if data != nil {
		cd := C.CBytes(data)
		f.cmem = append(f.cmem, cd)
		pieces = []piece{{uint64(uintptr(cd)), uint64(len(data))}}
	}
	iov, n := t.iov(f, pieces)
	C.kvbm_ucx_am_send(ep, amID, ch, C.size_t(len(hdr)), iov, n, boolInt(flags&sendEager != 0), boolInt(flags&sendReply != 0), f.c)
	t.track(f)
}

// newReq is the C state of a request, for UCX's completion to fill.
func newReq() *C.kvbm_ucx_req_t {
	return (*C.kvbm_ucx_req_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvbm_ucx_req_t{}))))
}

// receive receives a rendezvous message's data into pieces.
func (t *Transport) receive(desc C.uint64_t, pieces []piece, onDone func(err error, length uint64)) {
	f := &inflight{c: newReq(), onDone: onDone}
	iov, n := t.iov(f, pieces)
	C.kvbm_ucx_am_recv(t.worker, desc, iov, n, f.c)
	t.track(f)
}

// receiveSink receives a rendezvous message's data through s (sink.go);
// onDone runs before s is released.
func (t *Transport) receiveSink(desc C.uint64_t, s *C.kvbm_ucx_sink_t, onDone func(err error, length uint64)) {
	f := &inflight{c: newReq(), sink: s, onDone: onDone}
	C.kvbm_ucx_am_recv_sink(t.worker, desc, s, f.c)
	t.track(f)
}

// iov makes the C array of pieces, owned by f.
func (t *Transport) iov(f *inflight, pieces []piece) (*C.kvbm_ucx_iov_t, C.size_t) {
	if len(pieces) == 0 {
		return nil, 0
	}
	p := C.calloc(C.size_t(len(pieces)), C.size_t(unsafe.Sizeof(C.kvbm_ucx_iov_t{})))
	f.cmem = append(f.cmem, p)
	cs := unsafe.Slice((*C.kvbm_ucx_iov_t)(p), len(pieces))
	for i, pc := range pieces {
		cs[i] = C.kvbm_ucx_iov_t{buffer: C.uint64_t(pc.addr), length: C.uint64_t(pc.size)}
	}
	return (*C.kvbm_ucx_iov_t)(p), C.size_t(len(pieces))
}

// track keeps f until UCX completes it (at once, or in reapInflight).
func (t *Transport) track(f *inflight) {
	if f.c.done != 0 {
		t.complete(f)
		return
	}
	t.inflight = append(t.inflight, f)
}

// reapInflight completes what UCX finished; it reports whether anything
// is still in flight.
func (t *Transport) reapInflight() bool {
	kept := t.inflight[:0]
	var done []*inflight
	for _, f := range t.inflight {
		if f.c.done != 0 {
			done = append(done, f)
		} else {
			kept = append(kept, f)
		}
	}
	clear(t.inflight[len(kept):])
	t.inflight = kept
	for _, f := range done {
		t.complete(f)
	}
	return len(t.inflight) > 0
}

func (t *Transport) complete(f *inflight) {
	var err error
	if st := ucsError(f.c.status); st != 0 {
		err = st
	}
	length := uint64(f.c.length)
	for _, p := range f.cmem {
		C.free(p)
	}
	C.free(unsafe.Pointer(f.c))
	f.c, f.cmem = nil, nil
	f.onDone(err, length)
	if f.sink != nil {
		releaseSink(f.sink)
		f.sink = nil
	}
}

// freeAfterWorker fails and frees the message mode's state once the
// worker is destroyed: no callback can run any more, so what is still in
// flight never completes.
func (t *Transport) freeAfterWorker() {
	t.freeMessages()
	for _, s := range t.closingSessions {
		if s.state != nil {
			C.free(unsafe.Pointer(s.state))
			s.state = nil
		}
	}
	t.closingSessions = nil
	for _, r := range t.pulls {
		t.endPull(r, fmt.Errorf("%w: ucx: the transport was closed", remote.ErrPeerUnavailable))
	}
}

func (t *Transport) freeMessages() {
	if t.inbox != nil {
		for m := C.kvbm_ucx_am_take(t.inbox); m != nil; {
			next := m.next
			C.kvbm_ucx_msg_free(m) // a rendezvous descriptor went with the worker
			m = next
		}
	}
	for _, f := range t.inflight {
		f.c.status = C.int32_t(ucsErrCanceled)
		if f.sink != nil {
			f.sink.refs = 1 // UCX's went with the worker
		}
		t.complete(f)
	}
	t.inflight = nil
	if t.inbox != nil {
		C.free(unsafe.Pointer(t.inbox))
		t.inbox = nil
	}
}

func (k msgKind) String() string {
	names := [...]string{"", "open", "challenge", "hello", "welcome", "read", "data", "done", "bye"}
	if int(k) < len(names) && k != 0 {
		return names[k]
	}
	return fmt.Sprintf("kind %d", byte(k))
}
