package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHostNUMANodes(t *testing.T) {
	root := t.TempDir()
	node := func(n int, cpus, meminfo string) {
		d := filepath.Join(root, "devices/system/node", "node"+string(rune('0'+n)))
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "cpulist"), []byte(cpus+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(d, "meminfo"), []byte(meminfo), 0o644))
	}
	node(1, "", "Node 1 MemTotal:       1024 kB\nNode 1 MemFree:  12 kB\n") // memory only (a Grace GPU's HBM)
	node(0, "0-31,64-95", "Node 0 MemTotal:       2048 kB\n")
	nodes, err := hostNUMANodes(root)
	require.NoError(t, err)
	require.Equal(t, []numaNode{{ID: 0, CPUs: "0-31,64-95", MemoryTotal: 2 << 20}, {ID: 1, MemoryTotal: 1 << 20}}, nodes)

	_, err = hostNUMANodes(filepath.Join(root, "none"))
	require.ErrorContains(t, err, "no NUMA nodes under")
}

func TestUnescapeMount(t *testing.T) {
	require.Equal(t, "/mnt/my disk", unescapeMount(`/mnt/my\040disk`))
	require.Equal(t, "/plain", unescapeMount("/plain"))
	require.Equal(t, `/odd\9`, unescapeMount(`/odd\9`))
}

func TestProbeDisk(t *testing.T) {
	dir := t.TempDir()
	r := probeDisk(dir)
	require.Empty(t, r.Error)
	require.NotEmpty(t, r.Filesystem)
	require.NotEmpty(t, r.MountPoint)
	require.Positive(t, r.FreeBytes)
	if !r.Direct {
		require.NotEmpty(t, r.DirectError, "why O_DIRECT does not work is said")
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "the O_DIRECT probe leaves nothing behind")
}
