package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
)

// EnvDevice is the environment variable that chooses the driver when Open
// is given "": "auto" (the default), "cuda" or "emulated".
const EnvDevice = "KVBM_DEVICE"

// ErrCUDAUnavailable is wrapped by Open's error when the real CUDA driver
// is asked for but this build has no CUDA driver backend.
var ErrCUDAUnavailable = errors.New("the CUDA driver backend is not available in this build")

// Open opens a driver: "cuda" the real CUDA driver, "emulated" the emulated
// device with one device, "auto" the real driver when it loads and a device
// exists, else the emulated device. "" means the value of KVBM_DEVICE, or
// "auto" when that is unset or empty. Choices are case-insensitive.
//
// This build has no real driver backend yet: "cuda" fails with an error
// wrapping ErrCUDAUnavailable, and "auto" opens the emulated device.
func Open(choice string) (Driver, error) {
	from := "choice"
	if choice == "" {
		choice, from = os.Getenv(EnvDevice), EnvDevice
		if choice == "" {
			choice, from = "auto", "default"
		}
	}
	switch strings.ToLower(strings.TrimSpace(choice)) {
	case "auto", EmulatedName:
		return NewEmulated(1), nil
	case "cuda":
		return nil, fmt.Errorf("cuda: open device %q (from %s): %w; use %q or %q",
			choice, from, ErrCUDAUnavailable, EmulatedName, "auto")
	}
	return nil, fmt.Errorf("cuda: unknown device choice %q (from %s): want one of %q, %q, %q",
		choice, from, "auto", "cuda", EmulatedName)
}

var (
	defaultOnce   sync.Once
	defaultDriver Driver
	defaultErr    error
)

// Default is the process-wide driver, opened once with Open("") on first
// use and never closed. Every call returns the same driver and error.
func Default() (Driver, error) {
	defaultOnce.Do(func() { defaultDriver, defaultErr = Open("") })
	return defaultDriver, defaultErr
}
