package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOpen(t *testing.T) {
	for _, choice := range []string{"emulated", "auto", "AUTO", " emulated "} {
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

	_, err := Open("cuda")
	require.ErrorIs(t, err, ErrCUDAUnavailable)
	require.Contains(t, err.Error(), "not available in this build")

	_, err = Open("gpu")
	require.Error(t, err)
	for _, s := range []string{`"gpu"`, "auto", "cuda", "emulated"} {
		require.Contains(t, err.Error(), s)
	}
}

func TestOpenFromEnvironment(t *testing.T) {
	t.Setenv(EnvDevice, "cuda")
	_, err := Open("")
	require.ErrorIs(t, err, ErrCUDAUnavailable)
	require.Contains(t, err.Error(), EnvDevice)

	t.Setenv(EnvDevice, "tpu")
	_, err = Open("")
	require.ErrorContains(t, err, `"tpu"`)
	require.ErrorContains(t, err, EnvDevice)

	for _, v := range []string{"", "emulated", "auto"} {
		t.Setenv(EnvDevice, v)
		d, err := Open("")
		require.NoError(t, err, "KVBM_DEVICE=%q", v)
		require.Equal(t, "emulated", d.Name())
		require.NoError(t, d.(*Emulated).Close())
	}
}

func TestDefault(t *testing.T) {
	t.Setenv(EnvDevice, "emulated")
	d1, err1 := Default()
	d2, err2 := Default()
	require.NoError(t, err1)
	require.NoError(t, err2)
	require.Same(t, d1.(*Emulated), d2.(*Emulated))
	require.Equal(t, "emulated", d1.Name())
	// Never closed: it starts no goroutine until a stream is used, so
	// goleak stays quiet.
}
