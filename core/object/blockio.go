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

// HostBlockIO is a BlockIO that can lend a block's memory to a store, so
// that a get reads an object's payload straight into the block instead of
// into a buffer that WriteBlock then copies.
type HostBlockIO interface {
	BlockIO
	// HostBlock returns block id's bytes as host memory the caller may
	// read and write in place: spans, in the order ReadBlock and
	// WriteBlock lay the block out, whose lengths sum to BlockSize().
	// The spans are valid until release is called, which the caller must
	// do exactly once. ok is false (and release nil) when the block is not
	// host-addressable, device or disk memory: the caller then goes
	// through ReadBlock or WriteBlock.
	HostBlock(id int) (spans [][]byte, release func(), ok bool, err error)
}

// MemoryBlocks is a BlockIO over one byte slice holding n blocks end to end.
// Calls on distinct blocks are safe to make concurrently.
type MemoryBlocks struct {
	blockSize int
	numBlocks int
	buf       []byte
}

var _ HostBlockIO = (*MemoryBlocks)(nil)

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

// HostBlock lends block id's bytes: one span, a view of the backing slice.
func (m *MemoryBlocks) HostBlock(id int) ([][]byte, func(), bool, error) {
	b, err := m.checked(id, m.blockSize)
	if err != nil {
		return nil, nil, false, err
	}
	return [][]byte{b}, func() {}, true, nil
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
