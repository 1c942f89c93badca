package ucx

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What a pull accepts of data messages, message by message: each byte it
// asked for once, in any order, and no more messages than its bound; the
// spans taken stay in order and merge where they touch.
func TestAcceptedTakesEachByteOnce(t *testing.T) {
	type msg struct {
		off, size uint64
		err       string // "" when taken
	}
	cases := []struct {
		name  string
		total uint64
		limit int
		msgs  []msg
		spans []span
	}{
		{"in order", 30, 3, []msg{{0, 10, ""}, {10, 10, ""}, {20, 10, ""}}, []span{{0, 30}}},
		{"reversed", 30, 3, []msg{{20, 10, ""}, {10, 10, ""}, {0, 10, ""}}, []span{{0, 30}}},
		{"a gap filled", 30, 3, []msg{{0, 10, ""}, {20, 10, ""}, {10, 10, ""}}, []span{{0, 30}}},
		{"gaps left", 50, 5, []msg{{40, 10, ""}, {0, 10, ""}, {20, 5, ""}}, []span{{0, 10}, {20, 25}, {40, 50}}},
		{"again", 30, 5, []msg{{0, 10, ""}, {0, 10, "of the read again"}}, []span{{0, 10}}},
		{"overlapping the left", 30, 5, []msg{{0, 10, ""}, {9, 2, "again"}}, []span{{0, 10}}},
		{"overlapping the right", 30, 5, []msg{{10, 10, ""}, {5, 6, "again"}}, []span{{10, 20}}},
		{"inside", 30, 5, []msg{{0, 30, ""}, {12, 1, "again"}}, []span{{0, 30}}},
		{"covering", 30, 5, []msg{{10, 2, ""}, {0, 30, "again"}}, []span{{10, 12}}},
		{"beyond the read", 30, 5, []msg{{25, 10, "of a read of 30 bytes"}, {31, 1, "of a read of 30 bytes"}, {1 << 63, 1 << 63, "of a read"}}, nil},
		{"empty", 30, 5, []msg{{0, 0, "no bytes"}, {30, 0, "no bytes"}}, nil},
		{"one too many", 30, 2, []msg{{0, 1, ""}, {1, 1, ""}, {2, 1, "more than 2 data messages"}}, []span{{0, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var a accepted
			for i, m := range tc.msgs {
				err := a.take(m.off, m.size, tc.total, tc.limit)
				if m.err == "" {
					require.NoError(t, err, "message %d", i)
				} else {
					require.ErrorContains(t, err, m.err, "message %d", i)
				}
			}
			require.Equal(t, tc.spans, a.spans)
		})
	}
}

// The bound allows a message per op and per 256 KiB of the read, and one
// more: what a kvbm exporter sends at most (a message per op, per 2 MiB
// half of its staging buffer and per 4 MiB chunk) fits four times over.
func TestMaxDataMessages(t *testing.T) {
	require.Equal(t, 2, maxDataMessages(1, 0))
	require.Equal(t, 1+4+1, maxDataMessages(1, 1<<20))
	require.Equal(t, 2048+2048+1, maxDataMessages(2048, 512<<20))
	total := uint64(512 << 20)
	kvbm := 1 + int(total/(2<<20)) + int(total/chunkBytes)
	require.GreaterOrEqual(t, maxDataMessages(1, total), 4*kvbm)
}

// Data messages at any offsets and sizes, as an exporter may send them:
// a pull takes a message only when none of its bytes was taken before and
// all lie in the read, at most limit of them; the spans it keeps are in
// order, apart, and cover exactly the bytes taken.
func FuzzAcceptedTakes(f *testing.F) {
	f.Add(uint8(64), uint8(4), []byte{0, 16, 16, 16, 0, 16, 48, 16, 32, 16, 60, 8})
	f.Add(uint8(10), uint8(100), []byte{5, 5, 0, 5, 4, 2, 0, 0, 9, 1})
	f.Fuzz(func(t *testing.T, total, limit uint8, msgs []byte) {
		var a accepted
		taken := make([]bool, total)
		took := 0
		for i := 0; i+1 < len(msgs); i += 2 {
			off, size := uint64(msgs[i]), uint64(msgs[i+1])
			fits := size > 0 && off+size <= uint64(total) && took < int(limit)
			for b := off; fits && b < off+size; b++ {
				fits = !taken[b]
			}
			err := a.take(off, size, uint64(total), int(limit))
			require.Equal(t, fits, err == nil, "[%d, +%d) of %d: %v", off, size, total, err)
			if err == nil {
				took++
				for b := off; b < off+size; b++ {
					taken[b] = true
				}
			}
		}
		require.Equal(t, took, a.msgs)
		covered := make([]bool, total)
		for i, s := range a.spans {
			require.Less(t, s.from, s.to)
			require.LessOrEqual(t, s.to, uint64(total))
			if i > 0 {
				require.Less(t, a.spans[i-1].to, s.from, "spans touch or overlap")
			}
			for b := s.from; b < s.to; b++ {
				covered[b] = true
			}
		}
		require.Equal(t, taken, covered)
	})
}
