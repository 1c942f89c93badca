package object

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"
)

func mustKey(t testing.TB, b string) Key {
	t.Helper()
	k, err := NewKey([]byte(b))
	require.NoError(t, err)
	return k
}

func TestEncodeDecodeObject(t *testing.T) {
	keys := []Key{mustKey(t, "k"), mustKey(t, "block-hash-0042"), mustKey(t, string(bytes.Repeat([]byte{0xAB}, MaxKeyLen)))}
	for _, key := range keys {
		for _, payload := range [][]byte{{}, {0}, []byte("hello, kv"), bytes.Repeat([]byte{7}, 4096)} {
			obj := encodeObject(key, payload)
			require.Len(t, obj, HeaderSize+len(payload))
			require.Equal(t, []byte("KVG4"), obj[:4])
			gotKey, got, err := decodeObject(obj)
			require.NoError(t, err)
			require.Equal(t, key, gotKey)
			require.Equal(t, payload, got)
		}
	}
}

func TestDecodeObjectCorrupt(t *testing.T) {
	valid := encodeObject(mustKey(t, "key-1"), []byte("0123456789abcdef"))
	tests := []struct {
		name   string
		damage func(b []byte) []byte
		want   string
	}{
		{"empty", func(b []byte) []byte { return nil }, "truncated header: 0 of 88 bytes"},
		{"short header", func(b []byte) []byte { return b[:10] }, "truncated header: 10 of 88 bytes"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, `bad magic "XVG4", want "KVG4"`},
		{"version", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[4:], 9); return b }, "unsupported format version 9, want 2"},
		{"version 1", func(b []byte) []byte { return encodeV1([]byte("0123456789abcdef")) }, "unsupported format version 1, want 2"},
		{"header crc", func(b []byte) []byte { b[9] ^= 1; return b }, "header crc32c mismatch"},
		{"key byte", func(b []byte) []byte { b[keyOffset+2] ^= 1; return b }, "header crc32c mismatch"},
		{"key length 0", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 0); return rehash(b) }, "header key: invalid key length 0"},
		{"key length 65", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 65); return rehash(b) }, "header key: invalid key length 65"},
		{"key padding", func(b []byte) []byte { b[keyOffset+40] = 1; return rehash(b) }, "header key padding byte 40 is 0x01, want 0"},
		{"truncated payload", func(b []byte) []byte { return b[:len(b)-1] }, "length mismatch: header records 16 payload bytes, object holds 15"},
		{"trailing bytes", func(b []byte) []byte { return append(b, 0) }, "length mismatch: header records 16 payload bytes, object holds 17"},
		{"payload byte", func(b []byte) []byte { b[HeaderSize+3] ^= 0x80; return b }, "crc32c mismatch: stored 0x"},
		{"huge length", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<63); return rehash(b) }, "header records 9223372036854775808 payload bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.damage(bytes.Clone(valid))
			_, _, err := decodeObject(b)
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorContains(t, err, tt.want)
			require.False(t, errors.Is(err, ErrNotFound))
		})
	}
}

func TestHeaderKeyMismatch(t *testing.T) {
	h, err := decodeHeader(encodeObject(mustKey(t, "A"), []byte("payload")))
	require.NoError(t, err)
	require.NoError(t, h.checkKey(mustKey(t, "A")))
	err = h.checkKey(mustKey(t, "B"))
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, "holds the object of key 41")
}

// rehash recomputes the header checksum after a deliberate header edit, so
// that the check behind it is the one under test.
func rehash(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[headerCRCOffset:HeaderSize], payloadCRC(b[0:headerCRCOffset]))
	return b
}

// encodeV1 is an object of format version 1 (a 24-byte header without the
// key), as written before the key was recorded.
func encodeV1(payload []byte) []byte {
	b := make([]byte, 24+len(payload))
	copy(b[0:4], objectMagic)
	binary.LittleEndian.PutUint16(b[4:6], 1)
	binary.LittleEndian.PutUint64(b[8:16], uint64(len(payload)))
	binary.LittleEndian.PutUint32(b[16:20], payloadCRC(payload))
	binary.LittleEndian.PutUint32(b[20:24], crc32.Checksum(b[0:20], crc32.MakeTable(crc32.Castagnoli)))
	copy(b[24:], payload)
	return b
}

// FuzzDecodeObject: the decoder never panics, and whatever it accepts is
// exactly the encoding of the key and payload it returns.
func FuzzDecodeObject(f *testing.F) {
	key := Key{b: "fuzz-key"}
	f.Add(encodeObject(key, nil))
	f.Add(encodeObject(Key{b: "a"}, []byte("a")))
	f.Add(encodeObject(Key{b: string(bytes.Repeat([]byte{0xFF}, MaxKeyLen))}, bytes.Repeat([]byte{0x5a}, 300)))
	f.Add(encodeObject(key, []byte("payload"))[:HeaderSize])
	f.Add(encodeV1([]byte("payload")))
	f.Add([]byte("KVG4"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		key, payload, err := decodeObject(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not match ErrCorrupt", err)
			}
			return
		}
		if err := key.valid(); err != nil {
			t.Fatalf("decodeObject accepted an invalid key: %v", err)
		}
		if !bytes.Equal(encodeObject(key, payload), b) {
			t.Fatalf("accepted %x, which is not the encoding of its key and payload", b)
		}
		h, err := decodeHeader(b)
		if err != nil {
			t.Fatalf("decodeObject accepted what decodeHeader rejects: %v", err)
		}
		if err := h.checkKey(key); err != nil {
			t.Fatalf("the header does not hold the key decodeObject returned: %v", err)
		}
	})
}
