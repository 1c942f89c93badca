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
	"maps"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Progress loop timing: it spins while UCX reports progress or for
// spinFor after, then polls every busyPoll while operations are pending
// and every idlePoll otherwise (an exporter's worker must progress for
// transports whose one-sided operations its CPU serves, such as TCP).
const (
	spinFor  = 100 * time.Microsecond
	busyPoll = 50 * time.Microsecond
	idlePoll = time.Millisecond
)

// closeGrace bounds how long Close waits for endpoints to close.
const closeGrace = 2 * time.Second

// abortGrace bounds how long an operation past its deadline waits for
// UCX to cancel its requests after the endpoint is closed, before its
// caller is answered anyway. Requests UCX does not cancel (those of
// RMA emulated over active messages wait for replies that UCX does not
// track) stay with the progress thread, which frees their memory when
// they complete.
const abortGrace = 20 * time.Millisecond

// Transport is the UCX transport. Safe for concurrent use.
type Transport struct {
	cfg  Config
	cmds chan func()
	quit chan struct{} // closed by Close: the loop cleans up and exits
	done chan struct{} // closed when the loop has exited

	mu      sync.Mutex
	closed  bool
	serving *transfer.Manager

	// The capability of the message mode (serve.go): the secret every
	// endpoint's key derives from, and the revoked blocks of block scopes.
	secret     capability.Secret
	deployment capability.Deployment
	verifier   *capability.Verifier
	revoked    capability.Revocations
	refused    atomic.Uint64
	served     atomic.Uint64
	// lateDropped counts the answers that came for no pull under way
	// (after its deadline): dropped unread.
	lateDropped atomic.Uint64
	nextReq     atomic.Uint64
	serves      sync.WaitGroup // reads being served

	// Owned by the progress thread.
	context, worker C.uint64_t
	release         func() // the manager's Hold
	regs            map[regKey]*registration
	// withdrawn are the layouts Withdrawn unmapped: an Endpoint that
	// described one before it was withdrawn registers it no more.
	withdrawn map[transfer.LayoutHandle]bool
	allocs    map[uint64]*allocation // AllocHost, by address
	peers     map[*Peer]struct{}
	address   []byte
	options   map[string]string // the context's entries kvbm set (contextOptions)
	segs      shmSegs           // the context's shared-memory segments (segsize.go)
	m         *transfer.Manager // the served manager, as the progress thread sees it

	// The message mode's state (message.go, serve.go, pull.go).
	inbox           *C.kvbm_ucx_inbox_t
	inflight        []*inflight
	sessions        map[sessionID]*session
	closingSessions []*session
	connects        map[uint64]*connecting
	pulls           map[uint64]*pull
	lastSweep       time.Time
	lastRefusalLog  time.Time
	lastEvictLog    time.Time
	cookie          [32]byte // the key of the challenges' nonces (serve.go)
	quitting        bool     // shutdown began: no message is served
	exported        bool     // an endpoint was made: peers' messages are served from then on
	maxSessions     int      // maxSessions when 0 (tests set less)
	servingReads    int      // reads being served, of every session
	ops             int      // the ops of every session's reads being served or queued
	maxHeldOps      int      // maxHeldOps when 0 (tests set less)
	// Tests: the data messages an exporter that breaks the protocol
	// sends instead of a read's (nil: the read's). Set before any read.
	breakChunks func([]dataChunk) []dataChunk
}

type regKey struct {
	h          transfer.LayoutHandle
	base, size uint64
}

type registration struct {
	memh C.uint64_t
	rkey []byte
	// alloc: the memory of an AllocHost allocation, unmapped with it.
	alloc bool
}

// New creates a UCX context and worker and starts its progress thread.
func New(cfg Config) (*Transport, error) {
	if err := load(); err != nil {
		return nil, err
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	t := &Transport{
		cfg: cfg, cmds: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}),
		regs: map[regKey]*registration{}, allocs: map[uint64]*allocation{}, peers: map[*Peer]struct{}{},
		sessions: map[sessionID]*session{}, connects: map[uint64]*connecting{}, pulls: map[uint64]*pull{},
	}
	var err error
	if t.secret, err = capability.NewSecret(); err != nil {
		return nil, fmt.Errorf("ucx: %w", err)
	}
	key, err := capability.AuthKeyFromEnv()
	if err != nil {
		return nil, fmt.Errorf("ucx: %w", err)
	}
	t.deployment = capability.NewDeployment(key)
	if _, err := rand.Read(t.cookie[:]); err != nil {
		return nil, fmt.Errorf("ucx: draw a key: %w", err)
	}
	t.verifier = capability.NewVerifier(t.secret, t.deployment)
	ready := make(chan error, 1)
	go t.loop(ready)
	if err := <-ready; err != nil {
		<-t.done
		return nil, err
	}
	return t, nil
}

// Name is "ucx".
func (t *Transport) Name() string { return "ucx" }

// Serve makes m's layouts reachable: they are registered with UCX at the
// next Endpoint. The transport holds m open (transfer.Manager.Hold) until
// it is closed, since peers read and write m's memory without m's
// knowledge: close the transport before the manager.
func (t *Transport) Serve(m *transfer.Manager) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return fmt.Errorf("ucx: serve: %w", errClosed)
	case t.serving != nil:
		return fmt.Errorf("%w: ucx: the transport already serves worker %x; one transport serves one manager",
			kvbmerr.ErrAlreadyExists, t.serving.WorkerID())
	}
	release, err := m.Hold()
	if err != nil {
		return fmt.Errorf("ucx: serve worker %x: %w", m.WorkerID(), err)
	}
	t.serving = m
	if err := t.do(func() error { t.release, t.m = release, m; return nil }); err != nil {
		release()
		return err
	}
	return nil
}

var errClosed = errors.New("the UCX transport is closed")

// do runs fn on the progress thread and returns its error.
func (t *Transport) do(fn func() error) error {
	res := make(chan error, 1)
	select {
	case t.cmds <- func() { res <- fn() }:
	case <-t.quit:
		return fmt.Errorf("ucx: %w", errClosed)
	}
	select {
	case err := <-res:
		return err
	case <-t.done: // closed, and fn may have been dropped
		select {
		case err := <-res:
			return err
		default:
			return fmt.Errorf("ucx: %w", errClosed)
		}
	}
}

// post hands fn to the progress thread without waiting; false once the
// transport is closed.
func (t *Transport) post(fn func()) bool {
	select {
	case t.cmds <- fn:
		return true
	case <-t.quit:
		return false
	}
}

// Endpoint registers the layouts the served manager has now (host memory,
// and device memory as Config.DeviceIsHost says; a disk layout is listed
// with the reason peers cannot reach it) and returns the worker address with every region's base,
// size and packed rkey.
func (t *Transport) Endpoint() ([]byte, error) {
	info, err := t.endpointInfo()
	if err != nil {
		return nil, err
	}
	return info.encode(), nil
}

// endpointInfo is what Endpoint encodes: the layouts the served manager
// has now, registered.
func (t *Transport) endpointInfo() (*endpointInfo, error) {
	t.mu.Lock()
	m := t.serving
	t.mu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("%w: ucx: endpoint before Serve", kvbmerr.ErrInvalidArgument)
	}
	var descs []transfer.Descriptor
	handles := m.Handles()
	slices.SortFunc(handles, func(a, b transfer.LayoutHandle) int { return int(a.Layout) - int(b.Layout) })
	for _, h := range handles {
		if h.Worker != m.WorkerID() {
			continue // imported from a peer
		}
		d, err := m.Describe(h)
		if err != nil {
			continue // unregistered meanwhile
		}
		descs = append(descs, d)
	}
	return t.endpointOf(descs)
}

// endpointOf registers the layouts descs describe (on the progress thread;
// those withdrawn since they were described are left out) and describes
// the endpoint.
func (t *Transport) endpointOf(descs []transfer.Descriptor) (*endpointInfo, error) {
	var out *endpointInfo
	err := t.do(func() error {
		if err := t.openWorker(); err != nil {
			return err
		}
		t.exported = true
		info := endpointInfo{address: t.address, proc: thisProcess(), segs: t.segs, worker: t.m.WorkerID(), scope: capability.ScopeReadWrite}
		if t.cfg.OneSided {
			info.mode = modeOneSided
		} else {
			info.key = t.secret.ReadWrite()
		}
		for _, d := range descs {
			if !t.withdrawn[d.Handle] {
				info.layouts = append(info.layouts, t.register(d))
			}
		}
		out = &info
		return nil
	})
	return out, err
}

// register maps a layout's regions (once per region) and describes them;
// on the progress thread.
func (t *Transport) register(d transfer.Descriptor) layoutInfo {
	l := layoutInfo{handle: d.Handle, kind: d.Kind}
	if !d.Kind.IsHost() && d.Kind != storage.Device {
		l.reason = fmt.Sprintf("layout %v is %v: peers reach host and device memory only (stage its blocks in host memory first)", d.Handle, d.Kind)
		return l
	}
	sizes, err := layout.RegionSizes(d.Config, d.Shape.Kind, d.Shape.BlockDim)
	if err == nil && len(sizes) != len(d.Bases) {
		err = fmt.Errorf("%d regions, %d bases", len(sizes), len(d.Bases))
	}
	cuda := d.Kind == storage.Device && !t.cfg.DeviceIsHost
	if err == nil && !t.cfg.OneSided {
		// Messages: the exporter reads its memory itself (Manager.Serve);
		// nothing is registered with UCX, no rkey leaves the process.
		for i := range sizes {
			l.regions = append(l.regions, regionInfo{base: d.Bases[i], size: sizes[i]})
		}
		return l
	}
	for i := 0; err == nil && i < len(sizes); i++ {
		key := regKey{d.Handle, d.Bases[i], sizes[i]}
		r, ok := t.regs[key]
		if !ok {
			if a := t.allocationOf(d.Bases[i], sizes[i]); a != nil {
				r = a.reg // UCX's own memory: its rkey reaches it directly
			} else if r, err = t.mapRegion(d.Bases[i], sizes[i], cuda); err != nil {
				break
			}
			t.regs[key] = r
		}
		l.regions = append(l.regions, regionInfo{base: d.Bases[i], size: sizes[i], rkey: r.rkey})
	}
	if err != nil {
		l.regions = nil
		l.reason = fmt.Sprintf("the exporter could not register %v layout %v with UCX %s: %v", d.Kind, d.Handle, version, err)
		if cuda {
			l.reason += fmt.Sprintf(" (device memory needs a CUDA-enabled libucp, named by %s)", EnvLib)
		}
	}
	return l
}

func (t *Transport) mapRegion(base, size uint64, cuda bool) (*registration, error) {
	var memh C.uint64_t
	c := C.int(0)
	if cuda {
		c = 1
	}
	if err := status(C.kvbm_ucx_mem_map(t.context, C.uint64_t(base), C.uint64_t(size), c, &memh)); err != nil {
		return nil, fmt.Errorf("ucp_mem_map of %d bytes at %#x: %w", size, base, err)
	}
	r, err := t.packRegion(memh)
	if err != nil {
		C.kvbm_ucx_mem_unmap(t.context, memh)
		return nil, err
	}
	return r, nil
}

// packRegion packs the rkey of a mapped region.
func (t *Transport) packRegion(memh C.uint64_t) (*registration, error) {
	var buf unsafe.Pointer
	var n C.size_t
	if err := status(C.kvbm_ucx_rkey_pack(t.context, memh, &buf, &n)); err != nil {
		return nil, fmt.Errorf("ucp_rkey_pack: %w", err)
	}
	r := &registration{memh: memh, rkey: C.GoBytes(buf, C.int(n))}
	C.kvbm_ucx_rkey_buffer_release(buf)
	if err := checkRkey(r.rkey); err != nil {
		// A map that reaches no memory domain: no transport of this
		// UCX can reach memory of this type.
		return nil, fmt.Errorf("no UCX memory domain can register it (%v)", err)
	}
	return r, nil
}

// Close fails the operations in flight on every peer, closes them,
// unregisters the memory and destroys the worker and context; then the
// served manager can close.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		<-t.done
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	close(t.quit)
	<-t.done
	return nil
}

// loop is the progress thread: it owns the worker.
func (t *Transport) loop(ready chan<- error) {
	defer close(t.done)
	// The thread stays locked until it exits: UCX keeps per-thread state,
	// so the thread is not handed back to the Go scheduler.
	runtime.LockOSThread()
	if err := t.open(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	C.kvbm_ucx_precise_naps()
	timer := time.NewTimer(idlePoll)
	defer timer.Stop()
	lastProgress := time.Now()
	for {
		for drained := false; !drained; {
			select {
			case fn := <-t.cmds:
				fn()
			default:
				drained = true
			}
		}
		select {
		case <-t.quit:
			t.shutdown()
			return
		default:
		}
		busy := t.postPending()
		if t.progress(32) {
			lastProgress = time.Now()
		}
		if t.deliver() {
			lastProgress = time.Now()
		}
		if t.reapInflight() {
			busy = true
		}
		if t.reap() {
			busy = true
		}
		if time.Since(t.lastSweep) >= idlePoll {
			t.lastSweep = time.Now()
			t.reapSessions()
		}
		if time.Since(lastProgress) < spinFor {
			continue
		}
		if busy || len(t.pulls) > 0 || t.servingReads > 0 {
			// Something is under way: a short nap, on time (a Go timer
			// this short ends most of a millisecond late, which would
			// stall every message of a transfer), then look again.
			C.kvbm_ucx_nap(C.unsigned(busyPoll / time.Microsecond))
			continue
		}
		timer.Reset(idlePoll)
		select {
		case fn := <-t.cmds:
			fn()
			lastProgress = time.Now()
		case <-t.quit:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// progress lets UCX make progress, up to max times; it reports whether
// anything happened.
func (t *Transport) progress(max int) bool {
	return t.worker != 0 && C.kvbm_ucx_progress(t.worker, C.int(max)) > 0
}

// open makes the context, with the entries contextOptions gives; the
// worker, which opens the network devices, comes at the first export or
// connect (openWorker).
func (t *Transport) open() error {
	opts, err := t.cfg.contextOptions(cachedResources, Settings)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	nv := C.malloc(C.size_t(2*max(1, len(keys))) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(nv)
	cn := unsafe.Slice((**C.char)(nv), 2*max(1, len(keys)))
	for i, k := range keys {
		cn[i], cn[len(keys)+i] = C.CString(k), C.CString(opts[k])
	}
	defer func() {
		for _, p := range cn[:2*len(keys)] {
			C.free(unsafe.Pointer(p))
		}
	}()
	if err := status(C.kvbm_ucx_init(&cn[0], &cn[len(keys)], C.int(len(keys)), boolInt(t.cfg.OneSided), &t.context)); err != nil {
		return fmt.Errorf("ucx: ucp_init (options %v): %w", opts, err)
	}
	t.options, t.segs = opts, segsOf(opts)
	return nil
}

// Probe opens the worker as a first export or connect would (its network
// devices), and gives the entries kvbm set for the context (UCX's own
// settings give the rest): what the info command reports.
func (t *Transport) Probe() (map[string]string, error) {
	return maps.Clone(t.options), t.do(t.openWorker)
}

// openWorker makes the worker, once: asked to serve (an export) or to
// reach a peer (a connect), and not before, since it listens on its
// network devices; on the progress thread.
func (t *Transport) openWorker() error {
	if t.worker != 0 {
		return nil
	}
	var w C.uint64_t
	if err := status(C.kvbm_ucx_worker_create(t.context, &w)); err != nil {
		return fmt.Errorf("ucx: ucp_worker_create: %w", err)
	}
	var addr unsafe.Pointer
	var n C.size_t
	if err := status(C.kvbm_ucx_worker_address(w, &addr, &n)); err != nil {
		C.kvbm_ucx_worker_destroy(w)
		return fmt.Errorf("ucx: ucp_worker_get_address: %w", err)
	}
	address := C.GoBytes(addr, C.int(n))
	C.kvbm_ucx_worker_release_address(w, addr)
	t.worker = w
	if !t.cfg.OneSided {
		if err := t.listen(); err != nil {
			C.kvbm_ucx_worker_destroy(w)
			t.worker = 0
			return err
		}
	}
	t.address = address
	return nil
}

// shutdown fails and closes every peer, waits for the closes, then
// releases everything; on the progress thread.
func (t *Transport) shutdown() {
	t.quitting = true
	for p := range t.peers {
		p.fail(fmt.Errorf("%w: ucx: the transport was closed", remote.ErrPeerUnavailable))
	}
	for _, s := range t.sessions {
		t.endSession(s)
	}
	// Wait for the closes; requests UCX did not cancel (RMA emulated over
	// active messages, waiting for replies) go with the worker.
	deadline := time.Now().Add(closeGrace)
	for t.worker != 0 && time.Now().Before(deadline) {
		C.kvbm_ucx_progress(t.worker, 32)
		t.deliver()
		t.reapInflight()
		t.reap()
		closing := false
		for p := range t.peers {
			closing = closing || p.state.closing != 0
		}
		for _, s := range slices.Clone(t.closingSessions) {
			t.freeSession(s)
			closing = closing || (s.state != nil && s.state.closing != 0)
		}
		if !closing {
			break
		}
	}
	left := make([]*Peer, 0, len(t.peers))
	for p := range t.peers {
		if p.state.closing != 0 {
			slog.Warn("ucx: an endpoint is still closing at shutdown; destroying the worker anyway")
		}
		p.destroyRkeys()
		left = append(left, p)
	}
	for _, r := range t.regs {
		if !r.alloc {
			C.kvbm_ucx_mem_unmap(t.context, r.memh)
		}
	}
	t.regs = nil
	for _, a := range t.allocs {
		C.kvbm_ucx_mem_unmap(t.context, a.reg.memh)
	}
	t.allocs = nil
	if t.worker != 0 {
		C.kvbm_ucx_worker_destroy(t.worker)
	}
	C.kvbm_ucx_cleanup(t.context)
	// No callback can run now: fail what is left and free it.
	t.freeAfterWorker()
	for _, p := range left {
		for _, b := range p.batches {
			p.finish(b)
		}
		p.batches = nil
		p.freeState()
	}
	// Reads being served wait for their sends, failed above.
	t.serves.Wait()
	if t.release != nil {
		t.release()
	}
	// Commands sent while quitting are dropped: their callers see done.
	for {
		select {
		case <-t.cmds:
		default:
			return
		}
	}
}

// postPending posts the queued operations of every peer within its
// in-flight budget; it reports whether any operation is pending.
func (t *Transport) postPending() bool {
	busy := false
	for p := range t.peers {
		if p.postQueued(t.cfg.MaxInFlight) {
			busy = true
		}
	}
	return busy
}

// reap finishes completed batches and handles peer failures and closes;
// it reports whether any operation is still pending.
func (t *Transport) reap() bool {
	busy := false
	for p := range t.peers {
		if p.reap() {
			busy = true
		}
	}
	return busy
}
