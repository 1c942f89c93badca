package object

import (
	"encoding/binary"
	"fmt"

	"github.com/kvbm/kvbm/internal/crc32c"
	"github.com/kvbm/kvbm/kvbmerr"
)

// An object is a fixed header followed by the payload (one block's bytes):
//
//	offset size
//	     0    4  magic "KVG4"
//	     4    2  format version (2), little endian
//	     6    2  key length in bytes, 1 to MaxKeyLen, little endian
//	     8    8  payload length in bytes
//	    16    4  CRC32C (Castagnoli) of the payload
//	    20   64  the key's bytes, then zeros up to MaxKeyLen
//	    84    4  CRC32C of bytes 0 to 83, so that a flipped length, key or
//	             checksum bit reads as a damaged header, not a damaged payload
//	    88       payload
//
// A header rather than a trailer lets HasBlocks learn the payload size and
// check the magic and the key by reading 88 bytes, and lets Get reject a
// foreign or mismatched object before reading its payload. The key is
// recorded so that an object file replaced by another key's valid object is
// refused rather than served as this key's data.
//
// Version 1 (a 24-byte header without the key) is refused as an unsupported
// version: such an object cannot prove which key it holds.
const (
	// HeaderSize is the bytes of an object before its payload (what a
	// plain GET of an object reads beyond the block).
	HeaderSize    = 88
	formatVersion = 2
	objectMagic   = "KVG4"

	keyOffset       = 20
	headerCRCOffset = keyOffset + MaxKeyLen
)

// header is the decoded form of an object's header.
type header struct {
	key    Key    // the key the object was written under
	length uint64 // payload bytes
	crc    uint32 // CRC32C of the payload
}

// corruptError is a verification failure; it matches ErrCorrupt under
// errors.Is while reading as just its message ("crc32c mismatch: …").
type corruptError struct{ msg string }

func (e *corruptError) Error() string        { return e.msg }
func (e *corruptError) Is(target error) bool { return target == ErrCorrupt }
func (e *corruptError) Kind() kvbmerr.Kind   { return kvbmerr.DataCorruption }

func corruptf(format string, args ...any) error {
	return &corruptError{msg: fmt.Sprintf(format, args...)}
}

// payloadCRC returns the CRC32C of a payload.
func payloadCRC(payload []byte) uint32 { return crc32c.Checksum(payload) }

// putHeader writes the header of key's payload into dst[:HeaderSize].
func putHeader(dst []byte, key Key, payload []byte) {
	_ = dst[HeaderSize-1]
	copy(dst[0:4], objectMagic)
	binary.LittleEndian.PutUint16(dst[4:6], formatVersion)
	binary.LittleEndian.PutUint16(dst[6:8], uint16(key.Len()))
	binary.LittleEndian.PutUint64(dst[8:16], uint64(len(payload)))
	binary.LittleEndian.PutUint32(dst[16:20], payloadCRC(payload))
	clear(dst[keyOffset:headerCRCOffset])
	copy(dst[keyOffset:headerCRCOffset], key.b)
	binary.LittleEndian.PutUint32(dst[headerCRCOffset:HeaderSize], crc32c.Checksum(dst[0:headerCRCOffset]))
}

// encodeObject returns the whole object of key's payload.
func encodeObject(key Key, payload []byte) []byte {
	obj := make([]byte, HeaderSize+len(payload))
	putHeader(obj, key, payload)
	copy(obj[HeaderSize:], payload)
	return obj
}

// decodeHeader parses and checks the first HeaderSize bytes of b. It returns
// an error matching ErrCorrupt for any damaged or foreign header and never
// panics, whatever b holds.
func decodeHeader(b []byte) (header, error) {
	// Magic and version first: an object of another version, whose header
	// may be shorter, is named as such rather than as truncated.
	if len(b) >= 6 {
		if string(b[0:4]) != objectMagic {
			return header{}, corruptf("bad magic %q, want %q", b[0:4], objectMagic)
		}
		if v := binary.LittleEndian.Uint16(b[4:6]); v != formatVersion {
			return header{}, corruptf("unsupported format version %d, want %d", v, formatVersion)
		}
	}
	if len(b) < HeaderSize {
		return header{}, corruptf("truncated header: %d of %d bytes", len(b), HeaderSize)
	}
	stored := binary.LittleEndian.Uint32(b[headerCRCOffset:HeaderSize])
	if computed := crc32c.Checksum(b[0:headerCRCOffset]); stored != computed {
		return header{}, corruptf("header crc32c mismatch: stored 0x%08x computed 0x%08x", stored, computed)
	}
	n := int(binary.LittleEndian.Uint16(b[6:8]))
	if err := checkKeyLen(n); err != nil {
		return header{}, corruptf("header key: %v", err)
	}
	for i, c := range b[keyOffset+n : headerCRCOffset] {
		if c != 0 {
			return header{}, corruptf("header key padding byte %d is 0x%02x, want 0", n+i, c)
		}
	}
	return header{
		key:    Key{b: string(b[keyOffset : keyOffset+n])},
		length: binary.LittleEndian.Uint64(b[8:16]),
		crc:    binary.LittleEndian.Uint32(b[16:20]),
	}, nil
}

// checkKey checks that the object was written under want.
func (h header) checkKey(want Key) error {
	if h.key != want {
		return corruptf("holds the object of key %s", h.key)
	}
	return nil
}

// checkHeldLength checks that an object holding held payload bytes (its
// size less the header) is as long as its header records.
func (h header) checkHeldLength(held int64) error {
	if held < 0 || uint64(held) != h.length {
		return corruptf("length mismatch: header records %d payload bytes, object holds %d", h.length, max(held, 0))
	}
	return nil
}

// checkPayload checks the payload's checksum against the header's.
func (h header) checkPayload(payload []byte) error {
	if computed := payloadCRC(payload); computed != h.crc {
		return corruptf("crc32c mismatch: stored 0x%08x computed 0x%08x", h.crc, computed)
	}
	return nil
}

// decodeObject verifies a whole object and returns the key it was written
// under and its payload, a view into b. Errors match ErrCorrupt; it never
// panics.
func decodeObject(b []byte) (Key, []byte, error) {
	h, err := decodeHeader(b)
	if err != nil {
		return Key{}, nil, err
	}
	if err := h.checkHeldLength(int64(len(b) - HeaderSize)); err != nil {
		return Key{}, nil, err
	}
	payload := b[HeaderSize:]
	if err := h.checkPayload(payload); err != nil {
		return Key{}, nil, err
	}
	return h.key, payload, nil
}
