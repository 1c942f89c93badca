// Fragment copy kernel of kvbm's CUDA driver (cuda/real_kernel.go).
//
// One launch copies n fragments described by three device-side tables:
// src[i], dst[i] and size[i] (bytes). Blocks take fragments in turn
// (grid-stride over fragments); the threads of a block copy one fragment
// with the widest word that the alignment of its source and destination
// allows: 16, 8 or 4 bytes, then any tail bytes one at a time. Fragments
// must not overlap one another's destinations (the Go side checks).
//
// Pointers may be device memory or pinned host memory mapped into the
// device's address space (unified addressing), so one kernel serves
// H2D, D2H and D2D.
//
// Built to PTX (`make ptx`), committed as copy.ptx,
// embedded in the Go package and loaded with cuModuleLoadData. No headers:
// it must build with nvcc or NVRTC alone.

typedef unsigned long long u64;

template <typename W>
__device__ __forceinline__ void copy_words(const char *__restrict__ src, char *__restrict__ dst, u64 n) {
	const W *s = reinterpret_cast<const W *>(src);
	W *d = reinterpret_cast<W *>(dst);
	u64 words = n / sizeof(W);
	for (u64 i = threadIdx.x; i < words; i += blockDim.x) {
		d[i] = s[i];
	}
	for (u64 i = words * sizeof(W) + threadIdx.x; i < n; i += blockDim.x) {
		dst[i] = src[i];
	}
}

extern "C" __global__ void kvbm_copy_fragments(const u64 *__restrict__ src, const u64 *__restrict__ dst,
                                               const u64 *__restrict__ size, unsigned int n) {
	for (unsigned int f = blockIdx.x; f < n; f += gridDim.x) {
		const u64 s = src[f], d = dst[f], len = size[f];
		const char *sp = reinterpret_cast<const char *>(s);
		char *dp = reinterpret_cast<char *>(d);
		const u64 align = s | d;
		if ((align & 15) == 0) {
			copy_words<uint4>(sp, dp, len);
		} else if ((align & 7) == 0) {
			copy_words<u64>(sp, dp, len);
		} else if ((align & 3) == 0) {
			copy_words<unsigned int>(sp, dp, len);
		} else {
			copy_words<unsigned char>(sp, dp, len);
		}
	}
}
