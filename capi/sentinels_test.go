package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/cache"
	"github.com/kvbm/kvbm/core/handoff"
	"github.com/kvbm/kvbm/core/object"
	"github.com/kvbm/kvbm/core/pool"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/remote/tcp"
	"github.com/kvbm/kvbm/core/remote/ucx"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/memavail"
	"github.com/kvbm/kvbm/internal/memfd"
	"github.com/kvbm/kvbm/internal/privdir"
	"github.com/kvbm/kvbm/kvbmerr"
)

// sentinels is every exported sentinel error (a package-level Err… variable)
// of the packages below capi, by directory and name, with the status it
// reaches C with. TestSentinelsListed keeps the list whole.
var sentinels = map[string]struct {
	err  error
	want status
}{
	"core/cache.ErrNotCached":             {cache.ErrNotCached, errNotFound},
	"core/handoff.ErrCleanupFailed":       {handoff.ErrCleanupFailed, errFailedPrecondition},
	"core/handoff.ErrConflictingOutcome":  {handoff.ErrConflictingOutcome, errAlreadyExists},
	"core/handoff.ErrFactOutOfOrder":      {handoff.ErrFactOutOfOrder, errFailedPrecondition},
	"core/handoff.ErrForeignHandoff":      {handoff.ErrForeignHandoff, errInvalidArgument},
	"core/handoff.ErrInvalidConfig":       {handoff.ErrInvalidConfig, errInvalidArgument},
	"core/handoff.ErrInvalidFact":         {handoff.ErrInvalidFact, errInvalidArgument},
	"core/handoff.ErrInvalidOutcome":      {handoff.ErrInvalidOutcome, errInvalidArgument},
	"core/handoff.ErrInvalidTiming":       {handoff.ErrInvalidTiming, errInvalidArgument},
	"core/handoff.ErrUnknownAction":       {handoff.ErrUnknownAction, errNotFound},
	"core/handoff.ErrUnsupportedEngine":   {handoff.ErrUnsupportedEngine, errInvalidArgument},
	"core/object.ErrCorrupt":              {object.ErrCorrupt, errDataCorruption},
	"core/object.ErrIO":                   {object.ErrIO, errIO},
	"core/object.ErrInvalidArgument":      {object.ErrInvalidArgument, errInvalidArgument},
	"core/object.ErrNotFound":             {object.ErrNotFound, errNotFound},
	"core/pool.ErrAlreadyExists":          {pool.ErrAlreadyExists, errAlreadyExists},
	"core/pool.ErrInvalidArgument":        {pool.ErrInvalidArgument, errInvalidArgument},
	"core/pool.ErrNoSpace":                {pool.ErrNoSpace, errFailedPrecondition},
	"core/pool.ErrOutOfRange":             {pool.ErrOutOfRange, errOutOfRange},
	"core/pool.ErrState":                  {pool.ErrState, errFailedPrecondition},
	"core/remote.ErrBadEndpoint":          {remote.ErrBadEndpoint, errInvalidArgument},
	"core/remote.ErrPeerUnavailable":      {remote.ErrPeerUnavailable, errIO},
	"core/remote/capability.ErrMalformed": {capability.ErrMalformed, errInvalidArgument},
	"core/remote/tcp.ErrTLSConfig":        {tcp.ErrTLSConfig, errInvalidArgument},
	"core/remote/ucx.ErrLateWrites":       {ucx.ErrLateWrites, errUnsupported},
	"core/storage.ErrNotShareable":        {storage.ErrNotShareable, errUnsupported},
	"core/transfer.ErrAlreadyExists":      {transfer.ErrAlreadyExists, errAlreadyExists},
	"core/transfer.ErrCanceled":           {transfer.ErrCanceled, errCanceled},
	"core/transfer.ErrClosed":             {transfer.ErrClosed, errCanceled},
	"core/transfer.ErrCorrupt":            {transfer.ErrCorrupt, errDataCorruption},
	"core/transfer.ErrInvalidArgument":    {transfer.ErrInvalidArgument, errInvalidArgument},
	"core/transfer.ErrNotFound":           {transfer.ErrNotFound, errNotFound},
	"core/transfer.ErrOutOfRange":         {transfer.ErrOutOfRange, errOutOfRange},
	"core/transfer.ErrTimeout":            {transfer.ErrTimeout, errTimeout},
	"core/transfer.ErrUnsupported":        {transfer.ErrUnsupported, errUnsupported},
	"core/transfer.ErrWithdrawn":          {transfer.ErrWithdrawn, errFailedPrecondition},
	"core/worker.ErrAlreadyExists":        {worker.ErrAlreadyExists, errAlreadyExists},
	"core/worker.ErrBadMetadata":          {worker.ErrBadMetadata, errDataCorruption},
	"core/worker.ErrScopedBusy":           {worker.ErrScopedBusy, errFailedPrecondition},
	"cuda.ErrCUDAUnavailable":             {cuda.ErrCUDAUnavailable, errUnsupported},
	"internal/memavail.ErrInsufficient":   {memavail.ErrInsufficient, errIO},
	"internal/memfd.ErrUnavailable":       {memfd.ErrUnavailable, errUnsupported},
	"internal/privdir.ErrNotPrivate":      {privdir.ErrNotPrivate, errFailedPrecondition},
	"kvbmerr.ErrAlreadyExists":            {kvbmerr.ErrAlreadyExists, errAlreadyExists},
	"kvbmerr.ErrCUDA":                     {kvbmerr.ErrCUDA, errCUDA},
	"kvbmerr.ErrCanceled":                 {kvbmerr.ErrCanceled, errCanceled},
	"kvbmerr.ErrDataCorruption":           {kvbmerr.ErrDataCorruption, errDataCorruption},
	"kvbmerr.ErrDeadlineExceeded":         {kvbmerr.ErrDeadlineExceeded, errDeadlineExceeded},
	"kvbmerr.ErrFailedPrecondition":       {kvbmerr.ErrFailedPrecondition, errFailedPrecondition},
	"kvbmerr.ErrIO":                       {kvbmerr.ErrIO, errIO},
	"kvbmerr.ErrInvalidArgument":          {kvbmerr.ErrInvalidArgument, errInvalidArgument},
	"kvbmerr.ErrNotFound":                 {kvbmerr.ErrNotFound, errNotFound},
	"kvbmerr.ErrOutOfRange":               {kvbmerr.ErrOutOfRange, errOutOfRange},
	"kvbmerr.ErrTimeout":                  {kvbmerr.ErrTimeout, errTimeout},
	"kvbmerr.ErrUnsupported":              {kvbmerr.ErrUnsupported, errUnsupported},
}

// Every sentinel reaches C with a status of its own kind, never
// KVBM_ERR_INTERNAL, bare or wrapped.
func TestSentinelStatuses(t *testing.T) {
	for name, s := range sentinels {
		require.NotEqual(t, errInternal, s.want, name)
		require.Equal(t, s.want, statusOf(s.err), name)
		require.Equal(t, s.want, statusOf(fmt.Errorf("context: %w", s.err)), name)
		require.Equal(t, s.want, statusOf(transfer.Failed(transfer.LayoutHandle{}, transfer.LayoutHandle{}, []int{0}, s.err)), name)
	}
}

// The list above names every exported Err… variable declared in core,
// cuda, internal and kvbmerr, as read from their source: a new sentinel fails here
// until it is listed with its status.
func TestSentinelsListed(t *testing.T) {
	var declared []string
	for _, dir := range []string{"core", "cuda", "internal", "kvbmerr"} {
		declared = append(declared, exportedErrVars(t, filepath.Join("..", dir))...)
	}
	slices.Sort(declared)
	var listed []string
	for name := range sentinels {
		listed = append(listed, name)
	}
	slices.Sort(listed)
	require.Equal(t, declared, listed, "exported Err… variables in the source vs. the sentinels listed in this file")
}

// exportedErrVars returns the package-level exported variables named Err…
// declared in the non-test Go files under root, as "dir.Name" with dir
// relative to the repository root.
func exportedErrVars(t *testing.T, root string) []string {
	var names []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, err := filepath.Rel("..", filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				for _, n := range spec.(*ast.ValueSpec).Names {
					if n.IsExported() && strings.HasPrefix(n.Name, "Err") {
						names = append(names, filepath.ToSlash(dir)+"."+n.Name)
					}
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return names
}

// Every kind has a status of its own, none of them KVBM_ERR_INTERNAL.
func TestKindStatuses(t *testing.T) {
	seen := map[status]kvbmerr.Kind{}
	for _, k := range kvbmerr.Kinds() {
		st, ok := statusOfKind[k]
		require.True(t, ok, "kind %v has no status", k)
		require.NotEqual(t, errInternal, st, "kind %v", k)
		require.NotContains(t, seen, st, "kinds %v and %v share a status", seen[st], k)
		seen[st] = k
	}
	require.Len(t, statusOfKind, len(kvbmerr.Kinds()))
	require.Equal(t, errInternal, statusOf(fmt.Errorf("no kind")))
}
