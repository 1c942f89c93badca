package cuda

import (
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIPCImporterProcess is the other process of TestIPCAcrossProcesses
// (it runs only there): it opens the handle, checks the bytes it reads
// through the device, writes its own, and prints what happened.
func TestIPCImporterProcess(t *testing.T) {
	arg := os.Getenv("KVBM_TEST_IPC_HANDLE")
	if arg == "" {
		t.Skip("a helper process of TestIPCAcrossProcesses")
	}
	raw, err := hex.DecodeString(arg)
	require.NoError(t, err)
	var h IPCHandle
	copy(h[:], raw)
	e := newEmu(t, 1)
	p, size, err := e.IPCOpen(0, h)
	if err != nil {
		fmt.Printf("open: %v\n", err)
		return
	}
	again, size2, err := e.IPCOpen(0, h)
	require.NoError(t, err)
	require.Equal(t, p, again, "a handle open already gives the same address")
	require.Equal(t, size, size2)
	require.NoError(t, e.IPCClose(again))
	fmt.Printf("size %d\n", size)
	host := hostAlloc(t, e, 4096)
	s, err := e.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: host, Src: p + 4096, Size: 4096}, s))
	require.NoError(t, e.StreamSynchronize(s))
	fmt.Printf("read %x\n", view(host, 4)[:4])
	copy(view(host, 4096), strings.Repeat("\xC5", 4096))
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: p + 8192, Src: host, Size: 4096}, s))
	require.NoError(t, e.StreamSynchronize(s))
	require.NoError(t, e.StreamDestroy(s))
	require.NoError(t, e.IPCClose(p))
	requireCode(t, e.IPCClose(p), ErrCodeInvalidValue)
	fmt.Println("wrote")
}

// An allocation exported by this process is opened by another one, which
// reads and writes the same bytes through its own device; a freed one, a
// registered range, or a handle of this very process cannot be opened.
func TestIPCAcrossProcesses(t *testing.T) {
	e := newEmu(t, 1)
	const size = 3 * 4096
	p, err := e.MemAlloc(0, size)
	require.NoError(t, err)
	mem := view(p, size)
	copy(mem[4096:], "\xAB\xCD\xEF\x01")
	h, base, n, err := e.IPCExport(p+4096, 100)
	require.NoError(t, err)
	require.Equal(t, p, base, "the allocation's base, whatever range inside it was named")
	require.Equal(t, uint64(size), n)

	_, _, err = e.IPCOpen(0, h)
	requireCode(t, err, ErrCodeInvalidContext, "this process")
	_, _, _, err = e.IPCExport(p, size+1)
	requireCode(t, err, ErrCodeInvalidValue)
	reg := hostAlloc(t, e, 4096) // pinned host memory, then adopted as device memory
	require.NoError(t, e.RegisterDeviceRange(0, reg, 4096))
	_, _, _, err = e.IPCExport(reg, 4096)
	requireCode(t, err, ErrCodeInvalidValue, "registered")
	_, _, err = e.IPCOpen(0, IPCHandle{1, 2, 3})
	requireCode(t, err, ErrCodeInvalidValue)

	run := func(h IPCHandle) string {
		self, err := os.Executable()
		require.NoError(t, err)
		cmd := exec.Command(self, "-test.run", "^TestIPCImporterProcess$", "-test.v")
		cmd.Env = append(os.Environ(), "KVBM_TEST_IPC_HANDLE="+hex.EncodeToString(h[:]))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	out := run(h)
	require.Contains(t, out, fmt.Sprintf("size %d", size))
	require.Contains(t, out, "read abcdef01")
	require.Contains(t, out, "wrote")
	require.Equal(t, strings.Repeat("\xC5", 4096), string(mem[8192:]), "the other process's write is here")

	require.NoError(t, e.MemFree(p))
	require.Contains(t, run(h), "freed", "a freed allocation cannot be opened")
}
