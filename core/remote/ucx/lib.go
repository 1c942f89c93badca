//go:build cgo

package ucx

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"unsafe"
)

var (
	loadOnce sync.Once
	loadErr  error
	version  string
)

// load opens libucp once per process. The library is never closed.
func load() error {
	loadOnce.Do(func() {
		path := os.Getenv(EnvLib)
		if path == "" {
			path = DefaultLib
		}
		env := maps.Clone(defaultEnv)
		switch strings.ToLower(os.Getenv("KVBM_LOG")) {
		case "debug", "info", "warn":
			env["UCX_LOG_LEVEL"] = "warn"
		}
		for k, v := range env {
			if _, set := os.LookupEnv(k); !set {
				if err := os.Setenv(k, v); err != nil {
					loadErr = fmt.Errorf("ucx: %w", err)
					return
				}
			}
		}
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		var msg [512]C.char
		if C.kvbm_ucx_load(cpath, &msg[0], C.size_t(len(msg))) != 0 {
			loadErr = fmt.Errorf("ucx: cannot load %s (%s; install Debian's libucx0, or name a libucp with %s): %s",
				path, "UCX is loaded at run time", EnvLib, C.GoString(&msg[0]))
			return
		}
		var major, minor, release C.uint
		C.kvbm_ucx_version(&major, &minor, &release)
		version = fmt.Sprintf("%d.%d.%d", major, minor, release)
		rkeyFrame120 = major == 1 && minor >= 20
		if major != 1 || minor < minMinor {
			loadErr = fmt.Errorf("ucx: %s is UCX %s; need 1.%d or newer 1.x", path, version, minMinor)
		}
	})
	return loadErr
}

// Available reports why the UCX transport cannot be used in this process
// (libucp cannot be loaded, or is too old), or nil.
func Available() error { return load() }

// Version is the version of the loaded libucp ("1.13.1"), or "" when it
// is not loaded.
func Version() string {
	if load() != nil {
		return ""
	}
	return version
}

// ucsError is a UCX status code.
type ucsError int32

// UCX status codes used here (ucs/type/status.h).
const (
	ucsErrIOError          ucsError = -3
	ucsErrUnreachable      ucsError = -6
	ucsErrCanceled         ucsError = -16
	ucsErrTimedOut         ucsError = -20
	ucsErrConnectionReset  ucsError = -25
	ucsErrRejected         ucsError = -26
	ucsErrNotConnected     ucsError = -27
	ucsErrFirstLinkFailure ucsError = -40
	ucsErrLastEndpointFail ucsError = -89
)

func (e ucsError) Error() string {
	return fmt.Sprintf("%s (UCS status %d)", C.GoString(C.kvbm_ucx_status_string(C.int32_t(e))), int32(e))
}

// peerFailure reports whether a status says the peer or the way to it
// failed, rather than a misuse here.
func (e ucsError) peerFailure() bool {
	switch e {
	case ucsErrIOError, ucsErrUnreachable, ucsErrCanceled, ucsErrTimedOut, ucsErrConnectionReset,
		ucsErrRejected, ucsErrNotConnected:
		return true
	}
	return e <= ucsErrFirstLinkFailure && e >= ucsErrLastEndpointFail
}

func status(st C.int32_t) error {
	if st == 0 {
		return nil
	}
	return ucsError(st)
}
