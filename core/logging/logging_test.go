package logging

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"": slog.LevelError, "ERROR": slog.LevelError, "warn": slog.LevelWarn,
		" info ": slog.LevelInfo, "debug": slog.LevelDebug} {
		got, err := ParseLevel(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := ParseLevel("loud")
	require.ErrorContains(t, err, `KVBM_LOG="loud": want debug, info, warn or error`)
}

func TestNewFiltersByLevel(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, "")
	l.Warn("quiet")
	require.Empty(t, buf.String(), "warnings are off by default")
	l.Error("loud")
	require.Contains(t, buf.String(), "loud")

	buf.Reset()
	l = New(&buf, "loud")
	require.Contains(t, buf.String(), "ignoring a bad log level")
	buf.Reset()
	New(&buf, "debug").Debug("detail")
	require.Contains(t, buf.String(), "detail")
}
