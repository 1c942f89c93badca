package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/internal/memcopy"
	"github.com/kvbm/kvbm/kvbmerr"
)

// The importer's side of the same-host path (samehost_server.go): a
// layout the peer shares is mapped here and copied with one memcpy, each
// copy a lend request the peer answers; host memory it does not share is
// copied process to process (processvm.go).

// errCannotMap marks a layout the peer shares that this process cannot
// map (its device memory here, say): it is reached through the socket.
var errCannotMap = errors.New("cannot map the peer's memory here")

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
		// Unmapped since the caller looked (the peer refused it to another
		// copy: gone, or withdrawn): the socket asks the peer, which says why.
		return nil, errNotLent
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
			return nil, &serverError{Status: statusOutOfRange, Msg: fmt.Sprintf("bytes [%#x, +%d) are not inside one region of layout %v's shared memory", o.Remote, o.Size, h)}
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
			if errors.Is(err, kvbmerr.ErrUnsupported) {
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
		return nil, fmt.Errorf("%w: a map request needs an idle Unix socket", kvbmerr.ErrInvalidArgument)
	}
	if _, err := uc.Write(appendRequest(nil, opMap, h, nil)); err != nil {
		return nil, err
	}
	ranges, files, err := readMapReply(uc)
	defer func() { // all of them, also on success: a mapping outlives its file
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	return p.mapRegions(h, ranges, files)
}

// readMapReply reads a map reply whole: its regions, and the files of its
// file regions, which the caller closes (those received, also on error).
// The files come with the reply's first bytes, so the reply is read here,
// not through the connection's buffered reader.
func readMapReply(uc *net.UnixConn) (ranges []sharedRange, files []*os.File, err error) {
	buf := make([]byte, 3+maxMessage+2+maxRegionsBytes)
	oob := make([]byte, unix.CmsgSpace(4*maxRegions))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	if files, err = receivedFiles(oob[:oobn]); err != nil {
		return nil, files, err
	}
	payload, err := readMapPayload(uc, buf, n)
	if err != nil {
		return nil, files, err
	}
	if ranges, err = parseRegions(payload); err != nil {
		return nil, files, err
	}
	nfiles := 0
	for _, r := range ranges {
		if r.ipc == nil {
			nfiles++
		}
	}
	if len(files) != nfiles {
		return nil, files, fmt.Errorf("%w: map reply of %d file regions came with %d files", remote.ErrBadEndpoint, nfiles, len(files))
	}
	return ranges, files, nil
}

// receivedFiles are the files the control message oob passed (SCM_RIGHTS).
func receivedFiles(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: map reply's control message: %w", remote.ErrBadEndpoint, err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "kvbm-peer-memfd"))
		}
	}
	return files, nil
}

// readMapPayload reads the rest of a map reply whose first n bytes are in
// buf, and returns its regions' bytes, or the peer's refusal (a
// *serverError).
func readMapPayload(uc *net.UnixConn, buf []byte, n int) ([]byte, error) {
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
	return buf[msgLen+2 : end], nil
}

// mapRegions maps a map reply's regions: each file region's file, in
// order, and each device region's CUDA IPC handle; on an error nothing
// stays mapped.
func (p *tcpPeer) mapRegions(h transfer.LayoutHandle, ranges []sharedRange, files []*os.File) ([]sharedMap, error) {
	maps := make([]sharedMap, 0, len(ranges))
	next := 0 // the next file
	for _, r := range ranges {
		var m sharedMap
		var err error
		if r.ipc != nil {
			m, err = p.openDevice(h, r)
		} else {
			m = sharedMap{addr: r.addr, size: r.size}
			if m.m, err = storage.MapShared(files[next], r.size); err != nil {
				err = fmt.Errorf("peer %x, layout %v: %w", p.worker, h, err)
			}
			next++
		}
		if err != nil {
			unmap(maps)
			return nil, err
		}
		maps = append(maps, m)
	}
	return maps, nil
}

// openDevice opens a device region of the peer's layout h here.
func (p *tcpPeer) openDevice(h transfer.LayoutHandle, r sharedRange) (sharedMap, error) {
	if p.t.m == nil {
		return sharedMap{}, fmt.Errorf("%w: no device here to open the peer's device memory", errCannotMap)
	}
	dev, opened, closeDev, err := p.t.m.OpenPeerDevice(*r.ipc)
	if err != nil {
		return sharedMap{}, fmt.Errorf("%w: peer %x, layout %v: %w", errCannotMap, p.worker, h, err)
	}
	if r.size > opened { // the copies are checked against r.size: it must be what was opened
		closeDev()
		return sharedMap{}, fmt.Errorf("%w: peer %x says layout %v's allocation is %d bytes; %d were opened",
			remote.ErrBadEndpoint, p.worker, h, r.size, opened)
	}
	return sharedMap{addr: r.addr, size: r.size, dev: dev, closeDev: closeDev}, nil
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
	case errors.As(err, &se) && (errors.Is(err, transfer.ErrNotFound) || errors.Is(err, transfer.ErrWithdrawn)):
		// Gone there (withdrawn: its memory went to another use, which an
		// opened device allocation here would keep from being freed):
		// unmap it here.
		p.shared.set(h, nil)
	case errors.As(err, &se) && errors.Is(err, kvbmerr.ErrUnsupported) && len(views) > 0 && views[0].proc:
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
var errNotLent = &serverError{Status: statusUnsupported, Msg: "the peer does not lend memory it does not share"}

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
