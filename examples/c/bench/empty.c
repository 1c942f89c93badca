/* An empty function in its own translation unit, so the call is not
 * inlined: the floor a kvbm call is compared with. */
void kvbm_bench_empty(void);
void kvbm_bench_empty(void) {}
