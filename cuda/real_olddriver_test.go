//go:build cgo

package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// oldDriverEnv marks the child process of TestRealOnATooOldDriver.
const oldDriverEnv = "KVBM_TEST_OLD_DRIVER_CHILD"

// A libcuda.so.1 too old for the symbols kvbm needs (here: one that has
// cuDriverGetVersion, saying CUDA 11.4, and nothing else) fails the open
// with one error naming the first symbol missing and the driver's version,
// never a crash. The driver is a library the test builds; the open runs in
// a child process whose library path finds it first.
func TestRealOnATooOldDriver(t *testing.T) {
	if os.Getenv(oldDriverEnv) == "1" {
		_, err := OpenReal()
		fmt.Printf("open: %v\n", err)
		return
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler to build the old driver with")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "old.c")
	require.NoError(t, os.WriteFile(src, []byte("int cuDriverGetVersion(int *v) { *v = 11040; return 0; }\n"), 0o600))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), src).CombinedOutput()
	require.NoError(t, err, string(out))
	cmd := exec.Command(os.Args[0], "-test.run=^TestRealOnATooOldDriver$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), oldDriverEnv+"=1", "LD_LIBRARY_PATH="+dir)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "the child must not crash: %s", out)
	require.Contains(t, string(out), "cannot load libcuda.so.1: libcuda.so.1 has no symbol cuGetErrorName "+
		"(the installed driver is CUDA 11.4, older than that symbol: kvbm needs a newer driver)")
}
