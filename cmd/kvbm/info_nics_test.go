package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakePCI builds a sysfs tree: PCI functions at the given paths below
// devices/ (with vendor and numa_node files), bus/pci/devices links to
// them, and class entries for NICs.
func fakePCI(t *testing.T, funcs map[string]string, numa map[string]int, nics map[string]string) string {
	t.Helper()
	sys := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(sys, "bus/pci/devices"), 0o755))
	for id, path := range funcs {
		dir := filepath.Join(sys, "devices", path)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vendor"), []byte("0x15b3\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strings.TrimSpace(string(rune('0'+numa[id])))+"\n"), 0o644))
		require.NoError(t, os.Symlink(dir, filepath.Join(sys, "bus/pci/devices", id)))
	}
	for name, id := range nics {
		kind, name, _ := strings.Cut(name, "/")
		dir := filepath.Join(sys, "class", kind, name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.Symlink(filepath.Join(sys, "bus/pci/devices", id), filepath.Join(dir, "device")))
	}
	// A virtual interface: no PCI device.
	require.NoError(t, os.MkdirAll(filepath.Join(sys, "class/net/lo"), 0o755))
	return sys
}

func TestGPUToNICTopologyFollowsThePCITree(t *testing.T) {
	sys := fakePCI(t, map[string]string{
		"0000:04:00.0": "pci0000:00/0000:00:02.0/0000:03:00.0/0000:04:00.0", // GPU 0, behind a switch
		"0000:04:01.0": "pci0000:00/0000:00:02.0/0000:03:00.0/0000:04:01.0", // HCA on the same switch
		"0000:07:00.0": "pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0",
		"0000:09:00.0": "pci0000:00/0000:00:1c.0/0000:09:00.0", // NIC on another root port
		"0000:41:00.0": "pci0000:40/0000:40:01.0/0000:41:00.0", // NIC on the other host bridge, node 0
		"0000:81:00.0": "pci0000:80/0000:80:01.0/0000:81:00.0", // NIC on node 1
	}, map[string]int{"0000:81:00.0": 1}, map[string]string{
		"infiniband/mlx5_0": "0000:04:01.0", "infiniband/mlx5_1": "0000:07:00.0",
		"net/eth0": "0000:09:00.0", "net/eth1": "0000:41:00.0", "net/eth2": "0000:81:00.0",
	})
	nics := hostNICs(sys)
	names := make([]string, len(nics))
	for i, n := range nics {
		names[i] = n.Kind + "/" + n.Name
	}
	require.Equal(t, []string{"infiniband/mlx5_0", "infiniband/mlx5_1", "net/eth0", "net/eth1", "net/eth2"}, names)
	require.Equal(t, 1, nics[4].NUMANode)
	gpus := []gpuInfo{{Index: 0, PCIBusID: "00000000:04:00.0", NUMANode: 0}, {Index: 1, PCIBusID: "00000000:AA:00.0", NUMANode: 0}}
	m := gpuNICTopology(sys, gpus, nics)
	require.Equal(t, []string{"PIX", "PXB", "PHB", "NODE", "SYS"}, m[0])
	require.Equal(t, []string{"", "", "", "", ""}, m[1], "a GPU sysfs does not know: unknown, not a guess")

	var text strings.Builder
	printNICs(&text, infoReport{NICs: nics, GPUNICTopology: m})
	require.Contains(t, text.String(), "mlx5_0 (infiniband): PCI 0000:04:01.0, NUMA node 0")
	require.Contains(t, text.String(), "GPU0  PIX     PXB     PHB     NODE    SYS")
}
