package main

// gpuReport is what NVML says about the machine's GPUs. NVML is opened
// with dlopen by go-nvml at Init: where libnvidia-ml.so.1 is missing Init
// returns ERROR_LIBRARY_NOT_FOUND and Available is false.
type gpuReport struct {
	Available     bool      `json:"available"`
	Error         string    `json:"error,omitempty"` // why NVML is not available, or what failed
	DriverVersion string    `json:"driver_version,omitempty"`
	NVMLVersion   string    `json:"nvml_version,omitempty"`
	GPUs          []gpuInfo `json:"gpus"`
	// Topology[i][j] is how GPU i reaches GPU j, as nvidia-smi topo -m
	// spells it: X (itself), NV (NVLink peer-to-peer), PIX, PXB, PHB, NODE,
	// SYS; "" when NVML does not say.
	Topology [][]string `json:"topology,omitempty"`
}

// gpuInfo is one GPU.
type gpuInfo struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	UUID        string `json:"uuid,omitempty"`
	MemoryTotal uint64 `json:"memory_total_bytes"`
	MemoryFree  uint64 `json:"memory_free_bytes"`
	PCIBusID    string `json:"pci_bus_id"`
	NUMANode    int    `json:"numa_node"` // -1 when unknown
	Error       string `json:"error,omitempty"`
}
