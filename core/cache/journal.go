package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/internal/crc32c"
	"github.com/kvbm/kvbm/internal/privdir"
)

// The journal of a persistent G3 (Config.G3PersistID): beside the G3 file,
// an append-only record of which key each G3 block holds and the checksum
// of each of its layers, so that a new process over the same file finds
// the blocks an earlier one wrote. A record is appended once a block's
// write landed; a block being written when the process died keeps its
// earlier record, whose checksums its new bytes no longer match, so it is
// never a hit. The header names what the keys are (the engine's id: model,
// layout, dtype, rank) and the layout's shape: another one starts afresh.
//
//	file   = header record*
//	header = "KVBMG3J\x01" u32 len, u32 crc32c(payload), payload
//	         payload = u32 blocks, u32 layers, u64 block bytes, id
//	record = u32 len, u32 crc32c(payload), payload
//	         payload = u8 kind, u32 block, u8 key len, key, [u16 n, n × u32 crc]
//
// Integers are little-endian. Reading stops at the first record that is
// cut short or does not match its checksum (a write the process did not
// finish); the file is cut there.

const (
	journalMagic    = "KVBMG3J\x01"
	journalName     = "kvbm-g3.journal"
	recordStored    = 1
	recordRemoved   = 2
	maxRecord       = 1 << 20
	compactAfterLog = 4 // records beyond live ones, per block, before a compaction
)

// journalShape is what the header checks besides the id.
type journalShape struct {
	Blocks, Layers uint32
	BlockBytes     uint64
}

// journalEntry is what the journal says one G3 block holds.
type journalEntry struct {
	key  pool.Key
	crcs []uint32
}

type journal struct {
	header []byte
	file   string // its path
	blocks int
	layers int
	live   map[int]journalEntry // block -> its entry; the caller's (c.mu)

	// A compaction runs in the background (compact): the records appended
	// meanwhile wait in pending and follow the live ones into the new file.
	mu         sync.Mutex
	f          *os.File
	records    int // records in the file
	compactAt  int // records at which the next compaction starts
	compacting bool
	pending    [][]byte
	done       sync.WaitGroup
	failures   int // compactions that failed in a row (logged once)
}

// openJournal reads dir's journal for id and shape: the blocks it vouches
// for (the last record of each block, a key's last block only). reset:
// the header named another id or shape, or there was no journal; the file
// is then made anew. The file is rewritten with the live records only.
func openJournal(dir, id string, shape journalShape) (j *journal, reset bool, err error) {
	header := encodeHeader(id, shape)
	path := filepath.Join(dir, journalName)
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("G3 journal %q: %w", path, err)
	}
	j = &journal{header: header, file: path, live: map[int]journalEntry{}, blocks: int(shape.Blocks), layers: int(shape.Layers)}
	if len(old) >= len(header) && bytes.Equal(old[:len(header)], header) {
		j.replay(old[len(header):])
	} else {
		reset = true
	}
	if err := j.rewrite(); err != nil {
		return nil, false, err
	}
	return j, reset, nil
}

func encodeHeader(id string, shape journalShape) []byte {
	payload := binary.LittleEndian.AppendUint32(nil, shape.Blocks)
	payload = binary.LittleEndian.AppendUint32(payload, shape.Layers)
	payload = binary.LittleEndian.AppendUint64(payload, shape.BlockBytes)
	payload = append(payload, id...)
	return frame([]byte(journalMagic), payload)
}

// frame appends len, crc and payload to dst.
func frame(dst, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	dst = binary.LittleEndian.AppendUint32(dst, crc32c.Update(0, payload))
	return append(dst, payload...)
}

// replay applies the records of b until the first that is cut short or
// corrupt.
func (j *journal) replay(b []byte) {
	owner := map[pool.Key]int{}
	for len(b) >= 8 {
		n := binary.LittleEndian.Uint32(b)
		if n > maxRecord || uint64(len(b)-8) < uint64(n) {
			break
		}
		payload := b[8 : 8+n]
		if crc32c.Update(0, payload) != binary.LittleEndian.Uint32(b[4:]) {
			break
		}
		b = b[8+n:]
		kind, block, e, ok := decodeRecord(payload)
		if !ok || block >= j.blocks || (kind == recordStored && len(e.crcs) != j.layers) {
			continue
		}
		j.records++
		if old, had := j.live[block]; had {
			delete(owner, old.key)
		}
		delete(j.live, block)
		if kind != recordStored {
			continue
		}
		if prev, had := owner[e.key]; had { // the key moved: its last block holds it
			delete(j.live, prev)
		}
		j.live[block] = e
		owner[e.key] = block
	}
}

func decodeRecord(p []byte) (kind byte, block int, e journalEntry, ok bool) {
	if len(p) < 6 {
		return 0, 0, e, false
	}
	kind, block = p[0], int(binary.LittleEndian.Uint32(p[1:]))
	kl := int(p[5])
	p = p[6:]
	if kl == 0 || kl > len(p) {
		return 0, 0, e, false
	}
	k, err := pool.NewKey(p[:kl])
	if err != nil {
		return 0, 0, e, false
	}
	e.key, p = k, p[kl:]
	if kind == recordRemoved {
		return kind, block, e, true
	}
	if kind != recordStored || len(p) < 2 {
		return 0, 0, e, false
	}
	n := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if len(p) != 4*n {
		return 0, 0, e, false
	}
	e.crcs = make([]uint32, n)
	for i := range e.crcs {
		e.crcs[i] = binary.LittleEndian.Uint32(p[4*i:])
	}
	return kind, block, e, true
}

func encodeRecord(kind byte, block int, e journalEntry) []byte {
	key := e.key.Bytes()
	p := append([]byte{kind}, binary.LittleEndian.AppendUint32(nil, uint32(block))...)
	p = append(p, byte(len(key)))
	p = append(p, key...)
	if kind == recordStored {
		p = binary.LittleEndian.AppendUint16(p, uint16(len(e.crcs)))
		for _, c := range e.crcs {
			p = binary.LittleEndian.AppendUint32(p, c)
		}
	}
	return frame(nil, p)
}

// rewrite replaces the file at path with the header and the live records,
// and keeps it open for appending. Callers hold j.mu, with no compaction
// running.
func (j *journal) rewrite() error {
	tmp, err := j.writeNew(snapshot(j.live))
	if err == nil {
		err = j.install(tmp, len(j.live))
	}
	return err
}

// snapshot encodes the live records.
func snapshot(live map[int]journalEntry) []byte {
	var buf []byte
	for block, e := range live {
		buf = append(buf, encodeRecord(recordStored, block, e)...)
	}
	return buf
}

// writeNew writes the header and records into a new file beside the
// journal and returns it, open.
func (j *journal) writeNew(records []byte) (*os.File, error) {
	tmp := j.file + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, privdir.FileMode)
	if err == nil {
		if _, err = f.Write(append(append([]byte(nil), j.header...), records...)); err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("G3 journal %q: %w", tmp, err)
	}
	return f, nil
}

// install renames the new file over the journal (a kill leaves the old or
// the new) and appends to it from now on; it holds records records.
// Callers hold j.mu.
func (j *journal) install(f *os.File, records int) error {
	if err := os.Rename(f.Name(), j.file); err != nil {
		f.Close()
		return fmt.Errorf("G3 journal %q: %w", j.file, err)
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f, j.records = f, records
	j.compactAt = records + compactAfterLog*j.blocks + 1024
	return nil
}

// stored records that block holds key, its layers' checksums crcs.
func (j *journal) stored(block int, key pool.Key, crcs []uint32) error {
	e := journalEntry{key: key, crcs: crcs}
	j.live[block] = e
	return j.append(encodeRecord(recordStored, block, e))
}

// removed records that block holds nothing (its key was dropped).
func (j *journal) removed(block int, key pool.Key) error {
	delete(j.live, block)
	return j.append(encodeRecord(recordRemoved, block, journalEntry{key: key}))
}

// clear records that G3 holds nothing, once a compaction running is over.
func (j *journal) clear() error {
	j.done.Wait()
	clear(j.live)
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.rewrite()
}

// append writes one record, or queues it while a compaction runs; past
// compactAt records it starts one, in the background: the live records are
// encoded here (the caller holds them), written out there.
func (j *journal) append(rec []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.compacting {
		j.pending = append(j.pending, rec)
		return nil
	}
	if _, err := j.f.Write(rec); err != nil {
		return fmt.Errorf("G3 journal %q: %w", j.file, err)
	}
	if j.records++; j.records >= j.compactAt {
		j.compacting = true
		j.done.Add(1)
		go j.compact(snapshot(j.live), len(j.live))
	}
	return nil
}

// compactStarted, set by tests, is called on a compaction's goroutine as
// it starts: a test holds it there to queue records behind it.
var compactStarted func()

// compact writes live, then the records appended meanwhile, into a new
// file and puts it in place. A compaction that fails (a full disk) leaves
// the old file, appends the queued records to it, and is tried again only
// after as many records again.
func (j *journal) compact(live []byte, n int) {
	defer j.done.Done()
	if compactStarted != nil {
		compactStarted()
	}
	f, err := j.writeNew(live)
	j.mu.Lock()
	defer j.mu.Unlock()
	if err == nil {
		if _, err = f.Write(bytes.Join(j.pending, nil)); err != nil {
			f.Close()
		} else {
			err = j.install(f, n+len(j.pending))
		}
	}
	pending := j.pending
	j.pending, j.compacting = nil, false
	if err == nil {
		j.failures = 0
		return
	}
	if j.failures++; j.failures == 1 {
		slog.Warn("kvbm: persistent G3: journal compaction failed; the journal keeps growing", "err", err)
	}
	j.compactAt = j.records + compactAfterLog*j.blocks + 1024
	for _, rec := range pending {
		if _, werr := j.f.Write(rec); werr != nil {
			slog.Warn("kvbm: persistent G3: journal", "err", werr)
			return
		}
		j.records++
	}
}

func (j *journal) close() error {
	j.done.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
