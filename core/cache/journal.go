package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

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
	f       *os.File
	header  []byte
	live    map[int]journalEntry // block -> its entry
	records int                  // records in the file
	blocks  int
	layers  int
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
	j = &journal{header: header, live: map[int]journalEntry{}, blocks: int(shape.Blocks), layers: int(shape.Layers)}
	if len(old) >= len(header) && bytes.Equal(old[:len(header)], header) {
		j.replay(old[len(header):])
	} else {
		reset = true
	}
	if err := j.rewrite(path); err != nil {
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

// rewrite replaces the file at path with the header and the live records
// (a new file renamed over it, so that a kill leaves the old or the new),
// and keeps it open for appending.
func (j *journal) rewrite(path string) error {
	buf := append([]byte(nil), j.header...)
	for block, e := range j.live {
		buf = append(buf, encodeRecord(recordStored, block, e)...)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, buf, privdir.FileMode); err != nil {
		return fmt.Errorf("G3 journal %q: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("G3 journal %q: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("G3 journal %q: %w", path, err)
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f, j.records = f, len(j.live)
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

// clear records that G3 holds nothing.
func (j *journal) clear() error {
	clear(j.live)
	return j.rewrite(j.f.Name())
}

func (j *journal) append(rec []byte) error {
	if _, err := j.f.Write(rec); err != nil {
		return fmt.Errorf("G3 journal %q: %w", j.f.Name(), err)
	}
	if j.records++; j.records > len(j.live)+compactAfterLog*j.blocks+1024 {
		return j.rewrite(j.f.Name())
	}
	return nil
}

func (j *journal) close() error {
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
