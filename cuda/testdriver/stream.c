// Streams and events. Each stream has its own thread that runs the
// stream's work in order; an event record captures how much work its
// stream had been given (stream, seq), and is complete once the stream has
// done that much. cuStreamWaitEvent queues a wait for that point.
#include "double.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct CUstream_st *streams; // every stream made
static struct CUevent_st *events;   // every event made

// Copy time (KVBM_CUDA_DOUBLE_PS_PER_BYTE): -1 until read.
static long long ps_per_byte = -1;

void kvd_copy_bytes(char *dst, const char *src, size_t n) {
#ifdef KVD_BREAK_SHORT_COPY
	if (n > 0)
		n--;
#endif
	if (ps_per_byte <= 0) {
		memmove(dst, src, n);
		return;
	}
	// The source is read when the copy starts, the destination written
	// when it ends: work that is not ordered after it sees old bytes.
	char *tmp = malloc(n ? n : 1);
	memcpy(tmp, src, n);
	long long ns = (long long)n * ps_per_byte / 1000;
	struct timespec ts = {ns / 1000000000, ns % 1000000000};
	nanosleep(&ts, NULL);
	memcpy(dst, tmp, n);
	free(tmp);
}

// run executes one op outside kvd_mu; it returns the op's error (a
// kernel's illegal address).
static CUresult run(struct kvd_op *op) {
	switch (op->kind) {
	case KVD_OP_COPY:
		// A batch's copies have no order among them: run them backwards,
		// so that a caller who counted on one sees it broken.
		for (size_t i = op->n_copies; i-- > 0;)
			kvd_copy_bytes(op->copies[i].dst, op->copies[i].src, op->copies[i].n);
		return CUDA_SUCCESS;
	case KVD_OP_KERNEL:
		return op->twin(op->args, op->grid);
	case KVD_OP_WAIT:
		break;
	}
	return CUDA_SUCCESS;
}

static struct kvd_op *pop(struct CUstream_st *s) {
	struct kvd_op *op = s->head;
#ifdef KVD_BREAK_STREAM_ORDER
	// The newest work first.
	struct kvd_op *prev = NULL;
	while (op->next) {
		prev = op;
		op = op->next;
	}
	if (prev)
		prev->next = NULL;
	else
		s->head = NULL;
	s->tail = prev;
	return op;
#else
	s->head = op->next;
	if (!s->head)
		s->tail = NULL;
	return op;
#endif
}

static void *stream_thread(void *arg) {
	struct CUstream_st *s = arg;
	pthread_mutex_lock(&kvd_mu);
	for (;;) {
		while (!s->head && !s->dead)
			pthread_cond_wait(&kvd_cv, &kvd_mu);
		if (!s->head)
			break;
		struct kvd_op *op = pop(s);
		if (op->kind == KVD_OP_WAIT) {
			while (op->wait_stream->done < op->wait_seq)
				pthread_cond_wait(&kvd_cv, &kvd_mu);
		} else if (!s->ctx->sticky && s->ctx->active) {
			pthread_mutex_unlock(&kvd_mu);
			CUresult r = run(op);
			pthread_mutex_lock(&kvd_mu);
			if (r && !s->ctx->sticky)
				s->ctx->sticky = r;
		}
		s->done++;
		free(op->copies);
		free(op);
		pthread_cond_broadcast(&kvd_cv);
	}
	pthread_mutex_unlock(&kvd_mu);
	return NULL;
}

static CUresult stream_new(struct CUctx_st *c, unsigned flags, int legacy, struct CUstream_st **out) {
	if (ps_per_byte < 0) {
		const char *e = getenv("KVBM_CUDA_DOUBLE_PS_PER_BYTE");
		ps_per_byte = e ? atoll(e) : 0;
	}
	struct CUstream_st *s = calloc(1, sizeof *s);
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->ctx = c;
	s->flags = flags;
	s->legacy = legacy;
	pthread_t th;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int err = pthread_create(&th, &attr, stream_thread, s);
	pthread_attr_destroy(&attr);
	if (err) {
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	s->next = streams;
	streams = s;
	*out = s;
	return CUDA_SUCCESS;
}

CUresult kvd_stream(const char *call, CUstream h, int current_only, struct CUstream_st **out) {
	struct CUctx_st *c = NULL;
	CUresult r;
	if (h == NULL || h == CU_STREAM_LEGACY) {
		if ((r = kvd_current(&c)))
			return r;
		if (!c->legacy && (r = stream_new(c, 0, 1, &c->legacy)))
			return r;
		*out = c->legacy;
		return CUDA_SUCCESS;
	}
	if (h == CU_STREAM_PER_THREAD)
		return kvd_unsupported(call, "the per-thread default stream (CU_STREAM_PER_THREAD)");
	if (current_only && (r = kvd_current(&c)))
		return r;
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	for (struct CUstream_st *s = streams; s; s = s->next) {
		if (s == h && !s->dead && !s->legacy) {
			if (c && s->ctx != c)
				return CUDA_ERROR_INVALID_HANDLE;
			if (s->ctx->sticky)
				return s->ctx->sticky;
			*out = s;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_HANDLE;
}

static void append(struct CUstream_st *s, struct kvd_op *op) {
	op->next = NULL;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	s->enq++;
}

static void wait_for(struct CUstream_st *s, struct CUstream_st *on) {
	if (on->done >= on->enq)
		return;
	struct kvd_op *w = calloc(1, sizeof *w);
	w->kind = KVD_OP_WAIT;
	w->wait_stream = on;
	w->wait_seq = on->enq;
	append(s, w);
}

// implicit_sync: the legacy stream waits for the work of the context's
// blocking streams, and a blocking stream for the legacy stream's
// (CU_STREAM_NON_BLOCKING streams are exempt both ways).
static void implicit_sync(struct CUstream_st *s) {
	if (s->legacy) {
		for (struct CUstream_st *b = streams; b; b = b->next)
			if (b->ctx == s->ctx && !b->legacy && !b->dead && !(b->flags & CU_STREAM_NON_BLOCKING))
				wait_for(s, b);
	} else if (!(s->flags & CU_STREAM_NON_BLOCKING) && s->ctx->legacy) {
		wait_for(s, s->ctx->legacy);
	}
}

void kvd_enqueue(struct CUstream_st *s, struct kvd_op *op) {
	implicit_sync(s);
	append(s, op);
	pthread_cond_broadcast(&kvd_cv);
}

void kvd_ctx_idle(struct CUctx_st *c) {
	for (;;) {
		int busy = 0;
		for (struct CUstream_st *s = streams; s; s = s->next)
			if ((!c || s->ctx == c) && s->done < s->enq)
				busy = 1;
		if (!busy)
			return;
		pthread_cond_wait(&kvd_cv, &kvd_mu);
	}
}

void kvd_ctx_destroy(struct CUctx_st *c) {
	for (struct CUstream_st *s = streams; s; s = s->next)
		if (s->ctx == c)
			s->dead = 1;
	c->legacy = NULL;
	for (struct CUevent_st *e = events; e; e = e->next)
		if (e->ctx == c)
			e->dead = 1;
	pthread_cond_broadcast(&kvd_cv);
}


static CUresult stream_create(CUstream *ph, unsigned flags) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	return stream_new(c, flags, 0, ph);
}

CUresult cuStreamCreate(CUstream *ph, unsigned int flags) {
	kvd_called(__func__);
	LOCKED(stream_create(ph, flags));
}

static CUresult stream_destroy(CUstream h) {
	struct CUstream_st *s;
	if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = kvd_stream("cuStreamDestroy_v2", h, 0, &s);
	if (r)
		return r;
	// Work queued still runs; the thread exits once it has.
	s->dead = 1;
	pthread_cond_broadcast(&kvd_cv);
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream h) {
	kvd_called(__func__);
	LOCKED(stream_destroy(h));
}

static CUresult stream_query(CUstream h) {
	struct CUstream_st *s;
	CUresult r = kvd_stream("cuStreamQuery", h, 0, &s);
	if (r)
		return r;
	if (s->ctx->sticky)
		return s->ctx->sticky;
	return s->done >= s->enq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamQuery(CUstream h) {
	kvd_called(__func__);
	LOCKED(stream_query(h));
}

static CUresult live_event(CUevent h, struct CUevent_st **out) {
	for (struct CUevent_st *e = events; e; e = e->next) {
		if (e == h && !e->dead) {
			*out = e;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned flags) {
	struct CUstream_st *s;
	struct CUevent_st *e;
	CUresult r = kvd_stream("cuStreamWaitEvent", h, 0, &s);
	if (r)
		return r;
	if ((r = live_event(ev, &e)))
		return r;
	if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags)
		return kvd_unsupported("cuStreamWaitEvent", "CU_EVENT_WAIT_EXTERNAL");
#ifndef KVD_BREAK_EVENT_WAIT
	// The event may be of another context (CUDA allows it). Never
	// recorded: nothing to wait for.
	if (e->stream && e->stream->done < e->seq) {
		struct kvd_op *w = calloc(1, sizeof *w);
		w->kind = KVD_OP_WAIT;
		w->wait_stream = e->stream;
		w->wait_seq = e->seq;
		kvd_enqueue(s, w);
	}
#endif
	return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags) {
	kvd_called(__func__);
	LOCKED(stream_wait_event(h, ev, flags));
}

static CUresult stream_get_ctx(CUstream h, CUcontext *pctx) {
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
		// The special streams belong to whichever context is current.
		struct CUctx_st *c;
		CUresult r = kvd_current(&c);
		if (r)
			return r;
		*pctx = c;
		return CUDA_SUCCESS;
	}
	for (struct CUstream_st *s = streams; s; s = s->next) {
		if (s == h && !s->dead && !s->legacy) {
			*pctx = s->ctx;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx) {
	kvd_called(__func__);
	LOCKED(stream_get_ctx(h, pctx));
}

static CUresult event_create(CUevent *ph, unsigned flags) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
	if (!ph || (flags & ~known) || ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
		return CUDA_ERROR_INVALID_VALUE;
	// Timing and blocking sync change nothing here (no call kvbm makes
	// reads a time); interprocess events are another matter.
	if (flags & CU_EVENT_INTERPROCESS)
		return kvd_unsupported("cuEventCreate", "CU_EVENT_INTERPROCESS");
	struct CUevent_st *e = calloc(1, sizeof *e);
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->ctx = c;
	e->next = events;
	events = e;
	*ph = e;
	return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
	kvd_called(__func__);
	LOCKED(event_create(ph, flags));
}

static CUresult event_destroy(CUevent h) {
	struct CUctx_st *c;
	struct CUevent_st *e;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if ((r = live_event(h, &e)))
		return r;
	// Waits already queued on its records still hold (stream, seq).
	e->dead = 1;
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent h) {
	kvd_called(__func__);
	LOCKED(event_destroy(h));
}

static CUresult event_record(CUevent h, CUstream hs) {
	struct CUstream_st *s;
	struct CUevent_st *e;
	CUresult r = kvd_stream("cuEventRecord", hs, 0, &s);
	if (r)
		return r;
	if ((r = live_event(h, &e)))
		return r;
	if (e->ctx != s->ctx) // the event and the stream must share a context
		return CUDA_ERROR_INVALID_HANDLE;
	implicit_sync(s);
	e->stream = s;
	e->seq = s->enq;
	pthread_cond_broadcast(&kvd_cv);
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent h, CUstream hs) {
	kvd_called(__func__);
	LOCKED(event_record(h, hs));
}

static CUresult event_query(CUevent h) {
	struct CUevent_st *e;
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult r = live_event(h, &e);
	if (r)
		return r;
	if (e->ctx->sticky)
		return e->ctx->sticky;
	return !e->stream || e->stream->done >= e->seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventQuery(CUevent h) {
	kvd_called(__func__);
	LOCKED(event_query(h));
}
