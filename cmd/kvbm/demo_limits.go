package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/internal/baseline"
)

// limit is what a demo row is set beside: the same bytes moved the plain
// way on the same medium, measured right after the path.
type limit struct {
	name string // "copy", "O_DIRECT write", ...
	gbs  float64
}

// limitChunk blocks are what the disk and file limits move per round, as
// many rounds as the path's bytes need.
const limitChunk = 32

// mediaLimits measures the limits of the disk and object rows as kvbm
// bench does: plain O_DIRECT pwrite/pread of one file in G3's directory,
// and a plain file per block (written with fsync, read into a ready
// buffer) in G4's.
type mediaLimits struct {
	buf    *storage.Memory
	data   []byte   // limitChunk blocks, aligned for O_DIRECT
	blocks [][]byte // data, a block each
	direct *baseline.DirectFile
	files  *baseline.Files
}

func newMediaLimits(diskDir, fileDir string, blockSize int) (l *mediaLimits, err error) {
	l = &mediaLimits{}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.close())
		}
	}()
	bytes := limitChunk * blockSize
	if l.buf, err = storage.AllocSystem(uint64(bytes)); err != nil {
		return nil, err
	}
	l.data, _ = l.buf.Bytes()
	for i := range limitChunk {
		b := l.data[i*blockSize : (i+1)*blockSize]
		fill(b, i)
		l.blocks = append(l.blocks, b)
	}
	if l.direct, err = baseline.CreateDirectFile(filepath.Join(diskDir, "limit-odirect"), uint64(bytes), blockSize); err != nil {
		return nil, err
	}
	if err = os.MkdirAll(fileDir, 0o700); err != nil {
		return nil, fmt.Errorf("file limit directory: %w", err)
	}
	if l.files, err = baseline.NewFiles(filepath.Join(fileDir, "limit-files"), limitChunk); err != nil {
		return nil, err
	}
	return l, nil
}

// measure moves total bytes in rounds of the chunk with io and returns
// the limit in GB/s.
func (l *mediaLimits) measure(name string, total int64, io func() (time.Duration, error)) (limit, error) {
	var el time.Duration
	moved := int64(0)
	for moved < total {
		d, err := io()
		if err != nil {
			return limit{}, fmt.Errorf("%s limit: %w", name, err)
		}
		el += d
		moved += int64(len(l.data))
	}
	return limit{name: name, gbs: gbPerS(moved, el)}, nil
}

func (l *mediaLimits) disk(write bool, total int64) (limit, error) {
	name := "O_DIRECT read"
	if write {
		name = "O_DIRECT write"
	}
	if !l.direct.Direct() {
		name += " (buffered: no O_DIRECT here)"
	}
	return l.measure(name, total, func() (time.Duration, error) { return l.direct.IO(l.data, write, gomaxprocs()) })
}

func (l *mediaLimits) file(write bool, total int64) (limit, error) {
	name := "file read"
	if write {
		name = "file write+fsync"
	}
	return l.measure(name, total, func() (time.Duration, error) { return l.files.IO(l.blocks, write, gomaxprocs()) })
}

func (l *mediaLimits) close() error {
	var errs []error
	if l.files != nil {
		errs = append(errs, l.files.Close())
	}
	if l.direct != nil {
		errs = append(errs, l.direct.Close())
	}
	if l.buf != nil {
		errs = append(errs, l.buf.Close())
	}
	return errors.Join(errs...)
}
