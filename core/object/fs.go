package object

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kvbm/kvbm/internal/privdir"
)

// DefaultConcurrency is the number of blocks an FSStore moves at once when
// FSConfig.Concurrency is 0.
const DefaultConcurrency = 8

// tempPrefix starts the name of every object being written. The dot keeps
// such files out of the way of anything listing objects; a crashed writer can
// leave one behind, which is never mistaken for an object since lookups go by
// exact name.
const tempPrefix = ".tmp-"

// FSConfig configures an FSStore.
type FSConfig struct {
	// Dir is the store's root directory, local or a shared mount. It is
	// created if missing, and created again by a put that finds it (or
	// the rank directory) gone. The directories the store makes are 0700
	// and its objects 0600; it refuses (privdir.ErrNotPrivate) a root or
	// rank directory that is not the user's own or that its group or
	// other users can write (package privdir).
	Dir string
	// HasRank and Rank prefix every object with the worker's rank
	// ("{Dir}/{Rank}/{hex key}"), so SPMD workers sharing Dir never
	// collide. Without a rank objects are "{Dir}/{hex key}".
	HasRank bool
	Rank    int
	// Concurrency bounds the blocks moved at once by one call; 0 means
	// DefaultConcurrency.
	Concurrency int
}

// FSStore is a Store over a directory: one file per object, named by the
// key's hex form, written atomically (temporary file, fsync, rename, fsync of
// the directory) so that readers on any host sharing the directory see an
// object whole or not at all.
type FSStore struct {
	root        string // Dir
	dir         string // where objects live: Dir, or Dir/{rank}
	concurrency int
	faults      fsFaults
}

// fsFaults lets tests inject failures at points the filesystem offers no
// reliable way to reach (the tests may run as root).
type fsFaults struct {
	// beforeRename, when set, runs after an object's temporary file is
	// written and synced; an error fails the put there.
	beforeRename func(Key) error
}

var _ Store = (*FSStore)(nil)

// NewFSStore opens (creating if needed) a filesystem store. It fails, naming
// the directory, when the directory cannot be created or written, or is
// open to other users (privdir.Check: nothing is made in such a directory).
func NewFSStore(cfg FSConfig) (*FSStore, error) {
	if cfg.Dir == "" {
		return nil, errors.New("fs object store: empty directory")
	}
	if cfg.HasRank && cfg.Rank < 0 {
		return nil, fmt.Errorf("fs object store %q: invalid rank %d", cfg.Dir, cfg.Rank)
	}
	if cfg.Concurrency < 0 {
		return nil, fmt.Errorf("fs object store %q: invalid concurrency %d", cfg.Dir, cfg.Concurrency)
	}
	root := filepath.Clean(cfg.Dir)
	dir := root
	if cfg.HasRank {
		dir = filepath.Join(root, strconv.Itoa(cfg.Rank))
	}
	if err := makeDirs(root, dir); err != nil {
		return nil, fmt.Errorf("fs object store %q: %w", dir, err)
	}
	// Probe with a real temporary file: a read-only mount or a directory
	// without write permission is found now, not on the first offload.
	probe, err := os.CreateTemp(dir, tempPrefix+"probe-*")
	if err != nil {
		return nil, fmt.Errorf("fs object store %q: not writable: %w", dir, err)
	}
	probe.Close()
	if err := os.Remove(probe.Name()); err != nil {
		return nil, fmt.Errorf("fs object store %q: %w", dir, err)
	}
	c := cfg.Concurrency
	if c == 0 {
		c = DefaultConcurrency
	}
	return &FSStore{root: root, dir: dir, concurrency: c}, nil
}

// makeDirs makes (privdir.Make) the store's root, then its rank directory
// dir if that is another: the root is checked before anything is made in
// it.
func makeDirs(root, dir string) error {
	if err := privdir.Make(root); err != nil {
		return err
	}
	if dir == root {
		return nil
	}
	return privdir.Make(dir)
}

// Dir returns the directory holding the store's objects: FSConfig.Dir, or
// its rank subdirectory.
func (s *FSStore) Dir() string { return s.dir }

// Path returns the file that holds key's object.
func (s *FSStore) Path(key Key) string { return filepath.Join(s.dir, key.String()) }

// HasBlocks reports which objects exist, reading only their headers.
func (s *FSStore) HasBlocks(ctx context.Context, keys []Key) []Presence {
	out := make([]Presence, len(keys))
	forEach(ctx, len(keys), s.concurrency,
		func() func(int) {
			return func(i int) { out[i] = s.hasOne(keys[i]) }
		},
		func(i int, err error) { out[i] = Presence{Key: keys[i], Err: err} })
	return out
}

func (s *FSStore) hasOne(key Key) Presence {
	p := Presence{Key: key}
	if err := key.valid(); err != nil {
		p.Err = fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		return p
	}
	f, err := os.Open(s.Path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return p
	}
	if err != nil {
		p.Err = fmt.Errorf("object %s: %w", key, err)
		return p
	}
	defer f.Close()
	h, err := readHeader(f, key)
	if err != nil {
		p.Err = fmt.Errorf("object %s: %w", key, err)
		return p
	}
	p.Found, p.Size = true, int64(h.length)
	return p
}

// PutBlocksWithLayout writes each block of src to its key's object.
func (s *FSStore) PutBlocksWithLayout(ctx context.Context, keys []Key, src BlockIO, blockIDs []int) []Result {
	// One object's bytes, header then payload, written in one call.
	out := eachBlock(ctx, keys, src, blockIDs, roleSource, s.concurrency, HeaderSize,
		func(i int, buf func() []byte) error { return s.putOne(keys[i], src, blockIDs[i], buf()) })

	// One fsync of the directory makes every rename of the batch durable;
	// per-object syncs would cost one per block for the same guarantee,
	// since no result is reported before the batch returns.
	if !anySucceeded(out) {
		return out
	}
	if err := syncDir(s.dir); err != nil {
		err = fmt.Errorf("sync object directory %q: %w", s.dir, err)
		for i := range out {
			if out[i].Err == nil {
				out[i].Err = fmt.Errorf("object %s: %w", keys[i], err)
			}
		}
	}
	return out
}

func (s *FSStore) putOne(key Key, src BlockIO, id int, buf []byte) (err error) {
	payload := buf[HeaderSize:]
	if err := src.ReadBlock(id, payload); err != nil {
		return fmt.Errorf("object %s: read source block %d: %w", key, id, err)
	}
	putHeader(buf[:HeaderSize], key, payload)

	f, err := s.createTemp(key)
	if err != nil {
		return fmt.Errorf("object %s: create temporary file: %w", key, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(buf); err != nil {
		return fmt.Errorf("object %s: write: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("object %s: fsync: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("object %s: close: %w", key, err)
	}
	if hook := s.faults.beforeRename; hook != nil {
		if err := hook(key); err != nil {
			return fmt.Errorf("object %s: %w", key, err)
		}
	}
	if err := os.Rename(tmp, s.Path(key)); err != nil {
		return fmt.Errorf("object %s: rename into place: %w", key, err)
	}
	return nil
}

// createTemp creates the temporary file an object is written to. A store
// directory that has vanished (a wiped or remounted shared directory) is
// created again, as NewFSStore would and checked as it was, so that puts
// recover without a new store.
func (s *FSStore) createTemp(key Key) (*os.File, error) {
	pattern := tempPrefix + key.String() + "-*"
	f, err := os.CreateTemp(s.dir, pattern)
	if !errors.Is(err, fs.ErrNotExist) {
		return f, err
	}
	if err := makeDirs(s.root, s.dir); err != nil {
		return nil, fmt.Errorf("recreate missing store directory: %w", err)
	}
	// The new directory's own entry must survive a crash like the objects
	// renamed into it.
	if err := syncDir(filepath.Dir(s.dir)); err != nil {
		return nil, fmt.Errorf("sync recreated store directory: %w", err)
	}
	return os.CreateTemp(s.dir, pattern)
}

// GetBlocksWithLayout loads each key's object into its block of dst. The
// payload is read straight into a host destination block and checked as it
// lands; a block that fails may hold any bytes but is reported failed.
func (s *FSStore) GetBlocksWithLayout(ctx context.Context, keys []Key, dst BlockIO, blockIDs []int) []Result {
	return eachBlock(ctx, keys, dst, blockIDs, roleDestination, s.concurrency, 0,
		func(i int, buf func() []byte) error { return s.getOne(keys[i], dst, blockIDs[i], buf) })
}

func (s *FSStore) getOne(key Key, dst BlockIO, id int, buf func() []byte) error {
	path := s.Path(key)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("object %s: %w at %s", key, ErrNotFound, path)
	}
	if err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	defer f.Close()
	// The header, key included, is checked before any payload byte is read.
	h, err := readHeader(f, key)
	if err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	if bs := dst.BlockSize(); h.length != uint64(bs) {
		return fmt.Errorf("object %s: %w", key,
			corruptf("length mismatch: object holds %d bytes, destination block is %d bytes", h.length, bs))
	}
	return loadPayload(key, h, dst, id, buf, func(p []byte) error {
		if _, err := io.ReadFull(f, p); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				// Shrunk since readHeader checked its size.
				err = corruptf("truncated payload: %v", err)
			}
			return fmt.Errorf("object %s: read payload: %w", key, err)
		}
		return nil
	})
}

// readHeader reads and checks the header of key's open object, including
// that it was written under key and that the file is exactly as long as the
// header says, and leaves f at the start of the payload.
func readHeader(f *os.File, key Key) (header, error) {
	fi, err := f.Stat()
	if err != nil {
		return header{}, err
	}
	var hb [HeaderSize]byte
	n, err := io.ReadFull(f, hb[:])
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return header{}, fmt.Errorf("read header: %w", err)
	}
	h, err := decodeHeader(hb[:n])
	if err != nil {
		return header{}, err
	}
	if err := h.checkKey(key); err != nil {
		return header{}, err
	}
	if err := h.checkHeldLength(fi.Size() - HeaderSize); err != nil {
		return header{}, err
	}
	return h, nil
}

// Delete removes the objects of keys; a missing object counts as deleted.
// The directory is not synced: an object that reappears after a crash is
// still whole and valid, merely not evicted.
func (s *FSStore) Delete(ctx context.Context, keys []Key) []Result {
	return eachKey(ctx, keys, s.concurrency, func(i int) error { return s.deleteOne(keys[i]) })
}

func (s *FSStore) deleteOne(key Key) error {
	if err := key.valid(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if err := os.Remove(s.Path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("object %s: delete: %w", key, err)
	}
	return nil
}

// syncDir fsyncs a directory so that renames into it survive a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
