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
// capability.Verifier) before the exporter reads anything for it, or
// makes an endpoint for it:
//
//	importer → exporter  open:      kind | conn u64                       (sent with reply)
//	exporter → importer  challenge: kind | conn u64 | at u64 | nonce [32]  (on the reply endpoint)
//	importer → exporter  hello:     kind | conn u64 | at u64             (sent with reply)
//	                                data: address length u32 | the importer's worker address | capability hello
//	exporter → importer  welcome:   kind | conn u64 | ok u8 | session [16]  data: the exporter's proof
//	importer → exporter  read:      kind | session [16] | req u64 | worker u64 | layout u16
//	                                data: ops × (remote u64 | size u64)
//	exporter → importer  data:      kind | session [16] | req u64 | offset u64   data: the bytes at offset of the request's
//	exporter → importer  done:      kind | session [16] | req u64 | total u64 | status u8   data: message
//	importer → exporter  bye:       kind | session [16]
//
// Little endian. The challenge keeps nothing on the exporter: its nonce is
// an HMAC, under a key of the transport's, of the conn, the time it was
// made (at) and the hash of the address the hello then names, so that a
// hello proves the capability for that address and within helloDeadline
// of the challenge. Only a hello that verifies makes the exporter an
// endpoint, to that address, and a session; a refused one is answered on
// the reply endpoint. The exporter answers reads on the session's
// endpoint only (never on one a message came on), so data goes only to
// the importer whose hello verified, tagged with the session, which the
// importer checks. Requests and the exporter's small answers are sent
// eager; data is sent as UCX chooses (rendezvous when large, zero-copy
// where the transport can).
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
	kindChallenge: 1 + 8 + 8 + 32,
	kindHello:     1 + 8 + 8,
	kindWelcome:   1 + 8 + 1 + sessionLen,
	kindRead:      1 + sessionLen + 8 + 8 + 2,
	kindData:      1 + sessionLen + 8 + 8,
	kindDone:      1 + sessionLen + 8 + 8 + 1,
	kindBye:       1 + sessionLen,
}

// Limits of what a message may carry.
const (
	maxAddressLen = 64 << 10
	maxReadOps    = 1 << 20
	maxDoneMsg    = 1 << 10
)

// readOps bounds the ops of the reads an importer asks: a pull of more is
// asked as several reads, one after another (a var for tests).
var readOps = 1 << 16

// header is a decoded message header.
type header struct {
	kind    msgKind
	conn    uint64 // open, challenge, hello, welcome
	at      uint64 // challenge, hello: when the challenge was made (Unix ns)
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
		h.conn, h.at = u64(), u64()
		h.nonce = append([]byte(nil), b...)
	case kindHello:
		h.conn, h.at = u64(), u64()
	case kindBye:
		sess()
	case kindWelcome:
		h.conn = u64()
		h.ok = b[0] == 1
		b = b[1:]
		sess()
	case kindRead:
		sess()
		h.req = u64()
		h.handle.Worker = u64()
		h.handle.Layout = binary.LittleEndian.Uint16(b)
	case kindData:
		sess()
		h.req, h.offset = u64(), u64()
	case kindDone:
		sess()
		h.req, h.total = u64(), u64()
		h.status = b[0]
	}
	return h, nil
}

func appendSession(b []byte, s sessionID) []byte { return append(b, s[:]...) }

func openHeader(conn uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{byte(kindOpen)}, conn)
}

func challengeHeader(conn, at uint64, nonce []byte) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindChallenge)}, conn)
	b = binary.LittleEndian.AppendUint64(b, at)
	return append(b, nonce...)
}

func helloHeader(conn, at uint64) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindHello)}, conn)
	return binary.LittleEndian.AppendUint64(b, at)
}

// helloData is a hello's data: the importer's address, then its
// capability hello.
func helloData(address, hello []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(address)))
	return append(append(b, address...), hello...)
}

// parseHelloData splits a hello's data.
func parseHelloData(b []byte) (address, hello []byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%w: ucx: a hello's data of %d bytes", remote.ErrBadEndpoint, len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || n > maxAddressLen || uint64(n) > uint64(len(b)-4) {
		return nil, nil, fmt.Errorf("%w: ucx: a hello's address of %d bytes in %d", remote.ErrBadEndpoint, n, len(b))
	}
	return b[4 : 4+n], b[4+n:], nil
}

func byeHeader(s sessionID) []byte { return appendSession([]byte{byte(kindBye)}, s) }

func welcomeHeader(conn uint64, ok bool, s sessionID) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{byte(kindWelcome)}, conn)
	if ok {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return appendSession(b, s)
}

func readHeader(s sessionID, req uint64, h transfer.LayoutHandle) []byte {
	b := appendSession([]byte{byte(kindRead)}, s)
	b = binary.LittleEndian.AppendUint64(b, req)
	b = binary.LittleEndian.AppendUint64(b, h.Worker)
	return binary.LittleEndian.AppendUint16(b, h.Layout)
}

func dataHeader(s sessionID, req, offset uint64) []byte {
	b := binary.LittleEndian.AppendUint64(appendSession([]byte{byte(kindData)}, s), req)
	return binary.LittleEndian.AppendUint64(b, offset)
}

func doneHeader(s sessionID, req, total uint64, status byte) []byte {
	b := binary.LittleEndian.AppendUint64(appendSession([]byte{byte(kindDone)}, s), req)
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
