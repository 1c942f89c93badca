"""What the real-engine suites (e2e_vllm, e2e_sglang) share: the tiny models
they generate from (model.py; the hybrid ones: hybrid_model.py), the engine
process driven over a pipe and the skip-or-fail rule (engine_process.py)."""
