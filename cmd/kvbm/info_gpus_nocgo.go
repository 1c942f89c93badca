//go:build !cgo

package main

// systemGPUs without cgo: go-nvml needs it.
func systemGPUs() gpuReport {
	return gpuReport{GPUs: []gpuInfo{}, Error: "NVML is not available (this kvbm was built without cgo)"}
}
