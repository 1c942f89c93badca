package tcp

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
)

// The TCP transport's wire format, little endian. A connection starts with
// the server's challenge, the client's hello and the server's proof
// (package capability: magic "KVBT", version 3), then carries one request
// at a time:
//
//	request:  op u8 | handle worker u64 | handle layout u16 | count u32 |
//	          count × { address u64 | size u64 } | (write) the bytes
//	reply:    status u8 | message length u16 | message | (read, status ok) the bytes
//
// The hello proves the key of the worker the client expects, so that a
// peer restarted under another id (stale metadata) is refused at once.
//
// A peer on the same host connects over a Unix socket instead and may also
// send (samehost_server.go answers them, samehost_peer.go sends them):
//
//	map:      op 3 | handle | count 0
//	  reply:  status | message | (ok) length u16 | regions u16 |
//	          regions × { address u64 | size u64 | kind u8 | (kind 2) CUDA IPC handle [64] },
//	          with one shared memory file per kind-1 region passed alongside (SCM_RIGHTS)
//	lend:     op 4 (the peer reads) or 5 (it writes) | handle | count | ops
//	  reply:  status | message; (ok) the peer copies, then sends done u8 (1)
const (
	reqHeadLen = 1 + 8 + 2 + 4
	opLen      = 16
	// maxOps and maxRequestBytes bound what a server reads for one request.
	maxOps          = 1 << 16
	maxRequestBytes = 1 << 32
	maxMessage      = 1 << 12
)

type wireOp uint8

const (
	opRead      wireOp = 1
	opWrite     wireOp = 2
	opMap       wireOp = 3
	opLendRead  wireOp = 4
	opLendWrite wireOp = 5
)

func (o wireOp) String() string {
	switch o {
	case opRead:
		return "read"
	case opWrite:
		return "write"
	case opMap:
		return "map"
	case opLendRead:
		return "lend to read"
	case opLendWrite:
		return "lend to write"
	}
	return fmt.Sprintf("op %d", uint8(o))
}

// lendDone is what a peer sends when its copy of lent memory is done.
const lendDone byte = 1

// maxRegions bounds the shared memory files of one layout (what one
// SCM_RIGHTS message may carry).
const maxRegions = 250

// maxRegionsBytes bounds a map reply's regions.
const maxRegionsBytes = 2 + maxRegions*(17+len(cuda.IPCHandle{}))

// Reply statuses (remote's, shared with the UCX transport).
const (
	statusOK          = remote.StatusOK
	statusInvalid     = remote.StatusInvalid
	statusOutOfRange  = remote.StatusOutOfRange
	statusNotFound    = remote.StatusNotFound
	statusUnsupported = remote.StatusUnsupported
	statusClosed      = remote.StatusClosed
	statusFailed      = remote.StatusFailed
	statusWithdrawn   = remote.StatusWithdrawn
)

var statusOf = remote.StatusOf

// serverError is an error the server reported (remote.StatusError).
type serverError = remote.StatusError

func appendStatus(b []byte, status byte, msg string) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b = append(b, status)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// readStatus reads a status and its message; a non-ok status is returned
// as a *serverError.
func readStatus(r io.Reader) error {
	var head [3]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return err
	}
	n := int(binary.LittleEndian.Uint16(head[1:]))
	if n > maxMessage {
		return fmt.Errorf("%w: status message of %d bytes", remote.ErrBadEndpoint, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return err
	}
	if head[0] == statusOK {
		return nil
	}
	return &serverError{Status: head[0], Msg: string(msg)}
}

// request is a decoded request header.
type request struct {
	op     wireOp
	handle transfer.LayoutHandle
	ops    []transfer.RemoteOp // Remote and Size only
	bytes  uint64
}

func appendRequest(b []byte, op wireOp, h transfer.LayoutHandle, ops []transfer.RemoteOp) []byte {
	b = append(b, byte(op))
	b = binary.LittleEndian.AppendUint64(b, h.Worker)
	b = binary.LittleEndian.AppendUint16(b, h.Layout)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ops)))
	for _, o := range ops {
		b = binary.LittleEndian.AppendUint64(b, o.Remote)
		b = binary.LittleEndian.AppendUint64(b, o.Size)
	}
	return b
}

// readRequest reads and checks a request header (not its bytes). Malformed
// input returns an error wrapping remote.ErrBadEndpoint and never panics.
func readRequest(r io.Reader, buf []byte) (request, []byte, error) {
	var head [reqHeadLen]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return request{}, buf, err
	}
	q := request{op: wireOp(head[0]), handle: transfer.LayoutHandle{
		Worker: binary.LittleEndian.Uint64(head[1:]), Layout: binary.LittleEndian.Uint16(head[9:])}}
	if q.op < opRead || q.op > opLendWrite {
		return q, buf, fmt.Errorf("%w: request op %d", remote.ErrBadEndpoint, q.op)
	}
	n := binary.LittleEndian.Uint32(head[11:])
	if q.op == opMap {
		if n != 0 {
			return q, buf, fmt.Errorf("%w: map request with %d ops, want 0", remote.ErrBadEndpoint, n)
		}
		return q, buf, nil
	}
	if n == 0 || n > maxOps {
		return q, buf, fmt.Errorf("%w: request of %d ops, want 1 to %d", remote.ErrBadEndpoint, n, maxOps)
	}
	need := int(n) * opLen
	if cap(buf) < need {
		buf = make([]byte, need)
	}
	buf = buf[:need]
	if _, err := io.ReadFull(r, buf); err != nil {
		return q, buf, err
	}
	q.ops = make([]transfer.RemoteOp, n)
	for i := range q.ops {
		o := &q.ops[i]
		o.Remote = binary.LittleEndian.Uint64(buf[i*opLen:])
		o.Size = binary.LittleEndian.Uint64(buf[i*opLen+8:])
		if o.Size == 0 || o.Size > maxRequestBytes || q.bytes+o.Size > maxRequestBytes {
			return q, buf, fmt.Errorf("%w: request op %d of %d bytes makes the request more than %d bytes", remote.ErrBadEndpoint, i, o.Size, uint64(maxRequestBytes))
		}
		q.bytes += o.Size
	}
	return q, buf, nil
}

// Kinds of a map reply's regions.
const (
	regionFile byte = 1 // host memory: a shared memory file comes with the reply
	regionIPC  byte = 2 // device memory: a CUDA IPC handle follows
)

func appendRegions(b []byte, regions []transfer.SharedRegion) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(regions)))
	for _, r := range regions {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Size)
		if r.IPC != nil {
			b = append(append(b, regionIPC), r.IPC[:]...)
		} else {
			b = append(b, regionFile)
		}
	}
	return b
}

// sharedRange is one region of a map reply.
type sharedRange struct {
	addr, size uint64
	ipc        *cuda.IPCHandle // nil for a file
}

// parseRegions decodes the regions of a map reply (after its status),
// which must be the whole of b: from 1 to maxRegions non-empty ranges that
// do not wrap around, each a file or an IPC handle. Malformed input
// returns an error wrapping remote.ErrBadEndpoint and never panics.
func parseRegions(b []byte) ([]sharedRange, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: map reply of %d bytes", remote.ErrBadEndpoint, len(b))
	}
	n := int(binary.LittleEndian.Uint16(b))
	if n == 0 || n > maxRegions {
		return nil, fmt.Errorf("%w: map reply of %d regions (1 to %d)", remote.ErrBadEndpoint, n, maxRegions)
	}
	out := make([]sharedRange, n)
	at := 2
	for i := range out {
		if len(b) < at+17 {
			return nil, fmt.Errorf("%w: map reply truncated at region %d", remote.ErrBadEndpoint, i)
		}
		r := sharedRange{addr: binary.LittleEndian.Uint64(b[at:]), size: binary.LittleEndian.Uint64(b[at+8:])}
		kind := b[at+16]
		at += 17
		switch kind {
		case regionFile:
		case regionIPC:
			if len(b) < at+len(cuda.IPCHandle{}) {
				return nil, fmt.Errorf("%w: map reply truncated in region %d's IPC handle", remote.ErrBadEndpoint, i)
			}
			r.ipc = new(cuda.IPCHandle)
			at += copy(r.ipc[:], b[at:])
		default:
			return nil, fmt.Errorf("%w: map reply region %d of kind %d", remote.ErrBadEndpoint, i, kind)
		}
		if r.size == 0 || r.addr+r.size < r.addr {
			return nil, fmt.Errorf("%w: map reply region %d [%#x, +%d)", remote.ErrBadEndpoint, i, r.addr, r.size)
		}
		out[i] = r
	}
	if at != len(b) {
		return nil, fmt.Errorf("%w: map reply has %d bytes after its regions", remote.ErrBadEndpoint, len(b)-at)
	}
	return out, nil
}
