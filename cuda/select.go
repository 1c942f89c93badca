package cuda

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/kvbm/kvbm/kvbmerr"
)

// EnvDevice is the environment variable that chooses the driver when Open
// is given "": "auto" (the default), "cuda" or "emulated".
const EnvDevice = "KVBM_DEVICE"

// ErrCUDAUnavailable is wrapped by Open's error when the real CUDA driver
// is asked for but cannot be used: libcuda.so.1 does not load (no NVIDIA
// driver), or this build has no cgo.
var ErrCUDAUnavailable = kvbmerr.New(kvbmerr.Unsupported, "the CUDA driver is not available")

// Open opens a driver: "cuda" the real CUDA driver (libcuda.so.1, opened
// with dlopen), "emulated" the emulated device with one device, "auto" the
// real driver when it loads and has a device, else the emulated device. ""
// means the value of KVBM_DEVICE, or "auto" when that is unset or empty.
// Choices are case-insensitive.
//
// "cuda" fails when libcuda.so.1 cannot be loaded (an error wrapping
// ErrCUDAUnavailable that names the library and says why), when the driver
// fails to initialize, or when it has no device. The choice made is logged
// with slog at level Info, with the reason when "auto" falls back.
func Open(choice string) (Driver, error) {
	from := "choice"
	if choice == "" {
		choice, from = os.Getenv(EnvDevice), EnvDevice
		if choice == "" {
			choice, from = "auto", "default"
		}
	}
	switch strings.ToLower(strings.TrimSpace(choice)) {
	case EmulatedName:
		slog.Info("kvbm: device driver", "driver", EmulatedName, "choice", choice, "from", from)
		return NewEmulated(1), nil
	case "auto":
		d, err := openCUDA()
		if err != nil {
			slog.Info("kvbm: device driver", "driver", EmulatedName, "choice", choice, "from", from,
				"why", "cuda unavailable", "err", err)
			return NewEmulated(1), nil
		}
		slog.Info("kvbm: device driver", "driver", RealName, "choice", choice, "from", from)
		return d, nil
	case RealName:
		d, err := openCUDA()
		if err != nil {
			return nil, fmt.Errorf("cuda: open device %q (from %s): %w; use %q or %q",
				choice, from, err, EmulatedName, "auto")
		}
		slog.Info("kvbm: device driver", "driver", RealName, "choice", choice, "from", from)
		return d, nil
	}
	return nil, fmt.Errorf("cuda: unknown device choice %q (from %s): want one of %q, %q, %q",
		choice, from, "auto", RealName, EmulatedName)
}

// RealName is what the real driver's Name returns.
const RealName = "cuda"

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

// Backend is the name of the process-wide driver ("cuda" or "emulated"),
// opening it if need be; "" when it failed to open.
func Backend() string {
	d, err := Default()
	if err != nil {
		return ""
	}
	return d.Name()
}
