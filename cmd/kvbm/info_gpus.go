//go:build cgo

package main

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kvbm/kvbm/cuda"
)

// systemGPUs asks this machine's NVML (libnvidia-ml.so.1, opened by
// go-nvml with dlopen).
func systemGPUs() gpuReport { return queryGPUs(nvml.New()) }

// queryGPUs asks lib (nvml.New() but for tests) about every GPU. It never
// fails: what NVML cannot answer is left empty and named in Error.
func queryGPUs(lib nvml.Interface) gpuReport {
	r := gpuReport{GPUs: []gpuInfo{}}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			r.Error = "NVML is not available (libnvidia-ml.so.1 not found: no NVIDIA driver)"
		} else {
			r.Error = fmt.Sprintf("NVML init: %s", nvmlError(lib, ret))
		}
		return r
	}
	defer lib.Shutdown()
	r.Available = true
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		r.DriverVersion = v
	}
	if v, ret := lib.SystemGetNVMLVersion(); ret == nvml.SUCCESS {
		r.NVMLVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		r.Error = fmt.Sprintf("NVML device count: %s", nvmlError(lib, ret))
		return r
	}
	devs := make([]nvml.Device, n)
	for i := range n {
		g := gpuInfo{Index: i, NUMANode: -1}
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.Error = fmt.Sprintf("GPU %d: handle: %s", i, nvmlError(lib, ret))
			r.GPUs = append(r.GPUs, g)
			continue
		}
		devs[i] = d
		var errs []string
		note := func(what string, ret nvml.Return) bool {
			if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
				errs = append(errs, fmt.Sprintf("%s: %s", what, nvmlError(lib, ret)))
			}
			return ret == nvml.SUCCESS
		}
		if name, ret := d.GetName(); note("name", ret) {
			g.Name = name
		}
		if uuid, ret := d.GetUUID(); note("uuid", ret) {
			g.UUID = uuid
		}
		if mem, ret := d.GetMemoryInfo(); note("memory", ret) {
			g.MemoryTotal, g.MemoryFree = mem.Total, mem.Free
		}
		if pci, ret := d.GetPciInfo(); note("pci info", ret) {
			g.PCIBusID = cString(pci.BusId[:])
		}
		if node, ret := d.GetNumaNodeId(); note("numa node", ret) {
			g.NUMANode = node
		} else if g.PCIBusID != "" {
			g.NUMANode = cuda.PCINUMANode(g.PCIBusID)
		}
		if len(errs) > 0 {
			g.Error = strings.Join(errs, "; ")
		}
		r.GPUs = append(r.GPUs, g)
	}
	if n > 1 {
		r.Topology = topology(devs)
	}
	return r
}

// topology is the GPU↔GPU matrix of nvidia-smi topo -m: NV where the two
// GPUs talk peer-to-peer over NVLink, else the closest common ancestor on
// the PCIe tree.
func topology(devs []nvml.Device) [][]string {
	m := make([][]string, len(devs))
	for i, a := range devs {
		m[i] = make([]string, len(devs))
		for j, b := range devs {
			switch {
			case i == j:
				m[i][j] = "X"
			case a == nil || b == nil:
			default:
				if st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
					m[i][j] = "NV"
				} else if lvl, ret := a.GetTopologyCommonAncestor(b); ret == nvml.SUCCESS {
					m[i][j] = topologyLevel(lvl)
				}
			}
		}
	}
	return m
}

// topologyLevel spells a common ancestor as nvidia-smi topo -m does.
func topologyLevel(l nvml.GpuTopologyLevel) string {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return "X"
	case nvml.TOPOLOGY_SINGLE:
		return "PIX"
	case nvml.TOPOLOGY_MULTIPLE:
		return "PXB"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "PHB"
	case nvml.TOPOLOGY_NODE:
		return "NODE"
	case nvml.TOPOLOGY_SYSTEM:
		return "SYS"
	}
	return fmt.Sprintf("level %d", l)
}

// nvmlError is NVML's string for ret, with its number.
func nvmlError(lib nvml.Interface, ret nvml.Return) string {
	return fmt.Sprintf("%s (%d)", lib.ErrorString(ret), int32(ret))
}

// cString is a NUL-terminated C char array as a string.
func cString[T int8 | uint8](b []T) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}
