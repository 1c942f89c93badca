//go:build cgo

package main

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/stretchr/testify/require"
)

// TestQueryGPUsWithoutNVML: this machine's NVML, whatever it is, never
// crashes the report; a missing library is one line.
func TestQueryGPUsWithoutNVML(t *testing.T) {
	r := queryGPUs(nvml.New())
	if r.Available {
		t.Logf("NVML is here: %d GPUs", len(r.GPUs))
	} else {
		require.Contains(t, r.Error, "NVML")
	}

	missing := &mock.Interface{
		InitFunc:        func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		ErrorStringFunc: func(nvml.Return) string { return "not found" },
	}
	r = queryGPUs(missing)
	require.False(t, r.Available)
	require.Equal(t, "NVML is not available (libnvidia-ml.so.1 not found: no NVIDIA driver)", r.Error)
	require.Empty(t, r.GPUs)

	broken := &mock.Interface{
		InitFunc:        func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED },
		ErrorStringFunc: func(nvml.Return) string { return "driver not loaded" },
	}
	r = queryGPUs(broken)
	require.False(t, r.Available)
	require.Equal(t, "NVML init: driver not loaded (9)", r.Error)
}

// TestQueryGPUs: three GPUs through a mock of NVML; 0 and 1 are NVLink
// peers, 2 is reached through the system; GPU 2 has no NUMA node.
func TestQueryGPUs(t *testing.T) {
	var devs []*mock.Device
	for i := range 3 {
		d := &mock.Device{
			GetNameFunc:       func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS },
			GetUUIDFunc:       func() (string, nvml.Return) { return "GPU-" + string(rune('a'+i)), nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 141 << 30, Free: 140 << 30}, nvml.SUCCESS },
			GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
				var p nvml.PciInfo
				for j, c := range "00000000:1" + string(rune('A'+i)) + ":00.0" {
					p.BusId[j] = int8(c)
				}
				return p, nvml.SUCCESS
			},
			GetNumaNodeIdFunc: func() (int, nvml.Return) {
				if i == 2 {
					return 0, nvml.ERROR_NOT_SUPPORTED
				}
				return i, nvml.SUCCESS
			},
		}
		devs = append(devs, d)
	}
	for i, d := range devs {
		d.GetP2PStatusFunc = func(o nvml.Device, _ nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			if (i == 0 && o == devs[1]) || (i == 1 && o == devs[0]) {
				return nvml.P2P_STATUS_OK, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc:            func(nvml.Return) string { return "mock error" },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "580.1", nvml.SUCCESS },
		SystemGetNVMLVersionFunc:   func() (string, nvml.Return) { return "13.580.1", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 3, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devs[i], nvml.SUCCESS },
	}
	r := queryGPUs(lib)
	require.True(t, r.Available)
	require.Empty(t, r.Error)
	require.Equal(t, "580.1", r.DriverVersion)
	require.Equal(t, "13.580.1", r.NVMLVersion)
	require.Len(t, r.GPUs, 3)
	require.Equal(t, gpuInfo{Index: 0, Name: "NVIDIA H200", UUID: "GPU-a", MemoryTotal: 141 << 30, MemoryFree: 140 << 30,
		PCIBusID: "00000000:1A:00.0", NUMANode: 0}, r.GPUs[0])
	require.Equal(t, 1, r.GPUs[1].NUMANode)
	require.Equal(t, -1, r.GPUs[2].NUMANode, "no NUMA node from NVML, none in sysfs for a made-up bus id")
	require.Empty(t, r.GPUs[2].Error, "not supported is not an error")
	require.Equal(t, [][]string{{"X", "NV", "SYS"}, {"NV", "X", "SYS"}, {"SYS", "SYS", "X"}}, r.Topology)
	require.Len(t, lib.ShutdownCalls(), 1)

	// A device whose handle fails is reported, and the rest go on.
	lib.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 1 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return devs[i], nvml.SUCCESS
	}
	r = queryGPUs(lib)
	require.Len(t, r.GPUs, 3)
	require.Contains(t, r.GPUs[1].Error, "GPU 1: handle: mock error")
	require.Equal(t, "NVIDIA H200", r.GPUs[2].Name)
	require.Equal(t, "", r.Topology[0][1])
	require.Equal(t, "SYS", r.Topology[0][2])

	var text strings.Builder
	printInfo(&text, infoReport{NVML: r, Transports: transports()})
	require.Contains(t, text.String(), "GPU 0: NVIDIA H200, memory 141.0 GiB total, 140.0 GiB free, PCI 00000000:1A:00.0, NUMA node 0")
	require.Contains(t, text.String(), "GPU2  SYS         X", "GPU 1 is lost: no topology to it")
}
