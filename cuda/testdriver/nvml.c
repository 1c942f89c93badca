// The NVML calls kvbm makes (cuda/real_abi.h), for the CUDA double's
// devices: libnvidia-ml.so.1 of the test driver. Types as nvml.h has them
// (go-nvml's copy, checked with the rest by scripts/cuda-double.sh's
// build).
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int initialized;
// nvml.h wraps the handle in a struct (as go-nvml's copy has it).
static struct nvmlDevice_st {
	int index;
} devices[8];

static unsigned count(void) {
	const char *e = getenv("KVBM_CUDA_DOUBLE_DEVICES");
	int n = e ? atoi(e) : 1;
	return n < 0 || n > 8 ? 1 : (unsigned)n;
}

nvmlReturn_t nvmlInit_v2(void) {
	initialized = 1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!n)
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = count();
	return NVML_SUCCESS;
}

// The CUDA double's bus ids: 0000:E0:00.0 for device 0, E1 for 1, ...;
// NVML spells the domain with 8 digits, and accepts either.
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
	unsigned domain, b, dev, fn;
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!bus || !d || sscanf(bus, "%x:%x:%x.%x", &domain, &b, &dev, &fn) != 4)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (domain != 0 || b < 0xE0 || b - 0xE0 >= count() || dev || fn)
		return NVML_ERROR_NOT_FOUND;
	devices[b - 0xE0].index = (int)(b - 0xE0);
	d->handle = &devices[b - 0xE0];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!d.handle || !m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = 16ULL << 30;
	m->used = 0;
	m->free = m->total;
	return NVML_SUCCESS;
}

// Node 0: the one every machine has.
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node) {
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (!d.handle || !node)
		return NVML_ERROR_INVALID_ARGUMENT;
	*node = 0;
	return NVML_SUCCESS;
}
