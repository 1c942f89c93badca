package version

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMatchesHeader keeps the constants in step with include/kvbm.h, the
// contract.
func TestMatchesHeader(t *testing.T) {
	h, err := os.ReadFile("../../include/kvbm.h")
	require.NoError(t, err)
	for name, want := range map[string]int{
		"KVBM_VERSION_MAJOR": Major, "KVBM_VERSION_MINOR": Minor, "KVBM_VERSION_PATCH": Patch, "KVBM_ABI_VERSION": ABI,
	} {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)$`).FindSubmatch(h)
		require.NotNil(t, m, "%s is not defined in kvbm.h", name)
		got, err := strconv.Atoi(string(m[1]))
		require.NoError(t, err)
		require.Equal(t, got, want, "%s in kvbm.h", name)
	}
}
