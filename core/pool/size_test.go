package pool

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestBlockIsOneCacheLinePair(t *testing.T) {
	require.EqualValues(t, 128, unsafe.Sizeof(block{}))
	require.Less(t, unsafe.Offsetof(block{}.key)+34, uintptr(64), "state and a 32-byte key share a line")
}
