package object

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEncodeDecodeObject(t *testing.T) {
	for _, payload := range [][]byte{{}, {0}, []byte("hello, kv"), bytes.Repeat([]byte{7}, 4096)} {
		obj := encodeObject(payload)
		require.Len(t, obj, headerSize+len(payload))
		require.Equal(t, []byte("KVG4"), obj[:4])
		got, err := decodeObject(obj)
		require.NoError(t, err)
		require.Equal(t, payload, got)
	}
}

func TestDecodeObjectCorrupt(t *testing.T) {
	valid := encodeObject([]byte("0123456789abcdef"))
	tests := []struct {
		name   string
		damage func(b []byte) []byte
		want   string
	}{
		{"empty", func(b []byte) []byte { return nil }, "truncated header: 0 of 24 bytes"},
		{"short header", func(b []byte) []byte { return b[:10] }, "truncated header: 10 of 24 bytes"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, `bad magic "XVG4", want "KVG4"`},
		{"version", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[4:], 9); return b }, "unsupported format version 9, want 1"},
		{"header crc", func(b []byte) []byte { b[9] ^= 1; return b }, "header crc32c mismatch"},
		{"reserved", func(b []byte) []byte { b[6] = 1; return rehash(b) }, "reserved header field is 0x0001"},
		{"truncated payload", func(b []byte) []byte { return b[:len(b)-1] }, "length mismatch: header records 16 payload bytes, object holds 15"},
		{"trailing bytes", func(b []byte) []byte { return append(b, 0) }, "length mismatch: header records 16 payload bytes, object holds 17"},
		{"payload byte", func(b []byte) []byte { b[headerSize+3] ^= 0x80; return b }, "crc32c mismatch: stored 0x"},
		{"huge length", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<63); return rehash(b) }, "header records 9223372036854775808 payload bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.damage(bytes.Clone(valid))
			_, err := decodeObject(b)
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorContains(t, err, tt.want)
			require.False(t, errors.Is(err, ErrNotFound))
		})
	}
}

// rehash recomputes the header checksum after a deliberate header edit, so
// that the check behind it is the one under test.
func rehash(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[20:24], payloadCRC(b[0:20]))
	return b
}

// FuzzDecodeObject: the decoder never panics, and whatever it accepts is
// exactly the encoding of the payload it returns.
func FuzzDecodeObject(f *testing.F) {
	f.Add(encodeObject(nil))
	f.Add(encodeObject([]byte("a")))
	f.Add(encodeObject(bytes.Repeat([]byte{0x5a}, 300)))
	f.Add(encodeObject([]byte("payload"))[:headerSize])
	f.Add([]byte("KVG4"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		payload, err := decodeObject(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not match ErrCorrupt", err)
			}
			return
		}
		if !bytes.Equal(encodeObject(payload), b) {
			t.Fatalf("accepted %x, which is not the encoding of its payload", b)
		}
		if _, err := decodeHeader(b); err != nil {
			t.Fatalf("decodeObject accepted what decodeHeader rejects: %v", err)
		}
	})
}
