package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// nicInfo is one network device backed by a PCI function: an Ethernet
// interface or an InfiniBand/RoCE HCA (what RDMA would use).
type nicInfo struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"` // "net" or "infiniband"
	PCIBusID string `json:"pci_bus_id"`
	NUMANode int    `json:"numa_node"` // -1 when unknown
}

// hostNICs lists <sysfs>/class/net and <sysfs>/class/infiniband entries
// that have a PCI device (virtual interfaces have none).
func hostNICs(sysfs string) []nicInfo {
	var out []nicInfo
	for _, kind := range []string{"infiniband", "net"} {
		dirs, _ := filepath.Glob(filepath.Join(sysfs, "class", kind, "*"))
		for _, d := range dirs {
			dev, err := filepath.EvalSymlinks(filepath.Join(d, "device"))
			if err != nil {
				continue
			}
			bus := filepath.Base(dev)
			if _, err := os.Stat(filepath.Join(dev, "vendor")); err != nil || strings.Count(bus, ":") != 2 {
				continue // not a PCI function
			}
			out = append(out, nicInfo{Name: filepath.Base(d), Kind: kind, PCIBusID: bus, NUMANode: numaOf(dev)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Kind < out[j].Kind || out[i].Kind == out[j].Kind && out[i].Name < out[j].Name
	})
	return out
}

func numaOf(dev string) int {
	b, err := os.ReadFile(filepath.Join(dev, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// pciPath is a PCI function's place in the device tree: the components of
// its sysfs path below devices/, root complex first; nil when unknown.
// busID may be NVML's form (00000000:3B:00.0) or sysfs's (0000:3b:00.0).
func pciPath(sysfs, busID string) []string {
	id := strings.ToLower(busID)
	if len(id) > 12 {
		id = id[len(id)-12:] // NVML's domain has 8 digits, sysfs's 4
	}
	p, err := filepath.EvalSymlinks(filepath.Join(sysfs, "bus/pci/devices", id))
	if err != nil {
		return nil
	}
	root, err := filepath.EvalSymlinks(filepath.Join(sysfs, "devices"))
	if err != nil {
		return nil
	}
	rel, err := filepath.Rel(root, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil
	}
	return strings.Split(rel, string(filepath.Separator))
}

// pciLevel spells how two PCI functions reach each other as nvidia-smi
// topo -m does: PIX (one bridge between them), PXB (several, below the
// host bridge), PHB (through the host bridge), NODE (across host bridges
// of one NUMA node), SYS (across NUMA nodes); "" when unknown.
func pciLevel(a, b []string, numaA, numaB int) string {
	if len(a) == 0 || len(b) == 0 {
		return ""
	}
	if a[0] != b[0] {
		if numaA >= 0 && numaA == numaB {
			return "NODE"
		}
		return "SYS"
	}
	common := 0
	for common < min(len(a), len(b)) && a[common] == b[common] {
		common++
	}
	switch {
	case common <= 1:
		return "PHB"
	case len(a)-common+len(b)-common <= 2:
		return "PIX"
	}
	return "PXB"
}

// gpuNICTopology is the GPU×NIC matrix: how each GPU reaches each NIC.
func gpuNICTopology(sysfs string, gpus []gpuInfo, nics []nicInfo) [][]string {
	if len(gpus) == 0 || len(nics) == 0 {
		return nil
	}
	m := make([][]string, len(gpus))
	for i, g := range gpus {
		gp := pciPath(sysfs, g.PCIBusID)
		m[i] = make([]string, len(nics))
		for j, n := range nics {
			m[i][j] = pciLevel(gp, pciPath(sysfs, n.PCIBusID), g.NUMANode, n.NUMANode)
		}
	}
	return m
}

// printNICs prints the NICs and, under NVML, the GPU↔NIC matrix.
func printNICs(w interface{ Write([]byte) (int, error) }, r infoReport) {
	if len(r.NICs) == 0 {
		fmt.Fprintln(w, "NICs: none backed by a PCI device")
		return
	}
	fmt.Fprintf(w, "NICs: %d\n", len(r.NICs))
	for _, n := range r.NICs {
		numa := "unknown"
		if n.NUMANode >= 0 {
			numa = fmt.Sprint(n.NUMANode)
		}
		fmt.Fprintf(w, "  %s (%s): PCI %s, NUMA node %s\n", n.Name, n.Kind, n.PCIBusID, numa)
	}
	if len(r.GPUNICTopology) == 0 {
		return
	}
	fmt.Fprintln(w, "  GPU↔NIC topology (nvidia-smi topo -m):")
	head := []string{fmt.Sprintf("%-6s", "")}
	for _, n := range r.NICs {
		head = append(head, fmt.Sprintf("%-8s", n.Name))
	}
	fmt.Fprintf(w, "    %s\n", strings.TrimRight(strings.Join(head, ""), " "))
	for i, row := range r.GPUNICTopology {
		cells := []string{fmt.Sprintf("%-6s", fmt.Sprintf("GPU%d", i))}
		for _, c := range row {
			cells = append(cells, fmt.Sprintf("%-8s", c))
		}
		fmt.Fprintf(w, "    %s\n", strings.TrimRight(strings.Join(cells, ""), " "))
	}
}
