//go:build !cgo

package cuda

import "fmt"

// Without cgo there is no dlopen, so no real driver: "auto" opens the
// emulated device and "cuda" fails.
func openCUDA() (Driver, error) {
	return nil, fmt.Errorf("%w: this build has no cgo (CGO_ENABLED=0), so libcuda.so.1 cannot be loaded", ErrCUDAUnavailable)
}
