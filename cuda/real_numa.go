package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// NUMA placement of the real driver's pinned host memory, from sysfs (no
// libnuma). root is "/sys" but for tests.

const sysfsRoot = "/sys"

// deviceNUMANode picks the NUMA node whose memory is nearest the device at
// PCI busID: the PCI device's own numa_node in sysfs, else nvml's answer
// (nvml may be nil), and never a node without CPUs. On Grace systems NVML
// reports the GPU's own HBM node, which has no CPUs, so sysfs comes first.
// -1 when unknown.
func deviceNUMANode(root, busID string, nvml func() int) int {
	if n := pciNUMANode(root, busID); n >= 0 && nodeHasCPUs(root, n) {
		return n
	}
	if nvml != nil {
		if n := nvml(); n >= 0 && nodeHasCPUs(root, n) {
			return n
		}
	}
	return -1
}

// pciNUMANode reads <root>/bus/pci/devices/<bus id>/numa_node; -1 when
// unknown. cuDeviceGetPCIBusId gives "0000:3B:00.0"; sysfs spells it in
// lower case.
func pciNUMANode(root, busID string) int {
	if busID == "" || strings.ContainsAny(busID, "/\x00") {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(root, "bus/pci/devices", strings.ToLower(busID), "numa_node"))
	if err != nil {
		return -1
	}
	var n int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &n); err != nil || n < 0 {
		return -1
	}
	return n
}

// nodeHasCPUs reports whether <root>/devices/system/node/node<n>/cpulist
// names any CPU.
func nodeHasCPUs(root string, node int) bool {
	b, err := os.ReadFile(filepath.Join(root, fmt.Sprintf("devices/system/node/node%d/cpulist", node)))
	return err == nil && strings.TrimSpace(string(b)) != ""
}

// numaNodes is the number of NUMA nodes under root (1 when unknown).
func numaNodes(root string) int {
	n := 0
	for {
		if _, err := os.Stat(filepath.Join(root, fmt.Sprintf("devices/system/node/node%d", n))); err != nil {
			break
		}
		n++
	}
	return max(n, 1)
}

// PCINUMANode is the NUMA node sysfs gives the PCI device at busID (as
// cuDeviceGetPCIBusId or NVML spell it, e.g. "0000:3B:00.0"); -1 when
// unknown.
func PCINUMANode(busID string) int { return pciNUMANode(sysfsRoot, normalBusID(busID)) }

// normalBusID is busID with a 4-digit PCI domain, as sysfs names devices:
// NVML's bus ids carry an 8-digit domain ("00000000:3B:00.0").
func normalBusID(busID string) string {
	if dom, rest, ok := strings.Cut(busID, ":"); ok && len(dom) == 8 && strings.HasPrefix(dom, "0000") {
		return dom[4:] + ":" + rest
	}
	return busID
}
