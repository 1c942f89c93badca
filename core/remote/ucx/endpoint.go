package ucx

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/internal/crc32c"
)

// An endpoint is what a peer needs to reach this transport's worker and
// the layouts it registered:
//
//	magic "KVBMUCX3" | crc32c(body) u32 | body
//	body: address length u32 | ucp worker address
//	      | boot id length u32 | boot id | pid namespace length u32 | pid namespace
//	      | pid u32 | process start time u64 (clock ticks after boot)
//	      | shared-memory segments 3 × u32 (posix, sysv, xpmem; 0: not known)
//	      | mode u8 (0 messages, 1 one-sided) | worker u64
//	      | scope u8 | key [32] | descriptor length u32 | descriptor (a block scope's)
//	      | layouts u32 | layout...
//	layout: worker u64 | layout id u16 | storage kind u8
//	        | reason length u32 | reason (why it is not reachable; then no regions)
//	        | regions u32 | region...
//	region: base u64 | size u64 | rkey length u32 | packed rkey (one-sided only)
//
// Little endian. The checksum makes a damaged endpoint an error here
// rather than bytes handed to UCX, whose unpacking trusts its input. The
// key is the capability (a scope's key, capability.Secret) an importer
// proves in the message mode's hello; the one-sided mode carries none.
const endpointMagic = "KVBMUCX3"

// The modes an endpoint is served in (Config.OneSided).
const (
	modeMessages = 0
	modeOneSided = 1
)

// maxEndpointLen bounds what a decoder accepts.
const maxEndpointLen = 64 << 20

type endpointInfo struct {
	address []byte
	proc    procIdentity
	segs    shmSegs
	mode    byte
	worker  uint64
	scope   capability.Scope
	key     capability.Key
	desc    []byte // ScopeBlocks: the scope's descriptor
	layouts []layoutInfo
}

type layoutInfo struct {
	handle  transfer.LayoutHandle
	kind    storage.Kind
	reason  string // non-empty: the exporter could not register the layout
	regions []regionInfo
}

type regionInfo struct {
	base, size uint64
	rkey       []byte
}

func (e *endpointInfo) encode() []byte {
	body := binary.LittleEndian.AppendUint32(nil, uint32(len(e.address)))
	body = append(body, e.address...)
	body = binary.LittleEndian.AppendUint32(body, uint32(len(e.proc.bootID)))
	body = append(body, e.proc.bootID...)
	body = binary.LittleEndian.AppendUint32(body, uint32(len(e.proc.pidNS)))
	body = append(body, e.proc.pidNS...)
	body = binary.LittleEndian.AppendUint32(body, e.proc.pid)
	body = binary.LittleEndian.AppendUint64(body, e.proc.start)
	for _, n := range e.segs {
		body = binary.LittleEndian.AppendUint32(body, n)
	}
	body = append(body, e.mode)
	body = binary.LittleEndian.AppendUint64(body, e.worker)
	body = append(body, byte(e.scope))
	body = e.key.AppendTo(body)
	body = binary.LittleEndian.AppendUint32(body, uint32(len(e.desc)))
	body = append(body, e.desc...)
	body = binary.LittleEndian.AppendUint32(body, uint32(len(e.layouts)))
	for _, l := range e.layouts {
		body = binary.LittleEndian.AppendUint64(body, l.handle.Worker)
		body = binary.LittleEndian.AppendUint16(body, l.handle.Layout)
		body = append(body, byte(l.kind))
		body = binary.LittleEndian.AppendUint32(body, uint32(len(l.reason)))
		body = append(body, l.reason...)
		body = binary.LittleEndian.AppendUint32(body, uint32(len(l.regions)))
		for _, r := range l.regions {
			body = binary.LittleEndian.AppendUint64(body, r.base)
			body = binary.LittleEndian.AppendUint64(body, r.size)
			body = binary.LittleEndian.AppendUint32(body, uint32(len(r.rkey)))
			body = append(body, r.rkey...)
		}
	}
	out := append([]byte(endpointMagic), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(out[len(endpointMagic):], crc32c.Checksum(body))
	return append(out, body...)
}

// decodeEndpoint parses an endpoint; every error wraps remote.ErrBadEndpoint.
func decodeEndpoint(b []byte) (*endpointInfo, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: ucx: %s", remote.ErrBadEndpoint, fmt.Sprintf(format, args...))
	}
	hdr := len(endpointMagic) + 4
	switch {
	case len(b) > maxEndpointLen:
		return nil, bad("endpoint is %d bytes, more than the %d accepted", len(b), maxEndpointLen)
	case len(b) >= hdr && string(b[:len(endpointMagic)-1]) == endpointMagic[:len(endpointMagic)-1] && string(b[:len(endpointMagic)]) != endpointMagic:
		return nil, bad("an endpoint of another kvbm version (%q; this one reads %q): run the same kvbm on both sides", b[:len(endpointMagic)], endpointMagic)
	case len(b) < hdr || string(b[:len(endpointMagic)]) != endpointMagic:
		return nil, bad("not a UCX transport endpoint (%d bytes, no %q header)", len(b), endpointMagic)
	}
	body := b[hdr:]
	if want, got := binary.LittleEndian.Uint32(b[len(endpointMagic):]), crc32c.Checksum(body); want != got {
		return nil, bad("endpoint checksum %#08x does not match its %d bytes (%#08x): truncated or damaged", want, len(body), got)
	}
	d := decoder{b: body}
	e := &endpointInfo{address: d.bytes("worker address")}
	if len(e.address) == 0 && d.err == nil {
		d.fail("empty worker address")
	}
	e.proc.bootID = string(d.bytes("boot id"))
	e.proc.pidNS = string(d.bytes("pid namespace"))
	e.proc.pid = d.u32()
	e.proc.start = d.u64()
	for i := range e.segs {
		e.segs[i] = d.u32()
	}
	d.capability(e)
	n := d.count("layouts", 8+2+1+4+4)
	for i := 0; i < n && d.err == nil; i++ {
		var l layoutInfo
		l.handle.Worker = d.u64()
		l.handle.Layout = d.u16()
		l.kind = storage.Kind(d.u8())
		l.reason = string(d.bytes("reason"))
		nr := d.count("regions", 8+8+4)
		for j := 0; j < nr && d.err == nil; j++ {
			r := regionInfo{base: d.u64(), size: d.u64(), rkey: d.bytes("rkey")}
			if len(r.rkey) == 0 {
				r.rkey = nil
			}
			if d.err == nil && (r.size == 0 || r.base+r.size < r.base) {
				d.fail("layout %v region %d: base %#x size %d", l.handle, j, r.base, r.size)
			}
			switch {
			case d.err != nil:
			case e.mode == modeMessages && len(r.rkey) > 0:
				d.fail("layout %v region %d: an rkey in the message mode", l.handle, j)
			case e.mode == modeOneSided:
				if err := checkRkey(r.rkey); err != nil {
					d.fail("layout %v region %d: %v", l.handle, j, err)
				}
			}
			l.regions = append(l.regions, r)
		}
		if d.err == nil && l.reason == "" && len(l.regions) == 0 {
			d.fail("layout %v has no regions", l.handle)
		}
		e.layouts = append(e.layouts, l)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes left over", len(d.b))
	}
	if d.err != nil {
		return nil, bad("%v", d.err)
	}
	return e, nil
}

// capability decodes an endpoint's mode, worker and capability.
func (d *decoder) capability(e *endpointInfo) {
	e.mode = d.u8()
	e.worker = d.u64()
	e.scope = capability.Scope(d.u8())
	var key [capability.KeyLen]byte
	copy(key[:], d.take(capability.KeyLen, "key"))
	e.key = capability.KeyFromRaw32(key)
	if e.desc = d.bytes("scope descriptor"); len(e.desc) == 0 {
		e.desc = nil
	}
	switch {
	case d.err != nil:
	case e.mode > modeOneSided:
		d.fail("mode %d", e.mode)
	case !e.scope.Valid():
		d.fail("scope %d", e.scope)
	case (e.scope == capability.ScopeBlocks) != (len(e.desc) > 0):
		d.fail("scope %d with a %d-byte descriptor", e.scope, len(e.desc))
	case len(e.desc) > 0:
		if _, err := capability.ParseBlockScope(e.desc); err != nil {
			d.fail("%v", err)
		}
	}
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail("truncated: %s needs %d bytes, %d left", what, n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) u8() uint8 {
	if b := d.take(1, "u8"); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2, "u16"); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4, "u32"); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8, "u64"); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) bytes(what string) []byte {
	n := d.u32()
	return d.take(int(n), what)
}

// count reads an element count and checks that the bytes left can hold
// that many elements of at least min bytes, so that a forged count cannot
// make the decoder allocate.
func (d *decoder) count(what string, min int) int {
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(min) > uint64(len(d.b)) {
		d.fail("%d %s cannot fit in the %d bytes left", n, what, len(d.b))
		return 0
	}
	return int(n)
}

// checkRkey checks the frame of a packed rkey, which UCX unpacks without
// being told its length, by the rules of the loaded UCX (rkeyFrame120).
func checkRkey(rkey []byte) error { return checkRkeyFrame(rkey, rkeyFrame120) }

// rkeyFrame120 is set when the loaded UCX is 1.20 or newer (lib.go).
var rkeyFrame120 bool

// rkeyPadding follows every key handed to UCX (peer.go): a system device
// byte "unknown" for a key that ends after its domains (packed by a UCX
// older than 1.20, which 1.20 reads one more byte of), then zeros.
var rkeyPadding = append([]byte{sysDevUnknown}, make([]byte, 255)...)

// UCX's system device byte: unknown, and the flag bit a known one may carry.
const (
	sysDevUnknown   = 0xFF
	sysDevFlushBit  = 0x80
	rkeyDistanceLen = 3 // system device, latency, bandwidth
)

// UCX's memory types (ucs_memory_type_t) of the memory kvbm registers.
const (
	memTypeHost = 0
	memTypeCUDA = 1
)

// checkRkeyFrame checks an rkey's frame (ucp_rkey_pack_memh and the rkey
// unpack of src/ucp/core/ucp_rkey.c): the memory domain map (u64), the
// memory type (u8), then for each domain in the map its key's size (u8)
// and bytes. Up to UCX 1.19 what follows (system device, distances) is
// optional, and an empty map reaches no memory domain. From 1.20 an empty
// map is the key of memory reached through UCX's software emulation (its
// transports register nothing: tcp, shared memory); a map that is not
// empty is followed by the system device byte, and when that device is
// known by distances of 3 bytes up to an 0xFF terminator, which UCX reads
// until it finds one: each must be inside the key. A key without the
// device byte (an older UCX packed it) is read with rkeyPadding's.
func checkRkeyFrame(rkey []byte, frame120 bool) error {
	if len(rkey) < 9 {
		return fmt.Errorf("rkey of %d bytes is shorter than its 9-byte header", len(rkey))
	}
	if t := rkey[8]; t > memTypeCUDA {
		// UCX indexes tables by it unchecked; kvbm registers host and
		// CUDA memory only.
		return fmt.Errorf("rkey of memory type %d: kvbm exports host (%d) and CUDA (%d) memory only", t, memTypeHost, memTypeCUDA)
	}
	mdMap := binary.LittleEndian.Uint64(rkey)
	if mdMap == 0 {
		if frame120 {
			return nil
		}
		return fmt.Errorf("rkey names no memory domain")
	}
	p := 9
	for i := 0; i < bits.OnesCount64(mdMap); i++ {
		if p >= len(rkey) || p+1+int(rkey[p]) > len(rkey) {
			return fmt.Errorf("rkey truncated: %d bytes, memory domain %d of %d does not fit", len(rkey), i+1, bits.OnesCount64(mdMap))
		}
		p += 1 + int(rkey[p])
	}
	if !frame120 || p >= len(rkey) { // none: the padding's first byte stands in (unknown)
		return nil
	}
	if rkey[p] == sysDevUnknown {
		return nil
	}
	for p++; ; p += rkeyDistanceLen {
		if p >= len(rkey) {
			return fmt.Errorf("rkey of %d bytes: its distances have no terminator", len(rkey))
		}
		if rkey[p] == sysDevUnknown {
			return nil
		}
		if p+rkeyDistanceLen > len(rkey) {
			return fmt.Errorf("rkey of %d bytes: a distance at byte %d is cut", len(rkey), p)
		}
	}
}
