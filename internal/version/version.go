// Package version is kvbm's version and C ABI version for Go programs that
// do not load libkvbm.so (the kvbm command): the same numbers as
// KVBM_VERSION_MAJOR/MINOR/PATCH and KVBM_ABI_VERSION in include/kvbm.h,
// which a test keeps in step.
package version

import "fmt"

// The library's version and its C ABI version, as include/kvbm.h has them.
const (
	Major = 0
	Minor = 1
	Patch = 0
	ABI   = 1
)

// String is the version as "major.minor.patch".
func String() string { return fmt.Sprintf("%d.%d.%d", Major, Minor, Patch) }
