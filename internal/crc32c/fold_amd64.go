//go:build amd64 && cgo

package crc32c

/*
#cgo CFLAGS: -O2
#cgo noescape kvbm_crc32c_fold
#cgo nocallback kvbm_crc32c_fold
#include <stdint.h>
#include <stddef.h>
#include <immintrin.h>

// Folding, in the reflected bit order of CRC32C: a 128-bit lane holds 16
// message bytes, its first 8 bytes the higher-degree half. Moving a lane F
// bits further down the message multiplies each half by x^(F+64) or x^F
// mod P; carry-less multiplication of reflected operands adds one factor
// x, which the constants (from Go, see constants) take away. The product
// of a 64-bit half and a degree-31 constant fits one lane, so a lane
// folded and xored with the lane F bits later is congruent to both mod P.
// What is left at the end, one lane standing for the whole message, has
// the message's CRC, which the crc32 instruction gives from its 16 bytes.

#define KVBM_FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))

KVBM_FOLD_TARGET static inline __m128i kvbm_fold16(__m128i s, __m128i k, __m128i next) {
	return _mm_ternarylogic_epi64(_mm_clmulepi64_si128(s, k, 0x00), _mm_clmulepi64_si128(s, k, 0x11), next, 0x96);
}

// kvbm_crc32c_fold returns the CRC32C, without the final inversion, of n
// bytes at p (n >= 256) starting from the running value crc (already
// inverted). k holds the 256-byte and the 16-byte fold constants.
KVBM_FOLD_TARGET static uint32_t kvbm_crc32c_fold(uint32_t crc, const uint8_t *p, size_t n, const uint64_t *k) {
	const __m512i k256 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)k[1], (long long)k[0]));
	const __m128i k16 = _mm_set_epi64x((long long)k[3], (long long)k[2]);
	// The running value enters as the first four bytes xored with it.
	__m512i a0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)p), _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)crc), 0));
	__m512i a1 = _mm512_loadu_si512((const void *)(p + 64));
	__m512i a2 = _mm512_loadu_si512((const void *)(p + 128));
	__m512i a3 = _mm512_loadu_si512((const void *)(p + 192));
	p += 256;
	n -= 256;
	for (; n >= 256; p += 256, n -= 256) {
		a0 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a0, k256, 0x00), _mm512_clmulepi64_epi128(a0, k256, 0x11), _mm512_loadu_si512((const void *)p), 0x96);
		a1 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a1, k256, 0x00), _mm512_clmulepi64_epi128(a1, k256, 0x11), _mm512_loadu_si512((const void *)(p + 64)), 0x96);
		a2 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a2, k256, 0x00), _mm512_clmulepi64_epi128(a2, k256, 0x11), _mm512_loadu_si512((const void *)(p + 128)), 0x96);
		a3 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a3, k256, 0x00), _mm512_clmulepi64_epi128(a3, k256, 0x11), _mm512_loadu_si512((const void *)(p + 192)), 0x96);
	}
	// The sixteen lanes of the last 256 bytes, in message order, folded
	// into one, then the whole 16-byte blocks that remain.
	__m512i acc[4] = {a0, a1, a2, a3};
	__m128i lanes[16];
	for (int i = 0; i < 4; i++) {
		lanes[4 * i + 0] = _mm512_extracti32x4_epi32(acc[i], 0);
		lanes[4 * i + 1] = _mm512_extracti32x4_epi32(acc[i], 1);
		lanes[4 * i + 2] = _mm512_extracti32x4_epi32(acc[i], 2);
		lanes[4 * i + 3] = _mm512_extracti32x4_epi32(acc[i], 3);
	}
	__m128i s = lanes[0];
	for (int i = 1; i < 16; i++) {
		s = kvbm_fold16(s, k16, lanes[i]);
	}
	for (; n >= 16; p += 16, n -= 16) {
		s = kvbm_fold16(s, k16, _mm_loadu_si128((const void *)p));
	}
	uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(s));
	c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(s, 1));
	for (; n > 0; p++, n--) {
		c = _mm_crc32_u8((uint32_t)c, *p);
	}
	return (uint32_t)c;
}
*/
import "C"

import (
	"math/bits"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// folds: the CPU has the instructions of the folded path, and the OS
// saves AVX-512 state (x/sys/cpu checks both).
var folds = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ &&
	cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// constants: for a fold over F bits, x^(F+63) and x^(F-1) mod P (one less
// than the distance, for the factor x the reflected product adds), each
// bit-reversed into a 64-bit half: F = 2048 for the four 64-byte
// accumulators, F = 128 for one lane.
var constants = [4]uint64{
	bits.Reverse64(xPowMod(2048 + 63)), bits.Reverse64(xPowMod(2048 - 1)),
	bits.Reverse64(xPowMod(128 + 63)), bits.Reverse64(xPowMod(128 - 1)),
}

// xPowMod is x^n mod P, P the Castagnoli polynomial, in normal bit order
// (bit i the coefficient of x^i).
func xPowMod(n int) uint64 {
	const p = 1<<32 | 0x1EDC6F41
	r := uint64(1)
	for range n {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= p
		}
	}
	return r
}

// fold is kvbm_crc32c_fold of b, which holds at least foldMin bytes (it
// reads exactly len(b)). The C function keeps no pointer and calls no Go
// (noescape, nocallback), so b does not escape as an argument to C would.
func fold(crc uint32, b []byte) uint32 {
	if len(b) < 256 {
		panic("crc32c: fold of fewer than 256 bytes")
	}
	return uint32(C.kvbm_crc32c_fold(C.uint32_t(crc), (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b)),
		(*C.uint64_t)(unsafe.Pointer(&constants[0]))))
}
