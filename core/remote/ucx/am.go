package ucx

import (
	"encoding/binary"
	"fmt"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
)

// The messages of the default (message) mode, all under one UCX active
// message id, told apart by the header's first byte. An importer proves
// the capability its endpoint carries (the TCP transport's hello,
// capability.Verifier) before the exporter reads anything for it:
//
//	importer → exporter  open:      kind | conn u64                 data: the importer's worker address
//	exporter → importer  challenge: kind | conn u64 | session [16] | nonce [32]
//	importer → exporter  hello:     kind | session [16]             data: capability hello
//	exporter → importer  welcome:   kind | conn u64 | ok u8         data: the exporter's proof
//	importer → exporter  read:      kind | session [16] | req u64 | worker u64 | layout u16
//	                                                                data: ops × (remote u64 | size u64)
//	exporter → importer  data:      kind | req u64 | offset u64     data: the bytes at offset of the request's
//	exporter → importer  done:      kind | req u64 | total u64 | status u8   data: message
//	importer → exporter  bye:       kind | session [16]
//
// Little endian. The exporter answers on an endpoint of its own to the
// address the open named (never on one a message came on), so that data
// goes only to the importer whose hello verified. Requests and the
// exporter's small answers are sent eager; data is sent as UCX chooses
// (rendezvous when large, zero-copy where the transport can).
const amID = 0x4b56

type msgKind byte

const (
	kindOpen msgKind = 1 + iota
	kindChallenge
	kindHello
	kindWelcome
	kindRead
	kindData
	kindDone
	kindBye
)

const sessionLen = 16

type sessionID [sessionLen]byte

// Sizes of the fixed headers.
var headerLen = map[msgKind]int{
	kindOpen:      1 + 8,
	kindChallenge: 1 + 8 + sessionLen + 32,
	kindHello:     1 + sessionLen,
	kindWelcome:   1 + 8 + 1,
	kindRead:      1 + sessionLen + 8 + 8 + 2,
	kindData:      1 + 8 + 8,
	kindDone:      1 + 8 + 8 + 1,
	kindBye:       1 + sessionLen,
}

// Limits of what a message may carry.
const (
	maxAddressLen = 64 << 10
	maxReadOps    = 1 << 20
	maxDoneMsg    = 1 << 10
)

// header is a decoded message header.
type header struct {
	kind    msgKind
	conn    uint64 // open, challenge, welcome
	session sessionID
	nonce   []byte // challenge
	ok      bool   // welcome
	req     uint64 // read, data, done
	handle  transfer.LayoutHandle
	offset  uint64 // data
	total   uint64 // done
	status  byte   // done
}

func parseHeader(b []byte) (header, error) {
	var h header
	if len(b) == 0 {
		return h, fmt.Errorf("%w: ucx: empty message header", remote.ErrBadEndpoint)
	}
	h.kind = msgKind(b[0])
	n, ok := headerLen[h.kind]
	if !ok || len(b) != n {
		return h, fmt.Errorf("%w: ucx: message of kind %d with a %d-byte header", remote.ErrBadEndpoint, b[0], len(b))
	}
	b = b[1:]
	u64 := func() uint64 { v := binary.LittleEndian.Uint64(b); b = b[8:]; return v }
	sess := func() { copy(h.session[:], b); b = b[sessionLen:] }
	switch h.kind {
	case kindOpen:
		h.conn = u64()
	case kindChallenge:
		h.conn = u64()
		sess()
		h.nonce = append([]byte(nil), b...)
	case kindHello, kindBye:
		sess()
	case kindWelcome:
		h.conn = u64()
		h.ok = b[0] == 1
	case kindRead:
		sess()
		h.req = u64()
		h.handle.Worker = u64()
		h.handle.Layout = binary.LittleEndian.Uint16(b)
	case kindData:
		h.req, h.offset = u64(), u64()
	case kindDone:
		h.req, h.total = u64(), u64()
		h.status = b[0]
	}
	return h, nil
}

func appendSession(b []byte, s sessionID) []byte { return append(b, s[:]...) }

func openHeader(conn uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{byte(kindOpen)}, conn)
}

func challengeHeader(conn uint64, s sessionID, nonce []byte) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindChallenge)}, conn)
	return append(appendSession(b, s), nonce...)
}

func helloHeader(s sessionID) []byte { return appendSession([]byte{byte(kindHello)}, s) }

func byeHeader(s sessionID) []byte { return appendSession([]byte{byte(kindBye)}, s) }

func welcomeHeader(conn uint64, ok bool) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindWelcome)}, conn)
	if ok {
		return append(b, 1)
	}
	return append(b, 0)
}

func readHeader(s sessionID, req uint64, h transfer.LayoutHandle) []byte {
	b := appendSession([]byte{byte(kindRead)}, s)
	b = binary.LittleEndian.AppendUint64(b, req)
	b = binary.LittleEndian.AppendUint64(b, h.Worker)
	return binary.LittleEndian.AppendUint16(b, h.Layout)
}

func dataHeader(req, offset uint64) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindData)}, req)
	return binary.LittleEndian.AppendUint64(b, offset)
}

func doneHeader(req, total uint64, status byte) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindDone)}, req)
	b = binary.LittleEndian.AppendUint64(b, total)
	return append(b, status)
}

// appendOps encodes a read's ops (Remote and Size).
func appendOps(b []byte, ops []transfer.RemoteOp) []byte {
	for _, o := range ops {
		b = binary.LittleEndian.AppendUint64(b, o.Remote)
		b = binary.LittleEndian.AppendUint64(b, o.Size)
	}
	return b
}

// parseOps decodes a read's ops, refusing an empty or oversized list, an
// empty op and one whose end overflows.
func parseOps(b []byte) ([]transfer.RemoteOp, uint64, error) {
	if len(b) == 0 || len(b)%16 != 0 || len(b)/16 > maxReadOps {
		return nil, 0, fmt.Errorf("%w: ucx: a read's ops are %d bytes (1 to %d ops of 16 bytes)", remote.ErrBadEndpoint, len(b), maxReadOps)
	}
	ops := make([]transfer.RemoteOp, len(b)/16)
	var total uint64
	for i := range ops {
		o := transfer.RemoteOp{Remote: binary.LittleEndian.Uint64(b[16*i:]), Size: binary.LittleEndian.Uint64(b[16*i+8:])}
		if o.Size == 0 || o.Remote+o.Size < o.Remote || total+o.Size < total {
			return nil, 0, fmt.Errorf("%w: ucx: a read's op %d is [%#x, +%d)", remote.ErrBadEndpoint, i, o.Remote, o.Size)
		}
		total += o.Size
		ops[i] = o
	}
	return ops, total, nil
}
