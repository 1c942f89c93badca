package object

import (
	"fmt"
	"math"
)

// BlockIO reads and writes whole blocks of a resolved layout as bytes. It is
// the "resolved layout" the …WithLayout calls of a Store take; the transfer
// manager implements it over each tier's memory, MemoryBlocks over a byte
// slice.
//
// A Store calls ReadBlock and WriteBlock from several goroutines at once,
// never on the same destination block twice in one batch.
type BlockIO interface {
	// BlockSize is the number of bytes of one block.
	BlockSize() int
	// NumBlocks is the number of blocks; valid ids are 0 to NumBlocks()-1.
	NumBlocks() int
	// ReadBlock copies block id into dst; len(dst) == BlockSize().
	ReadBlock(id int, dst []byte) error
	// WriteBlock copies src into block id; len(src) == BlockSize().
	WriteBlock(id int, src []byte) error
}

// MemoryBlocks is a BlockIO over one byte slice holding n blocks end to end.
// Calls on distinct blocks are safe to make concurrently.
type MemoryBlocks struct {
	blockSize int
	numBlocks int
	buf       []byte
}

var _ BlockIO = (*MemoryBlocks)(nil)

// NewMemoryBlocks allocates numBlocks zeroed blocks of blockSize bytes.
func NewMemoryBlocks(numBlocks, blockSize int) (*MemoryBlocks, error) {
	if numBlocks < 0 {
		return nil, fmt.Errorf("memory blocks: invalid block count %d", numBlocks)
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("memory blocks: invalid block size %d", blockSize)
	}
	if numBlocks > 0 && blockSize > math.MaxInt/numBlocks {
		return nil, fmt.Errorf("memory blocks: %d blocks of %d bytes overflow", numBlocks, blockSize)
	}
	return &MemoryBlocks{
		blockSize: blockSize,
		numBlocks: numBlocks,
		buf:       make([]byte, numBlocks*blockSize),
	}, nil
}

// BlockSize returns the size of one block in bytes.
func (m *MemoryBlocks) BlockSize() int { return m.blockSize }

// NumBlocks returns the number of blocks.
func (m *MemoryBlocks) NumBlocks() int { return m.numBlocks }

// Block returns block id as a view into the backing slice (not a copy), or
// nil when id is out of range.
func (m *MemoryBlocks) Block(id int) []byte {
	if id < 0 || id >= m.numBlocks {
		return nil
	}
	return m.buf[id*m.blockSize : (id+1)*m.blockSize : (id+1)*m.blockSize]
}

// Bytes returns the whole backing slice, all blocks end to end.
func (m *MemoryBlocks) Bytes() []byte { return m.buf }

// ReadBlock copies block id into dst.
func (m *MemoryBlocks) ReadBlock(id int, dst []byte) error {
	b, err := m.checked(id, len(dst))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}

// WriteBlock copies src into block id.
func (m *MemoryBlocks) WriteBlock(id int, src []byte) error {
	b, err := m.checked(id, len(src))
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}

func (m *MemoryBlocks) checked(id, n int) ([]byte, error) {
	if id < 0 || id >= m.numBlocks {
		return nil, fmt.Errorf("block id %d out of range [0, %d)", id, m.numBlocks)
	}
	if n != m.blockSize {
		return nil, fmt.Errorf("block %d: buffer is %d bytes, block size is %d", id, n, m.blockSize)
	}
	return m.Block(id), nil
}
