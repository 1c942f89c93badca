package worker

import (
	"encoding/binary"
	"fmt"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/internal/crc32c"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Metadata is what a worker exports so that peers can address its layouts:
// the worker's id, one descriptor per registered tier, and the endpoints
// of the transports that serve them.
type Metadata struct {
	WorkerID  uint64
	Layouts   []LogicalDescriptor
	Endpoints []Endpoint
}

// LogicalDescriptor is a layout descriptor with the tier it serves as.
type LogicalDescriptor struct {
	Tier Tier
	transfer.Descriptor
}

// The binary form, little endian:
//
//	magic "KVBM" | version u16 | count u16 | worker u64
//	count × { tier u8 | storage kind u8 | layout kind u8 | block dim u8 |
//	          device i32 | handle worker u64 | handle layout u16 |
//	          config 7 × u64 | region count u16 | bases region count × u64 }
//	endpoint count u8
//	endpoint count × { name length u8 | name | address length u16 | address }
//	crc32c u32 of everything before it
//
// Version 2 added the endpoints; version 3 made them capabilities (a TCP
// endpoint carries a key, see core/remote/tcp): the metadata is a secret.
// Both sides must speak the same version.
const (
	metadataMagic   = "KVBM"
	metadataVersion = 3
	maxEndpoints    = 16
	headerLen       = 4 + 2 + 2 + 8
	fixedLayoutLen  = 4 + 4 + 8 + 2 + 7*8 + 2
	maxRegions      = 1 << 12
)

// ErrBadMetadata is wrapped by every decoding error.
var ErrBadMetadata = kvbmerr.New(kvbmerr.DataCorruption, "bad layout metadata")

// Encode returns the versioned, checksummed binary form.
func (md Metadata) Encode() ([]byte, error) {
	if len(md.Layouts) > 0xFFFF {
		return nil, fmt.Errorf("encode metadata: %d layouts, at most 65535", len(md.Layouts))
	}
	b := make([]byte, 0, headerLen+len(md.Layouts)*(fixedLayoutLen+8)+4)
	b = append(b, metadataMagic...)
	b = binary.LittleEndian.AppendUint16(b, metadataVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(md.Layouts)))
	b = binary.LittleEndian.AppendUint64(b, md.WorkerID)
	for _, l := range md.Layouts {
		if len(l.Bases) > maxRegions {
			return nil, fmt.Errorf("encode metadata: layout %v has %d regions, at most %d", l.Handle, len(l.Bases), maxRegions)
		}
		b = append(b, byte(l.Tier), byte(l.Kind), byte(l.Shape.Kind), byte(l.Shape.BlockDim))
		b = binary.LittleEndian.AppendUint32(b, uint32(int32(l.Device)))
		b = binary.LittleEndian.AppendUint64(b, l.Handle.Worker)
		b = binary.LittleEndian.AppendUint16(b, l.Handle.Layout)
		c := l.Config
		for _, v := range []int{c.NumBlocks, c.NumLayers, c.OuterDim, c.PageSize, c.InnerDim, c.DtypeWidth, c.Alignment} {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(l.Bases)))
		for _, base := range l.Bases {
			b = binary.LittleEndian.AppendUint64(b, base)
		}
	}
	if len(md.Endpoints) > maxEndpoints {
		return nil, fmt.Errorf("encode metadata: %d endpoints, at most %d", len(md.Endpoints), maxEndpoints)
	}
	b = append(b, byte(len(md.Endpoints)))
	for _, ep := range md.Endpoints {
		if len(ep.Transport) == 0 || len(ep.Transport) > 0xFF || len(ep.Address) > 0xFFFF {
			return nil, fmt.Errorf("encode metadata: endpoint %q: name of 1 to 255 bytes and address of at most 65535 bytes",
				ep.Transport)
		}
		b = append(b, byte(len(ep.Transport)))
		b = append(b, ep.Transport...)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(ep.Address)))
		b = append(b, ep.Address...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32c.Checksum(b)), nil
}

// DecodeMetadata parses and checks the binary form. Truncated, corrupt or
// inconsistent input returns an error wrapping ErrBadMetadata, never panics.
func DecodeMetadata(b []byte) (Metadata, error) {
	body, err := checkMetadataHeader(b)
	if err != nil {
		return Metadata{}, err
	}
	count := int(binary.LittleEndian.Uint16(b[6:]))
	md := Metadata{WorkerID: binary.LittleEndian.Uint64(b[8:]), Layouts: make([]LogicalDescriptor, 0, min(count, 16))}
	r := body[headerLen:]
	for i := range count {
		var l LogicalDescriptor
		if l, r, err = decodeLayout(i, r); err != nil {
			return Metadata{}, err
		}
		md.Layouts = append(md.Layouts, l)
	}
	if md.Endpoints, r, err = decodeEndpoints(r); err != nil {
		return Metadata{}, err
	}
	if len(r) != 0 {
		return Metadata{}, badMetadata("%d bytes after the last endpoint", len(r))
	}
	return md, nil
}

// badMetadata is a decoding error.
func badMetadata(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadMetadata, fmt.Sprintf(format, args...))
}

// checkMetadataHeader checks the magic, the version and the checksum, and
// returns the bytes the checksum covers.
func checkMetadataHeader(b []byte) (body []byte, err error) {
	if len(b) < headerLen+4 {
		return nil, badMetadata("%d bytes is shorter than the %d-byte header and checksum", len(b), headerLen+4)
	}
	if string(b[:4]) != metadataMagic {
		return nil, badMetadata("magic %q, want %q", b[:4], metadataMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != metadataVersion {
		return nil, badMetadata("version %d, this library reads version %d (both instances must run kvbm with the same metadata version)",
			v, metadataVersion)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32c.Checksum(body); got != sum {
		return nil, badMetadata("checksum %08x, computed %08x", sum, got)
	}
	return body, nil
}

// decodeLayout decodes and checks layout i at the start of r, returning
// it and what follows it.
func decodeLayout(i int, r []byte) (l LogicalDescriptor, rest []byte, err error) {
	if len(r) < fixedLayoutLen {
		return l, nil, badMetadata("layout %d: truncated (%d bytes left, need %d)", i, len(r), fixedLayoutLen)
	}
	l.Tier = Tier(r[0])
	l.Kind = storage.Kind(r[1])
	l.Shape = transfer.Shape{Kind: layout.Kind(r[2]), BlockDim: layout.BlockDim(r[3])}
	l.Device = int(int32(binary.LittleEndian.Uint32(r[4:])))
	l.Handle = transfer.LayoutHandle{Worker: binary.LittleEndian.Uint64(r[8:]), Layout: binary.LittleEndian.Uint16(r[16:])}
	var v [7]int
	for j := range v {
		x := binary.LittleEndian.Uint64(r[18+8*j:])
		if x > 1<<40 {
			return l, nil, badMetadata("layout %d: config field %d is %d, out of range", i, j, x)
		}
		v[j] = int(x)
	}
	l.Config = layout.Config{NumBlocks: v[0], NumLayers: v[1], OuterDim: v[2], PageSize: v[3], InnerDim: v[4], DtypeWidth: v[5], Alignment: v[6]}
	n := int(binary.LittleEndian.Uint16(r[fixedLayoutLen-2:]))
	r = r[fixedLayoutLen:]
	if n > maxRegions || len(r) < 8*n {
		return l, nil, badMetadata("layout %d: %d region bases do not fit in the %d bytes left", i, n, len(r))
	}
	l.Bases = make([]uint64, n)
	for j := range l.Bases {
		l.Bases[j] = binary.LittleEndian.Uint64(r[8*j:])
	}
	r = r[8*n:]
	if !l.Tier.valid() {
		return l, nil, badMetadata("layout %d: tier %d is not G1, G2 or G3", i, l.Tier)
	}
	if l.Kind < storage.System || l.Kind > storage.Disk {
		return l, nil, badMetadata("layout %d: storage kind %d is unknown", i, l.Kind)
	}
	if _, err := layout.New(l.Config, l.Shape.Kind, l.Shape.BlockDim, l.Bases); err != nil {
		return l, nil, badMetadata("layout %d: %v", i, err)
	}
	return l, r, nil
}

// decodeEndpoints decodes the endpoint count and the endpoints at the
// start of r, returning them and what follows them.
func decodeEndpoints(r []byte) (eps []Endpoint, rest []byte, err error) {
	if len(r) < 1 {
		return nil, nil, badMetadata("truncated before the endpoint count")
	}
	ne := int(r[0])
	r = r[1:]
	if ne > maxEndpoints {
		return nil, nil, badMetadata("%d endpoints, at most %d", ne, maxEndpoints)
	}
	for i := range ne {
		if len(r) < 1 || len(r) < 1+int(r[0])+2 {
			return nil, nil, badMetadata("endpoint %d: truncated", i)
		}
		n := int(r[0])
		if n == 0 {
			return nil, nil, badMetadata("endpoint %d: empty transport name", i)
		}
		ep := Endpoint{Transport: string(r[1 : 1+n])}
		r = r[1+n:]
		a := int(binary.LittleEndian.Uint16(r))
		r = r[2:]
		if len(r) < a {
			return nil, nil, badMetadata("endpoint %d (%s): address of %d bytes, %d left", i, ep.Transport, a, len(r))
		}
		ep.Address = append([]byte(nil), r[:a]...)
		r = r[a:]
		eps = append(eps, ep)
	}
	return eps, r, nil
}

// descriptors returns the transfer descriptors, without tiers.
func (md Metadata) descriptors() []transfer.Descriptor {
	out := make([]transfer.Descriptor, len(md.Layouts))
	for i, l := range md.Layouts {
		out[i] = l.Descriptor
	}
	return out
}
