package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/internal/memcopy"
)

// The same-host path of the TCP transport. Two workers on one host talk
// over a Unix socket instead of TCP, and a host layout the exporter
// allocated in shared memory (transfer.Manager.Shared) is mapped by the
// importer, which then copies its bytes itself: one memcpy, the speed of
// an in-process copy, where a socket costs a copy into the kernel and one
// out. Each copy is still a request the exporter answers: it checks the
// ranges, holds its manager until the importer says it is done, and a
// peer that died or froze fails the operation within the deadline as on
// TCP. Memory it does not share (host memory the engine registered, the
// emulated device's registered memory) is copied with
// process_vm_readv/writev where the kernel allows it (processvm.go); the
// rest (real device memory it cannot export) goes through the socket.

// errCannotMap marks a layout the peer shares that this process cannot
// map (its device memory here, say): it is reached through the socket.
var errCannotMap = errors.New("cannot map the peer's memory here")

// hostID is this host's boot id (zero when unknown): two workers with the
// same one run on one kernel, where shared memory files can be passed.
var hostID = sync.OnceValue(func() [16]byte {
	var id [16]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err == nil && len(raw) == len(id) {
		copy(id[:], raw)
	}
	return id
})

// listenSameHost listens on a fresh abstract Unix socket for peers on this
// host; nil when the host id is unknown or the socket cannot be made.
func listenSameHost(worker uint64) ([16]byte, string, net.Listener) {
	host := hostID()
	if host == ([16]byte{}) {
		return host, "", nil
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	name := fmt.Sprintf("@kvbm-%x-%d-%x", worker, os.Getpid(), r)
	ln, err := net.Listen("unix", name)
	if err != nil {
		return host, "", nil
	}
	return host, name, ln
}

// admitPeer decides whether a connection is served (a variable for tests).
var admitPeer = samePeerUser

// samePeerUser admits a same-host connection only from a process of this
// user (or root): an abstract socket has no file permissions, and a peer
// maps our memory through it. TCP connections are not checked here.
func samePeerUser(c net.Conn) bool {
	if _, ok := c.(*net.UnixConn); !ok {
		return true
	}
	cred := peerCred(c)
	return cred != nil && (cred.Uid == uint32(os.Getuid()) || cred.Uid == 0)
}

// peerCred is the process at the other end of a Unix socket (nil when
// unknown): the server's process as it listened, for a client.
func peerCred(c net.Conn) *unix.Ucred {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return nil
	}
	return cred
}

// answerMap hands a same-host peer the shared memory files of a layout.
func (t *Transport) answerMap(c net.Conn, q request) error {
	uc, ok := c.(*net.UnixConn)
	var regions []transfer.SharedRegion
	err := fmt.Errorf("%w: shared memory is mapped by peers on this host only, over the Unix socket", transfer.ErrUnsupported)
	if ok {
		regions, err = t.m.Shared(q.handle)
	}
	defer transfer.CloseRegions(regions)
	if err == nil && len(regions) > maxRegions {
		err = fmt.Errorf("%w: layout %v has %d shared regions, more than %d", transfer.ErrUnsupported, q.handle, len(regions), maxRegions)
	}
	if err != nil {
		_, werr := c.Write(appendStatus(nil, statusOf(err), err.Error()))
		return werr
	}
	var fds []int
	for _, r := range regions {
		if r.File != nil {
			fds = append(fds, int(r.File.Fd()))
		}
	}
	payload := appendRegions(nil, regions)
	reply := binary.LittleEndian.AppendUint16(appendStatus(nil, statusOK, ""), uint16(len(payload)))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	reply = append(reply, payload...)
	n, _, err := uc.WriteMsgUnix(reply, oob, nil)
	if err == nil && n < len(reply) {
		_, err = c.Write(reply[n:]) // the files went with the first bytes
	}
	return err
}

// lend answers a lend request: the ranges are checked and the manager held
// while the peer copies, until its done arrives (within the connection's
// deadline).
func (t *Transport) lend(c net.Conn, r io.Reader, q request, started *bool) error {
	if _, ok := c.(*net.UnixConn); !ok {
		return fmt.Errorf("%w: memory is lent to peers on this host only, over the Unix socket", transfer.ErrUnsupported)
	}
	return t.m.Lend(q.handle, q.ops, func() error {
		*started = true
		if _, err := c.Write(appendStatus(nil, statusOK, "")); err != nil {
			return err
		}
		var done [1]byte
		if _, err := io.ReadFull(r, done[:]); err != nil {
			return err
		}
		if done[0] != lendDone {
			return fmt.Errorf("%w: lend ended with %d, want %d", remote.ErrBadEndpoint, done[0], lendDone)
		}
		return nil
	})
}

// sharedMaps are a peer's layouts mapped here, by handle. Copies hold the
// read lock, so that unmapping waits for them.
type sharedMaps struct {
	mu     sync.RWMutex
	maps   map[transfer.LayoutHandle][]sharedMap
	closed bool // the peer closed: nothing is mapped any more
}

// sharedMap is one region of the peer's memory, at addr there, mapped
// here: host memory (m), or a device allocation opened at dev (closed by
// closeDev); or host memory of process pid, not mapped but copied with
// process_vm_readv/writev (processvm.go).
type sharedMap struct {
	addr, size uint64
	m          *storage.Mapping
	dev        uint64
	closeDev   func() error
	pid        int
}

func (s *sharedMaps) has(h transfer.LayoutHandle) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.maps[h] != nil
}

func (s *sharedMaps) set(h transfer.LayoutHandle, maps []sharedMap) {
	s.mu.Lock()
	if s.closed { // mapped while the peer closed: undo at once
		s.mu.Unlock()
		unmap(maps)
		return
	}
	old := s.maps[h]
	if s.maps == nil {
		s.maps = map[transfer.LayoutHandle][]sharedMap{}
	}
	if maps == nil {
		delete(s.maps, h)
	} else {
		s.maps[h] = maps
	}
	s.mu.Unlock()
	unmap(old)
}

func (s *sharedMaps) closeAll() {
	s.mu.Lock()
	all := s.maps
	s.maps, s.closed = nil, true
	s.mu.Unlock()
	for _, maps := range all {
		unmap(maps)
	}
}

func unmap(maps []sharedMap) {
	for _, m := range maps {
		if m.m != nil {
			m.m.Close()
		}
		if m.closeDev != nil {
			m.closeDev()
		}
	}
}

// target is where an op's bytes are in a mapped layout: host memory, an
// address of device memory opened here, or (proc) the op's own address in
// the peer's process.
type target struct {
	host []byte
	dev  uint64
	proc bool
}

// views resolves ops in the mapped layout h; the caller holds s.mu for
// reading while it uses them. Every range is checked against the mapping;
// a failed check is a refusal before anything was sent (the connection
// stays in step), as the server's would be.
func (s *sharedMaps) views(h transfer.LayoutHandle, ops []transfer.RemoteOp) ([]target, error) {
	maps := s.maps[h]
	if maps == nil {
		return nil, &serverError{statusNotFound, fmt.Sprintf("layout %v left the peer; import its metadata again", h)}
	}
	views := make([]target, len(ops))
	for i, o := range ops {
		found := false
		for _, m := range maps {
			if o.Remote >= m.addr && o.Size <= m.size && o.Remote-m.addr <= m.size-o.Size {
				off := o.Remote - m.addr
				switch {
				case m.pid != 0:
					views[i].proc = true
				case m.m != nil:
					views[i].host = m.m.Bytes()[off : off+o.Size]
				default:
					views[i].dev = m.dev + off
				}
				found = true
				break
			}
		}
		if !found {
			return nil, &serverError{statusOutOfRange, fmt.Sprintf("bytes [%#x, +%d) are not inside one region of layout %v's shared memory", o.Remote, o.Size, h)}
		}
	}
	return views, nil
}

// mapLayout asks the peer for layout d's shared memory and maps it; host
// memory the peer does not share is copied with process_vm_readv/writev
// where this process may, and the rest is left to the socket.
func (p *tcpPeer) mapLayout(d transfer.Descriptor) error {
	h := d.Handle
	deadline := transfer.DefaultRemoteDeadline
	if p.t.m != nil {
		deadline = p.t.m.RemoteDeadline()
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	c.c.SetDeadline(dl)
	maps, err := p.fetchMaps(c, h)
	if errors.Is(err, errCannotMap) {
		p.put(c) // the reply was read whole: through the socket instead
		p.shared.set(h, nil)
		return nil
	}
	if err != nil {
		var se *serverError
		if errors.As(err, &se) {
			pid := c.pid
			p.put(c)
			if errors.Is(err, transfer.ErrUnsupported) {
				p.shared.set(h, processMaps(pid, d))
				return nil // not shared: copied process to process, or through the socket
			}
			return fmt.Errorf("peer %x: %w", p.worker, err)
		}
		return p.fail(c, ctx, err)
	}
	p.put(c)
	p.shared.set(h, maps)
	return nil
}

// fetchMaps sends a map request and maps the files of its reply.
func (p *tcpPeer) fetchMaps(c *tcpConn, h transfer.LayoutHandle) ([]sharedMap, error) {
	uc, ok := c.c.(*net.UnixConn)
	if !ok || c.r.Buffered() != 0 {
		return nil, fmt.Errorf("%w: a map request needs an idle Unix socket", transfer.ErrInvalidArgument)
	}
	if _, err := uc.Write(appendRequest(nil, opMap, h, nil)); err != nil {
		return nil, err
	}
	// The files come with the reply's first bytes, so the reply is read
	// here, not through the connection's buffered reader.
	buf := make([]byte, 3+maxMessage+2+maxRegionsBytes)
	oob := make([]byte, unix.CmsgSpace(4*maxRegions))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("%w: map reply's control message: %w", remote.ErrBadEndpoint, err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), "kvbm-peer-memfd"))
			}
		}
	}
	need := func(k int) error { // the first k bytes of the reply are in buf
		if n >= k {
			return nil
		}
		_, err := io.ReadFull(uc, buf[n:k])
		n = k
		return err
	}
	if err := need(3); err != nil {
		return nil, err
	}
	msgLen := 3 + int(binary.LittleEndian.Uint16(buf[1:]))
	if msgLen > 3+maxMessage {
		return nil, fmt.Errorf("%w: map reply message of %d bytes", remote.ErrBadEndpoint, msgLen-3)
	}
	if buf[0] != statusOK {
		if err := need(msgLen); err != nil {
			return nil, err
		}
		return nil, readStatus(bytes.NewReader(buf[:msgLen]))
	}
	if err := need(msgLen + 2); err != nil {
		return nil, err
	}
	end := msgLen + 2 + int(binary.LittleEndian.Uint16(buf[msgLen:]))
	if end > len(buf) {
		return nil, fmt.Errorf("%w: map reply of %d bytes", remote.ErrBadEndpoint, end)
	}
	if err := need(end); err != nil {
		return nil, err
	}
	if n > end {
		return nil, fmt.Errorf("%w: %d bytes after the map reply", remote.ErrBadEndpoint, n-end)
	}
	ranges, err := parseRegions(buf[msgLen+2 : end])
	if err != nil {
		return nil, err
	}
	nfiles := 0
	for _, r := range ranges {
		if r.ipc == nil {
			nfiles++
		}
	}
	if len(files) != nfiles {
		return nil, fmt.Errorf("%w: map reply of %d file regions came with %d files", remote.ErrBadEndpoint, nfiles, len(files))
	}
	maps := make([]sharedMap, 0, len(ranges))
	next := 0 // the next file; all of them are closed on return (a mapping outlives its file)
	for _, r := range ranges {
		if r.ipc != nil {
			if p.t.m == nil {
				unmap(maps)
				return nil, fmt.Errorf("%w: no device here to open the peer's device memory", errCannotMap)
			}
			dev, opened, closeDev, err := p.t.m.OpenPeerDevice(*r.ipc)
			if err != nil {
				unmap(maps)
				return nil, fmt.Errorf("%w: peer %x, layout %v: %w", errCannotMap, p.worker, h, err)
			}
			if r.size > opened { // the copies are checked against r.size: it must be what was opened
				closeDev()
				unmap(maps)
				return nil, fmt.Errorf("%w: peer %x says layout %v's allocation is %d bytes; %d were opened",
					remote.ErrBadEndpoint, p.worker, h, r.size, opened)
			}
			maps = append(maps, sharedMap{addr: r.addr, size: r.size, dev: dev, closeDev: closeDev})
			continue
		}
		m, err := storage.MapShared(files[next], r.size)
		next++
		if err != nil {
			unmap(maps)
			return nil, fmt.Errorf("peer %x, layout %v: %w", p.worker, h, err)
		}
		maps = append(maps, sharedMap{addr: r.addr, size: r.size, m: m})
	}
	return maps, nil
}

// borrow sends a lend request and, once the peer holds the memory, copies
// the bytes through the mapping and says done. The mapping is held from
// before the request until the copy ends, so that every range is checked
// before anything is asked and the memory cannot be unmapped meanwhile.
func (p *tcpPeer) borrow(c *tcpConn, head []byte, h transfer.LayoutHandle, ops []transfer.RemoteOp, write bool) error {
	p.shared.mu.RLock()
	views, err := p.shared.views(h, ops)
	if err == nil {
		err = p.lent(c, head, ops, views, write)
	}
	p.shared.mu.RUnlock()
	var se *serverError
	switch {
	case errors.As(err, &se) && errors.Is(err, transfer.ErrNotFound):
		p.shared.set(h, nil) // gone there: unmap it here
	case errors.As(err, &se) && errors.Is(err, transfer.ErrUnsupported) && len(views) > 0 && views[0].proc:
		// An older kvbm lends only the memory it shares: the socket from
		// now on (Read and Write retry there).
		p.shared.set(h, nil)
		return errNotLent
	}
	return err
}

// errNotLent is a lend the exporter refused for memory it does not share
// (a kvbm from before it lent that): the operation is retried through the
// socket; the connection is in step.
var errNotLent = &serverError{statusUnsupported, "the peer does not lend memory it does not share"}

func (p *tcpPeer) lent(c *tcpConn, head []byte, ops []transfer.RemoteOp, views []target, write bool) error {
	if _, err := c.c.Write(head); err != nil {
		return err
	}
	if err := readStatus(c.r); err != nil {
		return err
	}
	var devCopies []transfer.DeviceCopy
	var procOps []transfer.RemoteOp
	for i, o := range ops {
		if !c.deadline.IsZero() && time.Now().After(c.deadline) {
			// The exporter stopped lending (this process was frozen, say):
			// copy nothing more into memory it may have reused.
			return fmt.Errorf("%w: the lend's deadline passed mid-copy", os.ErrDeadlineExceeded)
		}
		switch {
		case views[i].proc:
			procOps = append(procOps, o)
		case views[i].host == nil:
			devCopies = append(devCopies, transfer.DeviceCopy{Device: views[i].dev, Host: o.Local, Size: o.Size})
		case write:
			memcopy.Copy(views[i].host, storage.HostBytes(o.Local, o.Size))
		default:
			memcopy.Copy(storage.HostBytes(o.Local, o.Size), views[i].host)
		}
	}
	var copyErr error
	if len(procOps) > 0 {
		if err := vmCopy(c.pid, write, procOps, c.deadline); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return err // the exporter stops lending: the connection is out of step
			}
			copyErr = fmt.Errorf("copy of peer %x's host memory: %w", p.worker, err)
		}
	}
	if len(devCopies) > 0 && copyErr == nil {
		if err := p.t.m.CopyPeerDevice(write, devCopies); err != nil {
			copyErr = fmt.Errorf("copy of peer %x's device memory here: %w", p.worker, err)
		}
	}
	if _, err := c.c.Write([]byte{lendDone}); err != nil {
		return err // the connection failed: that comes first
	}
	if copyErr != nil {
		return &localError{copyErr}
	}
	return nil
}

// localError is an operation that failed in this process after its
// exchange with the peer ended in step: the peer is not at fault and the
// connection is kept.
type localError struct{ err error }

func (e *localError) Error() string { return e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// SameHost reports whether p reaches its worker over the same-host socket
// (and maps the host layouts that worker shares).
func SameHost(p remote.Peer) bool {
	tp, ok := p.(*tcpPeer)
	return ok && tp.network == "unix"
}

// Mapped reports whether p reaches layout h through memory mapped here
// (the peer's shared host memory, or its device memory opened with CUDA
// IPC), or copies its host memory process to process, rather than through
// the socket.
func Mapped(p remote.Peer, h transfer.LayoutHandle) bool {
	tp, ok := p.(*tcpPeer)
	return ok && tp.shared.has(h)
}

// SameHostStatus says whether the TCP transport's same-host route is on
// in this process (nil), or why not: what the info command reports.
func SameHostStatus() error {
	if os.Getenv("KVBM_SAME_HOST") == "0" {
		return errors.New("off (KVBM_SAME_HOST=0)")
	}
	if hostID() == ([16]byte{}) {
		return errors.New("off: this host's boot id is unknown, so peers cannot tell they share it")
	}
	return nil
}
