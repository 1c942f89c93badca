package cuda

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOpen(t *testing.T) {
	choices := []string{"emulated", " emulated "}
	if d, err := openCUDA(); err != nil {
		choices = append(choices, "auto", "AUTO") // auto falls back to emulated here
	} else {
		closeDriver(t, d)
	}
	for _, choice := range choices {
		t.Run(choice, func(t *testing.T) {
			t.Setenv(EnvDevice, "cuda") // an explicit choice wins over the environment
			d, err := Open(choice)
			require.NoError(t, err)
			require.Equal(t, "emulated", d.Name())
			n, err := d.DeviceCount()
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.NoError(t, d.(*Emulated).Close())
		})
	}

	if d, err := Open("cuda"); err == nil {
		// A machine with a GPU: the rest of this test is for those without.
		require.Equal(t, "cuda", d.Name())
		closeDriver(t, d)
	} else {
		requireCUDAUnavailable(t, err)
	}

	_, err := Open("gpu")
	require.Error(t, err)
	for _, s := range []string{`"gpu"`, "auto", "cuda", "emulated"} {
		require.Contains(t, err.Error(), s)
	}
}

func TestOpenFromEnvironment(t *testing.T) {
	t.Setenv(EnvDevice, "cuda")
	if d, err := Open(""); err == nil {
		require.Equal(t, "cuda", d.Name())
		closeDriver(t, d)
	} else {
		requireCUDAUnavailable(t, err)
		require.Contains(t, err.Error(), EnvDevice)
	}

	t.Setenv(EnvDevice, "tpu")
	_, err := Open("")
	require.ErrorContains(t, err, `"tpu"`)
	require.ErrorContains(t, err, EnvDevice)

	for _, v := range []string{"", "emulated", "auto"} {
		t.Setenv(EnvDevice, v)
		d, err := Open("")
		require.NoError(t, err, "KVBM_DEVICE=%q", v)
		if v != "emulated" && d.Name() == "cuda" {
			closeDriver(t, d) // auto on a machine with a GPU
			continue
		}
		require.Equal(t, "emulated", d.Name())
		require.NoError(t, d.(*Emulated).Close())
	}
}

// requireCUDAUnavailable checks Open("cuda")'s error on a machine without a
// usable driver: it names libcuda.so.1 and says why, or reports no device.
func requireCUDAUnavailable(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	if IsCode(err, ErrCodeNoDevice) || IsCode(err, ErrCodeNotInitialized) {
		return // a driver without a GPU
	}
	require.ErrorIs(t, err, ErrCUDAUnavailable)
	require.Contains(t, err.Error(), "libcuda.so.1")
	require.Contains(t, err.Error(), "use \"emulated\" or \"auto\"")
}

func TestDefault(t *testing.T) {
	t.Setenv(EnvDevice, "emulated")
	d1, err1 := Default()
	d2, err2 := Default()
	require.NoError(t, err1)
	require.NoError(t, err2)
	require.Same(t, d1.(*Emulated), d2.(*Emulated))
	require.Equal(t, "emulated", d1.Name())
	require.Equal(t, "emulated", Backend())
	// Never closed: it starts no goroutine until a stream is used, so
	// goleak stays quiet.
}

// closeDriver closes either driver (both have Close; the real one exists
// only in cgo builds).
func closeDriver(t *testing.T, d Driver) {
	t.Helper()
	require.NoError(t, d.(io.Closer).Close())
}
