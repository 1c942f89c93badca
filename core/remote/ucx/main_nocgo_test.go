//go:build !cgo

package ucx

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestUnavailableWithoutCgo(t *testing.T) {
	require.ErrorContains(t, Available(), "without cgo")
	_, err := New(Config{})
	require.Error(t, err)
}
