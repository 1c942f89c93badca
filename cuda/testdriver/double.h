// kvbm's CUDA double: a libcuda.so.1 for tests that runs the subset of the
// driver API kvbm resolves (cuda/real_abi.h) on the CPU, with CUDA's
// documented semantics: a current context per thread, streams that run
// their work asynchronously and in order on a thread each, events that
// capture a stream's work at record time, device memory the host cannot
// touch (its addresses are PROT_NONE: only copies, the copy kernel's C
// twin and IPC reach it), sticky errors. Built against the real cuda.h
// (scripts/cuda-double.sh), so that every entry point has cuda.h's type.
//
// What it does not implement fails loudly: a message naming the call on
// stderr and an error, never a silent success.
//
// Test-only knobs (environment):
//   KVBM_CUDA_DOUBLE_DEVICES       number of devices (default 1, at most 8)
//   KVBM_CUDA_DOUBLE_PS_PER_BYTE   copy time: a copy reads its source when
//                                  it starts and writes its destination
//                                  size*ps later (default 0: at once)
//   KVBM_CUDA_DOUBLE_TRACE         a file each entry point a process calls
//                                  is appended to, at its first call
//
// Broken builds, for the tests of the tests (compile-time):
//   KVD_BREAK_STREAM_ORDER  a stream runs the newest queued work first
//   KVD_BREAK_EVENT_WAIT    cuStreamWaitEvent does nothing
//   KVD_BREAK_SHORT_COPY    every copy moves one byte less
#ifndef KVBM_CUDA_DOUBLE_H
#define KVBM_CUDA_DOUBLE_H

#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#if defined(KVD_CUDA10)
#define KVD_DRIVER_VERSION 10020
#elif defined(KVD_CUDA12)
#define KVD_DRIVER_VERSION 12080
#else
#define KVD_DRIVER_VERSION 13000
#endif
#define KVD_MAX_DEVICES 8

// One lock guards all of the double's state; the condition variable is
// broadcast whenever a stream finishes a piece of work or state changes.
extern pthread_mutex_t kvd_mu;
extern pthread_cond_t kvd_cv;

// kvd_called notes a call of an entry point (KVBM_CUDA_DOUBLE_TRACE).
void kvd_called(const char *name);

// kvd_unsupported reports, on stderr, a call or a case of one the double
// does not implement, and returns CUDA_ERROR_NOT_SUPPORTED;
// kvd_unsupported_attr the same for an attribute the call does not know.
CUresult kvd_unsupported(const char *call, const char *what);
CUresult kvd_unsupported_attr(const char *call, int attr);

// Every entry point takes kvd_mu; LOCKED keeps their bodies short.
#define LOCKED(expr)                      \
	do {                                  \
		pthread_mutex_lock(&kvd_mu);      \
		CUresult r_ = (expr);             \
		pthread_mutex_unlock(&kvd_mu);    \
		return r_;                        \
	} while (0)

struct CUctx_st {
	int device;
	int refs;       // primary context retains
	int active;     // refs > 0 at least once and not destroyed since
	CUresult sticky; // an error of asynchronous work: every later call returns it
	struct CUstream_st *legacy; // the legacy default stream, made at first use
};

extern int kvd_initialized; // cuInit(0) was called
extern int kvd_devices;
extern struct CUctx_st kvd_ctx[KVD_MAX_DEVICES];

// kvd_current returns this thread's current context in *c, or why there is
// none usable: NOT_INITIALIZED, INVALID_CONTEXT (none current),
// CONTEXT_IS_DESTROYED, or the context's sticky error. Called with kvd_mu
// held.
CUresult kvd_current(struct CUctx_st **c);
struct CUctx_st *kvd_thread_ctx(void);

// ---- streams (stream.c) ------------------------------------------------------

enum kvd_op_kind { KVD_OP_COPY, KVD_OP_WAIT, KVD_OP_KERNEL };

// A copy between two host views (device memory already translated).
struct kvd_copy {
	char *dst;
	const char *src;
	size_t n;
};

typedef CUresult (*kvd_twin)(const uint64_t *args, unsigned grid);

struct kvd_op {
	struct kvd_op *next;
	enum kvd_op_kind kind;
	struct kvd_copy *copies; // KVD_OP_COPY: n_copies of them, run in any order
	size_t n_copies;
	struct CUstream_st *wait_stream; // KVD_OP_WAIT: until it has done wait_seq
	uint64_t wait_seq;
	kvd_twin twin;   // KVD_OP_KERNEL
	uint64_t args[8];
	unsigned grid;
};

struct CUstream_st {
	struct CUctx_st *ctx;
	unsigned flags;
	int legacy;
	int dead;          // destroyed: its thread drains the queue and exits
	uint64_t enq, done; // work enqueued and finished, in order
	struct kvd_op *head, *tail;
	struct CUstream_st *next; // every stream made, live or not (never freed:
	                          // events may still refer to their work)
};

struct CUevent_st {
	struct CUctx_st *ctx;
	int dead;
	struct CUstream_st *stream; // of the latest record (NULL: never recorded)
	uint64_t seq;               // the stream's work captured by it
	struct CUevent_st *next;
};

// kvd_stream resolves a stream handle (0 and CU_STREAM_LEGACY: the
// current context's legacy stream). current_only: work queued on it (a
// copy, a launch) must be on a stream of the current context, else
// CUDA_ERROR_INVALID_HANDLE; a stream's own calls (query, wait, record,
// destroy) take any. kvd_mu held.
CUresult kvd_stream(const char *call, CUstream h, int current_only, struct CUstream_st **s);
// kvd_enqueue appends op to s (and the legacy stream's implicit waits);
// kvd_mu held.
void kvd_enqueue(struct CUstream_st *s, struct kvd_op *op);
// kvd_ctx_idle waits until every stream of c (NULL: of every context) has
// done its work; kvd_mu held.
void kvd_ctx_idle(struct CUctx_st *c);
// kvd_ctx_destroy drops c's streams, events and modules; kvd_mu held.
void kvd_ctx_destroy(struct CUctx_st *c);
// kvd_copy_bytes is the one place bytes move (copies and the kernel twin).
void kvd_copy_bytes(char *dst, const char *src, size_t n);

// ---- memory (memory.c) -------------------------------------------------------

// kvd_device_view translates [p, p+n) of the device's address space (a
// device allocation, an IPC mapping, or pinned host memory under unified
// addressing) to the host view the double copies with; NULL when p+n is
// not all inside one. kvd_mu held.
char *kvd_device_view(uint64_t p, size_t n);
// kvd_host_view: a host pointer as given, or translated when it is device
// memory (unified addressing). kvd_mu held.
char *kvd_host_view(uint64_t p, size_t n);
void kvd_memory_destroy(struct CUctx_st *c);

// ---- modules (module.c) ------------------------------------------------------

void kvd_modules_destroy(struct CUctx_st *c);

#endif
