package tcp

import (
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

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
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
//
// This file is the exporter's side (the socket, who may connect, map and
// lend replies); the importer's (mapping, copies) is samehost_peer.go.

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
	err := fmt.Errorf("%w: shared memory is mapped by peers on this host only, over the Unix socket", kvbmerr.ErrUnsupported)
	if ok {
		regions, err = t.m.Shared(q.handle)
	}
	defer transfer.CloseRegions(regions)
	if err == nil && len(regions) > maxRegions {
		err = fmt.Errorf("%w: layout %v has %d shared regions, more than %d", kvbmerr.ErrUnsupported, q.handle, len(regions), maxRegions)
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
		return fmt.Errorf("%w: memory is lent to peers on this host only, over the Unix socket", kvbmerr.ErrUnsupported)
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
