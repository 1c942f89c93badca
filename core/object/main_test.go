package object

import (
	"testing"

	"go.uber.org/goleak"
)

// Every store call starts goroutines; none may outlive it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
