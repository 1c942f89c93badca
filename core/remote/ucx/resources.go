//go:build cgo

package ucx

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Resources lists the transport resources a UCX context finds on this
// machine with the process's UCX settings (UCX_TLS, UCX_NET_DEVICES), as
// "transport/device" ("tcp/eth0", "rc_mlx5/mlx5_0:1", "posix/memory",
// "cuda_copy/cuda"), from ucp_context_print_info.
func Resources() ([]string, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var ctx C.uint64_t
	if err := status(C.kvbm_ucx_init(nil, nil, 0, 0, &ctx)); err != nil {
		return nil, fmt.Errorf("ucx: ucp_init: %w", err)
	}
	defer C.kvbm_ucx_cleanup(ctx)
	buf := make([]byte, 64<<10)
	n := C.kvbm_ucx_print_context(ctx, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return parseResources(string(buf[:n])), nil
}

// Settings are the values UCX's own settings give a context (its
// defaults, its configuration files ucx.conf, the environment), by name
// without the UCX_ prefix ("NET_DEVICES": "all"), from ucp_config_print.
func Settings() (map[string]string, error) {
	if err := load(); err != nil {
		return nil, err
	}
	buf := make([]byte, 256<<10)
	n := C.kvbm_ucx_print_config((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n == 0 {
		return nil, fmt.Errorf("ucx: reading UCX's settings failed (ucp_config_read: a UCX_* setting or a ucx.conf UCX reads is invalid? UCX logged which)")
	}
	return parseSettings(string(buf[:n])), nil
}
