package object

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const testBlockSize = 4096

// guardByte fills destination blocks before a get, so a block a failed get
// touched, or one no get should reach, shows up.
const guardByte = 0xEE

func newTestStore(t *testing.T, cfg FSConfig) *FSStore {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := NewFSStore(cfg)
	require.NoError(t, err)
	return s
}

// testKeys returns n distinct keys of lengths cycling through 1 to 64 bytes.
func testKeys(t *testing.T, n int, salt string) []Key {
	t.Helper()
	require.LessOrEqual(t, n, 256, "first byte keeps keys distinct")
	keys := make([]Key, n)
	for i := range keys {
		h := sha256.Sum256(fmt.Appendf(nil, "%s/%d", salt, i))
		b := append([]byte{byte(i)}, h[:]...)
		b = append(b, h[:]...)
		k, err := NewKey(b[:1+i%MaxKeyLen])
		require.NoError(t, err)
		keys[i] = k
	}
	return keys
}

// randomBlocks returns n blocks of random bytes.
func randomBlocks(t *testing.T, n, blockSize int, seed uint64) *MemoryBlocks {
	t.Helper()
	m, err := NewMemoryBlocks(n, blockSize)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range m.Bytes() {
		m.Bytes()[i] = byte(r.Uint32())
	}
	return m
}

// guardedBlocks returns n blocks filled with guardByte.
func guardedBlocks(t *testing.T, n, blockSize int) *MemoryBlocks {
	t.Helper()
	m, err := NewMemoryBlocks(n, blockSize)
	require.NoError(t, err)
	for i := range m.Bytes() {
		m.Bytes()[i] = guardByte
	}
	return m
}

func seq(from, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = from + i
	}
	return ids
}

func requireAllOK(t *testing.T, keys []Key, results []Result) {
	t.Helper()
	require.Len(t, results, len(keys))
	for i, r := range results {
		require.Equal(t, keys[i], r.Key, "result %d out of order", i)
		require.NoError(t, r.Err, "block %d", i)
	}
}

// requireSameBlock compares two blocks byte for byte, naming the first
// difference rather than printing megabytes.
func requireSameBlock(t *testing.T, want, got []byte, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	if !bytes.Equal(want, got) {
		i := 0
		for want[i] == got[i] {
			i++
		}
		require.Failf(t, "block differs", "%s: first difference at byte %d: want %#02x got %#02x",
			fmt.Sprintf(msg, args...), i, want[i], got[i])
	}
}

func requireGuarded(t *testing.T, b []byte, msg string, args ...any) {
	t.Helper()
	requireSameBlock(t, bytes.Repeat([]byte{guardByte}, len(b)), b, msg, args...)
}

// tempFiles lists the temporary files left in dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var tmp []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			tmp = append(tmp, e.Name())
		}
	}
	return tmp
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hasRank bool
		rank    int
	}{{"no rank", false, 0}, {"rank 3", true, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			s := newTestStore(t, FSConfig{Dir: root, HasRank: tc.hasRank, Rank: tc.rank})
			const n = 200
			keys := testKeys(t, n, tc.name)
			src := randomBlocks(t, n, testBlockSize, 1)
			// Store blocks in reverse so block ids and key order differ.
			srcIDs := make([]int, n)
			for i := range srcIDs {
				srcIDs[i] = n - 1 - i
			}
			requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, srcIDs))

			// Object names are {rank}/{hex} or {hex}, under the root.
			for _, k := range keys {
				want := filepath.Join(root, k.String())
				if tc.hasRank {
					want = filepath.Join(root, "3", k.String())
				}
				require.Equal(t, want, s.Path(k))
				fi, err := os.Stat(want)
				require.NoError(t, err)
				require.Equal(t, int64(HeaderSize+testBlockSize), fi.Size())
			}
			if tc.hasRank {
				entries, err := os.ReadDir(root)
				require.NoError(t, err)
				require.Len(t, entries, 1)
				require.Equal(t, "3", entries[0].Name())
			}
			require.Empty(t, tempFiles(t, s.Dir()))

			// Land them in blocks 1..n of a layout with a guard block at
			// each end.
			dst := guardedBlocks(t, n+2, testBlockSize)
			requireAllOK(t, keys, s.GetBlocksWithLayout(context.Background(), keys, dst, seq(1, n)))
			for i := range n {
				requireSameBlock(t, src.Block(srcIDs[i]), dst.Block(1+i), "key %d", i)
			}
			requireGuarded(t, dst.Block(0), "leading guard")
			requireGuarded(t, dst.Block(n+1), "trailing guard")
		})
	}
}

func TestRanksDoNotCollide(t *testing.T) {
	root := t.TempDir()
	r0 := newTestStore(t, FSConfig{Dir: root, HasRank: true, Rank: 0})
	r1 := newTestStore(t, FSConfig{Dir: root, HasRank: true, Rank: 1})
	keys := testKeys(t, 1, "same")
	src := randomBlocks(t, 2, testBlockSize, 2)
	requireAllOK(t, keys, r0.PutBlocksWithLayout(context.Background(), keys, src, []int{0}))
	requireAllOK(t, keys, r1.PutBlocksWithLayout(context.Background(), keys, src, []int{1}))

	dst := guardedBlocks(t, 2, testBlockSize)
	requireAllOK(t, keys, r0.GetBlocksWithLayout(context.Background(), keys, dst, []int{0}))
	requireAllOK(t, keys, r1.GetBlocksWithLayout(context.Background(), keys, dst, []int{1}))
	requireSameBlock(t, src.Block(0), dst.Block(0), "rank 0")
	requireSameBlock(t, src.Block(1), dst.Block(1), "rank 1")
}

func TestKeyLengthExtremes(t *testing.T) {
	s := newTestStore(t, FSConfig{})
	one, err := NewKey([]byte{0x00})
	require.NoError(t, err)
	long, err := NewKey(bytes.Repeat([]byte{0xff}, MaxKeyLen))
	require.NoError(t, err)
	keys := []Key{one, long}
	src := randomBlocks(t, 2, testBlockSize, 3)
	requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, []int{0, 1}))
	require.FileExists(t, filepath.Join(s.Dir(), "00"))
	require.FileExists(t, filepath.Join(s.Dir(), strings.Repeat("ff", MaxKeyLen)))

	dst := guardedBlocks(t, 2, testBlockSize)
	requireAllOK(t, keys, s.GetBlocksWithLayout(context.Background(), keys, dst, []int{0, 1}))
	requireSameBlock(t, src.Block(0), dst.Block(0), "1-byte key")
	requireSameBlock(t, src.Block(1), dst.Block(1), "64-byte key")
}

func TestHasBlocks(t *testing.T) {
	s := newTestStore(t, FSConfig{HasRank: true, Rank: 1})
	keys := testKeys(t, 5, "has")
	for i, p := range s.HasBlocks(context.Background(), keys) {
		require.Equal(t, Presence{Key: keys[i]}, p)
	}

	src := randomBlocks(t, 5, testBlockSize, 4)
	put := []Key{keys[1], keys[3]}
	requireAllOK(t, put, s.PutBlocksWithLayout(context.Background(), put, src, []int{1, 3}))

	got := s.HasBlocks(context.Background(), keys)
	require.Len(t, got, len(keys))
	for i, p := range got {
		require.Equal(t, keys[i], p.Key)
		require.NoError(t, p.Err)
		require.Equal(t, i == 1 || i == 3, p.Found, "key %d", i)
		if p.Found {
			require.Equal(t, int64(testBlockSize), p.Size)
		} else {
			require.Zero(t, p.Size)
		}
	}

	// A zero key fails alone.
	got = s.HasBlocks(context.Background(), []Key{keys[1], {}, keys[3]})
	require.True(t, got[0].Found)
	require.ErrorIs(t, got[1].Err, ErrInvalidArgument)
	require.False(t, got[1].Found)
	require.True(t, got[2].Found)

	require.Empty(t, s.HasBlocks(context.Background(), nil))
}

func TestGetMissingFailsOnlyThatBlock(t *testing.T) {
	s := newTestStore(t, FSConfig{})
	keys := testKeys(t, 4, "missing")
	src := randomBlocks(t, 4, testBlockSize, 5)
	present := []Key{keys[0], keys[1], keys[3]}
	requireAllOK(t, present, s.PutBlocksWithLayout(context.Background(), present, src, []int{0, 1, 3}))

	dst := guardedBlocks(t, 4, testBlockSize)
	res := s.GetBlocksWithLayout(context.Background(), keys, dst, seq(0, 4))
	require.Len(t, res, 4)
	for i, r := range res {
		require.Equal(t, keys[i], r.Key)
		if i == 2 {
			require.ErrorIs(t, r.Err, ErrNotFound)
			require.NotErrorIs(t, r.Err, ErrCorrupt)
			require.ErrorContains(t, r.Err, "object "+keys[2].String()+": not found at "+s.Path(keys[2]))
			requireGuarded(t, dst.Block(i), "missing block's destination")
			continue
		}
		require.NoError(t, r.Err)
		requireSameBlock(t, src.Block(i), dst.Block(i), "block %d", i)
	}
	require.Equal(t, []Key{keys[2]}, FailedKeys(res))
}

func TestCorruptionDetected(t *testing.T) {
	tests := []struct {
		name string
		// damage spoils the object at path.
		damage func(t *testing.T, path string)
		want   string
		// hasSees: HasBlocks reads only the header, so it sees every
		// damage except one inside the payload.
		hasSees bool
		// lands: the damage is found only once the payload has been read
		// into a host destination, which then holds the damaged payload.
		lands bool
	}{
		{
			name: "payload byte",
			damage: func(t *testing.T, path string) {
				flipByte(t, path, HeaderSize+testBlockSize/2)
			},
			want:  ": crc32c mismatch: stored 0x",
			lands: true,
		},
		{
			name: "truncated payload",
			damage: func(t *testing.T, path string) {
				require.NoError(t, os.Truncate(path, HeaderSize+testBlockSize-100))
			},
			want:    ": length mismatch: header records 4096 payload bytes, object holds 3996",
			hasSees: true,
		},
		{
			name: "truncated header",
			damage: func(t *testing.T, path string) {
				require.NoError(t, os.Truncate(path, 7))
			},
			want:    ": truncated header: 7 of 88 bytes",
			hasSees: true,
		},
		{
			name: "empty file",
			damage: func(t *testing.T, path string) {
				require.NoError(t, os.Truncate(path, 0))
			},
			want:    ": truncated header: 0 of 88 bytes",
			hasSees: true,
		},
		{
			name: "bad magic",
			damage: func(t *testing.T, path string) {
				flipByte(t, path, 1)
			},
			want:    `: bad magic "K`,
			hasSees: true,
		},
		{
			name: "header length field",
			damage: func(t *testing.T, path string) {
				flipByte(t, path, 9)
			},
			want:    ": header crc32c mismatch",
			hasSees: true,
		},
	}
	for _, tt := range tests {
		// host: the destination lends its memory and the payload is read
		// into it in place; bounce: it does not (device memory), and the
		// payload is checked in a buffer before WriteBlock.
		for _, host := range []bool{true, false} {
			name := tt.name + "/bounce"
			if host {
				name = tt.name + "/host"
			}
			t.Run(name, func(t *testing.T) {
				s := newTestStore(t, FSConfig{HasRank: true, Rank: 2})
				keys := testKeys(t, 3, tt.name)
				src := randomBlocks(t, 3, testBlockSize, 6)
				requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 3)))
				path := s.Path(keys[1])
				tt.damage(t, path)
				damaged, err := os.ReadFile(path)
				require.NoError(t, err)

				mem := guardedBlocks(t, 3, testBlockSize)
				var dst BlockIO = mem
				if !host {
					dst = &probeBlocks{MemoryBlocks: mem}
				}
				res := s.GetBlocksWithLayout(context.Background(), keys, dst, seq(0, 3))
				require.NoError(t, res[0].Err)
				require.NoError(t, res[2].Err)
				require.ErrorIs(t, res[1].Err, ErrCorrupt)
				require.NotErrorIs(t, res[1].Err, ErrNotFound)
				require.ErrorContains(t, res[1].Err, "object "+keys[1].String()+tt.want)
				requireSameBlock(t, src.Block(0), mem.Block(0), "block 0")
				requireSameBlock(t, src.Block(2), mem.Block(2), "block 2")
				if host && tt.lands {
					// The damaged payload landed in the destination, yet the
					// block is reported failed: its bytes are never loaded.
					requireSameBlock(t, damaged[HeaderSize:], mem.Block(1), "corrupt block's destination holds what landed")
				} else {
					// Damage to the header or the length is found before any
					// payload byte is read; a bounce never writes a bad block.
					requireGuarded(t, mem.Block(1), "corrupt block's destination")
				}

				has := s.HasBlocks(context.Background(), keys)
				require.True(t, has[0].Found)
				require.True(t, has[2].Found)
				if tt.hasSees {
					require.False(t, has[1].Found)
					require.ErrorIs(t, has[1].Err, ErrCorrupt)
				} else {
					require.True(t, has[1].Found)
					require.NoError(t, has[1].Err)
				}
			})
		}
	}
}

// An object file replaced by another key's valid object (a stray copy, a
// rename gone wrong) is refused as corrupt, not served as the key's data.
func TestObjectOfAnotherKeyRefused(t *testing.T) {
	s := newTestStore(t, FSConfig{HasRank: true, Rank: 4})
	keys := testKeys(t, 3, "swapped")
	src := randomBlocks(t, 3, testBlockSize, 31)
	requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 3)))
	a, err := os.ReadFile(s.Path(keys[0]))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(s.Path(keys[1]), a, 0o644))

	dst := guardedBlocks(t, 3, testBlockSize)
	res := s.GetBlocksWithLayout(context.Background(), keys, dst, seq(0, 3))
	require.NoError(t, res[0].Err)
	require.NoError(t, res[2].Err)
	require.ErrorIs(t, res[1].Err, ErrCorrupt)
	require.ErrorContains(t, res[1].Err, "object "+keys[1].String()+": holds the object of key "+keys[0].String())
	requireGuarded(t, dst.Block(1), "the refused object's destination")
	requireSameBlock(t, src.Block(0), dst.Block(0), "block 0")
	requireSameBlock(t, src.Block(2), dst.Block(2), "block 2")

	has := s.HasBlocks(context.Background(), keys)
	require.True(t, has[0].Found)
	require.True(t, has[2].Found)
	require.False(t, has[1].Found)
	require.ErrorIs(t, has[1].Err, ErrCorrupt)
}

func flipByte(t *testing.T, path string, off int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[off] ^= 0x40
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

func TestGetWrongBlockSize(t *testing.T) {
	// Two stores over one directory whose layouts disagree on block size,
	// as after a model or page-size change.
	dir := t.TempDir()
	small := newTestStore(t, FSConfig{Dir: dir})
	large := newTestStore(t, FSConfig{Dir: dir})
	keys := testKeys(t, 1, "size")
	src := randomBlocks(t, 1, testBlockSize, 7)
	requireAllOK(t, keys, small.PutBlocksWithLayout(context.Background(), keys, src, []int{0}))

	for _, bs := range []int{2 * testBlockSize, testBlockSize / 2} {
		dst := guardedBlocks(t, 1, bs)
		res := large.GetBlocksWithLayout(context.Background(), keys, dst, []int{0})
		require.ErrorIs(t, res[0].Err, ErrCorrupt)
		require.ErrorContains(t, res[0].Err, fmt.Sprintf(
			"object %s: length mismatch: object holds 4096 bytes, destination block is %d bytes", keys[0], bs))
		requireGuarded(t, dst.Block(0), "destination of block size %d", bs)
	}
}

func TestPutLeavesNoTempFiles(t *testing.T) {
	s := newTestStore(t, FSConfig{Concurrency: 4})
	keys := testKeys(t, 64, "tmp")
	src := randomBlocks(t, 64, testBlockSize, 8)
	// Twice: the second put replaces every object in place.
	for range 2 {
		requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 64)))
		require.Empty(t, tempFiles(t, s.Dir()))
		entries, err := os.ReadDir(s.Dir())
		require.NoError(t, err)
		require.Len(t, entries, 64)
	}
}

func TestFailedPutLeavesNoPartialObject(t *testing.T) {
	s := newTestStore(t, FSConfig{})
	keys := testKeys(t, 4, "atomic")
	old := randomBlocks(t, 4, testBlockSize, 9)
	// keys[1] already holds an object, which a failed replacement must
	// leave as it was; keys[2] holds none, and must still hold none.
	requireAllOK(t, keys[1:2], s.PutBlocksWithLayout(context.Background(), keys[1:2], old, []int{1}))

	injected := errors.New("injected failure")
	s.faults.beforeRename = func(k Key) error {
		if k == keys[1] || k == keys[2] {
			return injected
		}
		return nil
	}
	src := randomBlocks(t, 4, testBlockSize, 10)
	res := s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 4))
	require.NoError(t, res[0].Err)
	require.NoError(t, res[3].Err)
	for _, i := range []int{1, 2} {
		require.ErrorIs(t, res[i].Err, injected)
		require.ErrorContains(t, res[i].Err, "object "+keys[i].String())
	}
	require.Empty(t, tempFiles(t, s.Dir()))
	require.NoFileExists(t, s.Path(keys[2]))

	s.faults.beforeRename = nil
	dst := guardedBlocks(t, 4, testBlockSize)
	got := s.GetBlocksWithLayout(context.Background(), keys, dst, seq(0, 4))
	require.NoError(t, got[0].Err)
	require.NoError(t, got[1].Err)
	require.ErrorIs(t, got[2].Err, ErrNotFound)
	require.NoError(t, got[3].Err)
	requireSameBlock(t, src.Block(0), dst.Block(0), "block 0")
	requireSameBlock(t, old.Block(1), dst.Block(1), "old object kept")
	requireSameBlock(t, src.Block(3), dst.Block(3), "block 3")
}

// A store whose directory was removed (a wiped shared mount) recreates it on
// the next put, whether the directory comes back first or not.
func TestPutRecreatesRemovedDirectory(t *testing.T) {
	for _, hasRank := range []bool{false, true} {
		t.Run(fmt.Sprintf("rank=%v", hasRank), func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "objects")
			s := newTestStore(t, FSConfig{Dir: root, HasRank: hasRank, Rank: 3})
			keys := testKeys(t, 4, "recreate")
			src := randomBlocks(t, 4, testBlockSize, 21)
			roundTrip := func(what string, ids []int) {
				t.Helper()
				requireAllOK(t, keys[:2], s.PutBlocksWithLayout(context.Background(), keys[:2], src, ids))
				dst := guardedBlocks(t, 4, testBlockSize)
				requireAllOK(t, keys[:2], s.GetBlocksWithLayout(context.Background(), keys[:2], dst, ids))
				for _, id := range ids {
					requireSameBlock(t, src.Block(id), dst.Block(id), "%s: block %d", what, id)
				}
			}
			roundTrip("before", []int{0, 1})

			require.NoError(t, os.RemoveAll(root))
			roundTrip("directory removed", []int{2, 3})

			// Removed again, and the top directory alone comes back.
			require.NoError(t, os.RemoveAll(root))
			require.NoError(t, os.Mkdir(root, 0o755))
			roundTrip("top directory recreated", []int{1, 2})
			require.Empty(t, tempFiles(t, s.Dir()))
		})
	}
}

func TestPutIntoNonDirectory(t *testing.T) {
	root := t.TempDir()
	s := newTestStore(t, FSConfig{Dir: root, HasRank: true, Rank: 5})
	// The rank directory vanishes and a file takes its place (an operator
	// error on a shared mount).
	require.NoError(t, os.Remove(s.Dir()))
	require.NoError(t, os.WriteFile(s.Dir(), []byte("not a dir"), 0o644))

	keys := testKeys(t, 3, "nondir")
	src := randomBlocks(t, 3, testBlockSize, 11)
	res := s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 3))
	for i, r := range res {
		require.Equal(t, keys[i], r.Key)
		require.ErrorContains(t, r.Err, "create temporary file")
	}
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing but the file")
}

func TestPutIntoReadOnlyDirectory(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes through directory permissions")
	}
	s := newTestStore(t, FSConfig{})
	require.NoError(t, os.Chmod(s.Dir(), 0o555))
	t.Cleanup(func() { os.Chmod(s.Dir(), 0o755) })
	keys := testKeys(t, 2, "ro")
	src := randomBlocks(t, 2, testBlockSize, 12)
	for _, r := range s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 2)) {
		require.ErrorIs(t, r.Err, os.ErrPermission)
	}
	entries, err := os.ReadDir(s.Dir())
	require.NoError(t, err)
	require.Empty(t, entries)

	_, err = NewFSStore(FSConfig{Dir: s.Dir()})
	require.ErrorContains(t, err, "not writable")
}

func TestNewFSStore(t *testing.T) {
	root := t.TempDir()
	nested := filepath.Join(root, "a", "b")
	s, err := NewFSStore(FSConfig{Dir: nested, HasRank: true, Rank: 0})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(nested, "0"), s.Dir())
	require.DirExists(t, s.Dir())
	require.Empty(t, tempFiles(t, s.Dir()), "probe removed")

	file := filepath.Join(root, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, tc := range []struct {
		cfg  FSConfig
		want string
	}{
		{FSConfig{}, "empty directory"},
		{FSConfig{Dir: file}, file},
		{FSConfig{Dir: filepath.Join(file, "sub")}, filepath.Join(file, "sub")},
		{FSConfig{Dir: root, HasRank: true, Rank: -1}, "invalid rank -1"},
		{FSConfig{Dir: root, Concurrency: -2}, "invalid concurrency -2"},
	} {
		_, err := NewFSStore(tc.cfg)
		require.ErrorContains(t, err, tc.want, "%+v", tc.cfg)
	}
}

// probeBlocks wraps MemoryBlocks to slow blocks down, watch how many are in
// flight at once, run a callback as a block is read, and fail blocks.
type probeBlocks struct {
	*MemoryBlocks
	delay       func(id int) time.Duration
	onRead      func(id int)
	fail        func(id int) error
	inFlight    atomic.Int32
	maxInFlight atomic.Int32
}

// HostBlock lends nothing: a probeBlocks stands for memory a store cannot
// read into in place (device memory), so gets go through WriteBlock, where
// the probes are.
func (p *probeBlocks) HostBlock(int) ([][]byte, func(), bool, error) { return nil, nil, false, nil }

func (p *probeBlocks) enter(id int) {
	n := p.inFlight.Add(1)
	for {
		m := p.maxInFlight.Load()
		if n <= m || p.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	if p.delay != nil {
		time.Sleep(p.delay(id))
	}
}

func (p *probeBlocks) ReadBlock(id int, dst []byte) error {
	p.enter(id)
	defer p.inFlight.Add(-1)
	if p.onRead != nil {
		p.onRead(id)
	}
	if p.fail != nil {
		if err := p.fail(id); err != nil {
			return err
		}
	}
	return p.MemoryBlocks.ReadBlock(id, dst)
}

func (p *probeBlocks) WriteBlock(id int, src []byte) error {
	p.enter(id)
	defer p.inFlight.Add(-1)
	if p.fail != nil {
		if err := p.fail(id); err != nil {
			return err
		}
	}
	return p.MemoryBlocks.WriteBlock(id, src)
}

func TestResultsInInputOrderUnderConcurrency(t *testing.T) {
	const n, limit = 48, 6
	s := newTestStore(t, FSConfig{Concurrency: limit})
	keys := testKeys(t, n, "order")
	// Early blocks are the slowest, so completion order is roughly the
	// reverse of input order.
	slow := func(id int) time.Duration { return time.Duration(n-id) * 200 * time.Microsecond }
	src := &probeBlocks{MemoryBlocks: randomBlocks(t, n, testBlockSize, 13), delay: slow}

	// Every fifth key is left out of the store.
	var present []Key
	var presentIDs []int
	for i, k := range keys {
		if i%5 != 2 {
			present = append(present, k)
			presentIDs = append(presentIDs, i)
		}
	}
	requireAllOK(t, present, s.PutBlocksWithLayout(context.Background(), present, src, presentIDs))
	require.LessOrEqual(t, src.maxInFlight.Load(), int32(limit))
	require.Greater(t, src.maxInFlight.Load(), int32(1), "blocks ran concurrently")

	dst := &probeBlocks{MemoryBlocks: guardedBlocks(t, n, testBlockSize), delay: slow}
	res := s.GetBlocksWithLayout(context.Background(), keys, dst, seq(0, n))
	require.LessOrEqual(t, dst.maxInFlight.Load(), int32(limit))
	require.Len(t, res, n)
	for i, r := range res {
		require.Equal(t, keys[i], r.Key, "result %d", i)
		if i%5 == 2 {
			require.ErrorIs(t, r.Err, ErrNotFound, "block %d", i)
			requireGuarded(t, dst.Block(i), "missing block %d", i)
		} else {
			require.NoError(t, r.Err, "block %d", i)
			requireSameBlock(t, src.Block(i), dst.Block(i), "block %d", i)
		}
	}
}

func TestContextCanceledBeforeCall(t *testing.T) {
	s := newTestStore(t, FSConfig{})
	keys := testKeys(t, 10, "cancel")
	src := randomBlocks(t, 10, testBlockSize, 14)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	for _, r := range s.PutBlocksWithLayout(ctx, keys, src, seq(0, 10)) {
		require.ErrorIs(t, r.Err, context.Canceled)
	}
	entries, err := os.ReadDir(s.Dir())
	require.NoError(t, err)
	require.Empty(t, entries)

	requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 10)))
	dst := guardedBlocks(t, 10, testBlockSize)
	for i, r := range s.GetBlocksWithLayout(ctx, keys, dst, seq(0, 10)) {
		require.ErrorIs(t, r.Err, context.Canceled)
		requireGuarded(t, dst.Block(i), "block %d", i)
	}
	for _, p := range s.HasBlocks(ctx, keys) {
		require.False(t, p.Found)
		require.ErrorIs(t, p.Err, context.Canceled)
	}
	for _, r := range s.Delete(ctx, keys) {
		require.ErrorIs(t, r.Err, context.Canceled)
	}

	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	for _, r := range s.GetBlocksWithLayout(expired, keys, dst, seq(0, 10)) {
		require.ErrorIs(t, r.Err, context.DeadlineExceeded)
	}
}

func TestContextCanceledMidBatch(t *testing.T) {
	// One block at a time makes "not yet started" exact: the block whose
	// read cancels the context finishes, the ones after it never start.
	s := newTestStore(t, FSConfig{Concurrency: 1})
	keys := testKeys(t, 8, "midbatch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &probeBlocks{
		MemoryBlocks: randomBlocks(t, 8, testBlockSize, 15),
		onRead: func(id int) {
			if id == 2 {
				cancel()
			}
		},
	}
	res := s.PutBlocksWithLayout(ctx, keys, src, seq(0, 8))
	for i, r := range res {
		require.Equal(t, keys[i], r.Key)
		if i <= 2 {
			require.NoError(t, r.Err, "block %d started before the cancel", i)
		} else {
			require.ErrorIs(t, r.Err, context.Canceled, "block %d", i)
		}
	}
	for i, p := range s.HasBlocks(context.Background(), keys) {
		require.Equal(t, i <= 2, p.Found, "block %d", i)
	}
	require.Empty(t, tempFiles(t, s.Dir()))
}

func TestBatchValidation(t *testing.T) {
	keys := testKeys(t, 3, "validate")
	withZero := []Key{keys[0], {}, keys[2]}
	tests := []struct {
		name   string
		get    bool
		keys   []Key
		ids    []int
		nilIO  bool
		want   string
		passes bool
	}{
		{name: "put fewer ids", keys: keys, ids: []int{0, 1}, want: "3 keys but 2 source block ids"},
		{name: "get more ids", get: true, keys: keys, ids: []int{0, 1, 2, 3}, want: "3 keys but 4 destination block ids"},
		{name: "put id past end", keys: keys, ids: []int{0, 4, 1}, want: "source block id 4 at index 1 out of range [0, 4)"},
		{name: "get negative id", get: true, keys: keys, ids: []int{0, 1, -1}, want: "destination block id -1 at index 2 out of range [0, 4)"},
		{name: "get duplicate id", get: true, keys: keys, ids: []int{2, 0, 2}, want: "duplicate destination block id 2 at indexes 0 and 2"},
		{name: "put zero key", keys: withZero, ids: []int{0, 1, 2}, want: "key at index 1: invalid key length 0"},
		{name: "put nil layout", keys: keys, ids: []int{0, 1, 2}, nilIO: true, want: "source layout is nil"},
		{name: "get nil layout", get: true, keys: keys, ids: []int{0, 1, 2}, nilIO: true, want: "destination layout is nil"},
		// Reading one source block into two objects is fine.
		{name: "put duplicate source id", keys: keys, ids: []int{1, 1, 3}, passes: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, FSConfig{})
			src := randomBlocks(t, 4, testBlockSize, 16)
			if tt.get {
				requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, []int{0, 1, 2}))
			}
			blocks := guardedBlocks(t, 4, testBlockSize)
			if !tt.get {
				blocks = src
			}
			var io BlockIO = blocks
			if tt.nilIO {
				io = nil
			}
			var res []Result
			if tt.get {
				res = s.GetBlocksWithLayout(context.Background(), tt.keys, io, tt.ids)
			} else {
				res = s.PutBlocksWithLayout(context.Background(), tt.keys, io, tt.ids)
			}
			require.Len(t, res, len(tt.keys))
			if tt.passes {
				requireAllOK(t, tt.keys, res)
				return
			}
			for i, r := range res {
				require.Equal(t, tt.keys[i], r.Key)
				require.ErrorIs(t, r.Err, ErrInvalidArgument)
				require.ErrorContains(t, r.Err, tt.want)
			}
			if tt.get {
				for id := range 4 {
					requireGuarded(t, blocks.Block(id), "block %d", id)
				}
			} else {
				entries, err := os.ReadDir(s.Dir())
				require.NoError(t, err)
				require.Empty(t, entries, "nothing written")
			}
		})
	}
}

func TestDelete(t *testing.T) {
	s := newTestStore(t, FSConfig{HasRank: true, Rank: 7})
	keys := testKeys(t, 4, "delete")
	src := randomBlocks(t, 4, testBlockSize, 17)
	requireAllOK(t, keys[:3], s.PutBlocksWithLayout(context.Background(), keys[:3], src, seq(0, 3)))

	// keys[3] never existed: deleting it succeeds.
	del := []Key{keys[0], keys[2], keys[3]}
	requireAllOK(t, del, s.Delete(context.Background(), del))
	for i, p := range s.HasBlocks(context.Background(), keys) {
		require.Equal(t, i == 1, p.Found, "key %d", i)
	}
	res := s.Delete(context.Background(), []Key{{}, keys[1]})
	require.ErrorIs(t, res[0].Err, ErrInvalidArgument)
	require.NoError(t, res[1].Err)
	require.NoFileExists(t, s.Path(keys[1]))
}

func TestEmptyBatches(t *testing.T) {
	s := newTestStore(t, FSConfig{})
	m := guardedBlocks(t, 1, testBlockSize)
	require.Empty(t, s.PutBlocksWithLayout(context.Background(), nil, m, nil))
	require.Empty(t, s.GetBlocksWithLayout(context.Background(), nil, m, nil))
	require.Empty(t, s.Delete(context.Background(), nil))
}

func TestLayoutFailuresFailOnlyTheirBlock(t *testing.T) {
	s := newTestStore(t, FSConfig{})
	keys := testKeys(t, 3, "layout")
	broken := errors.New("layout broken")
	failBlock1 := func(id int) error {
		if id == 1 {
			return broken
		}
		return nil
	}
	src := &probeBlocks{MemoryBlocks: randomBlocks(t, 3, testBlockSize, 18), fail: failBlock1}
	res := s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 3))
	require.NoError(t, res[0].Err)
	require.ErrorIs(t, res[1].Err, broken)
	require.ErrorContains(t, res[1].Err, "object "+keys[1].String()+": read source block 1")
	require.NoError(t, res[2].Err)
	require.NoFileExists(t, s.Path(keys[1]))
	require.Empty(t, tempFiles(t, s.Dir()))

	src.fail = nil
	requireAllOK(t, keys, s.PutBlocksWithLayout(context.Background(), keys, src, seq(0, 3)))
	dst := &probeBlocks{MemoryBlocks: guardedBlocks(t, 3, testBlockSize), fail: failBlock1}
	res = s.GetBlocksWithLayout(context.Background(), keys, dst, seq(0, 3))
	require.NoError(t, res[0].Err)
	require.ErrorIs(t, res[1].Err, broken)
	require.ErrorContains(t, res[1].Err, "object "+keys[1].String()+": write destination block 1")
	require.NoError(t, res[2].Err)
	requireSameBlock(t, src.Block(2), dst.Block(2), "block 2")
}
