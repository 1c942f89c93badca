package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/crc32c"
)

// benchCommand is `kvbm bench`: every path over a grid of block sizes
// (tokens per Llama-3-8B block), block counts and concurrency, each figure
// beside its baseline measured in the same run, right after it, as a
// ratio (baseline time / kvbm time: 1.0 is as fast as the baseline). The
// medians of -reps runs are printed, with the spread of the ratio.
func benchCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbm bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg benchConfig
	fs.StringVar(&cfg.dir, "dir", os.TempDir(), "directory for the disk tier (G3), the object store (G4) and the disk baselines; a fresh subdirectory is made and removed")
	tokens := fs.String("tokens", "16", "tokens per block, comma-separated: a Llama-3-8B block is 128 KiB a token (16: 2 MiB blocks of 64 fragments of 32 KiB)")
	blocks := fs.String("blocks", "64", "blocks per transfer, comma-separated")
	conc := fs.String("concurrency", "1,2", "transfers in flight at once (goroutines, each its share of the blocks), comma-separated")
	fs.IntVar(&cfg.reps, "reps", 3, "timed runs of every figure (after one warm-up run); medians are printed")
	fs.IntVar(&cfg.smallOps, "small-ops", 2000, "one-block transfers timed for the small-transfer figures")
	only := fs.String("paths", "", "run only the paths whose name contains one of these comma-separated words (e.g. G3,layer-wise)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	var err error
	if cfg.tokens, err = intList("tokens", *tokens); err != nil {
		return err
	}
	if cfg.blocks, err = intList("blocks", *blocks); err != nil {
		return err
	}
	if cfg.concurrency, err = intList("concurrency", *conc); err != nil {
		return err
	}
	if cfg.reps < 1 {
		return usageError{fmt.Sprintf("-reps must be at least 1, got %d", cfg.reps)}
	}
	if cfg.smallOps < 1 {
		return usageError{fmt.Sprintf("-small-ops must be at least 1, got %d", cfg.smallOps)}
	}
	for _, w := range strings.Split(*only, ",") {
		if w = strings.TrimSpace(w); w != "" {
			cfg.only = append(cfg.only, w)
		}
	}
	cfg.progress = stderr

	rep, err := runBench(cfg)
	if rep != nil {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(rep); jerr != nil {
				return errors.Join(err, jerr)
			}
		} else {
			printBench(stdout, rep)
		}
	}
	if err == nil {
		for _, r := range rep.Results {
			if r.Error != "" {
				err = errors.Join(err, fmt.Errorf("%s: %s", r.Path, r.Error))
			}
		}
	}
	return err
}

// startCPUProfile profiles the process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// intList parses "1,2,4" into positive ints.
func intList(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, usageError{fmt.Sprintf("-%s: %q is not a positive integer", flagName, f)}
		}
		out = append(out, v)
	}
	return out, nil
}

type benchConfig struct {
	dir                         string
	tokens, blocks, concurrency []int
	reps, smallOps              int
	only                        []string
	progress                    io.Writer
}

// wants reports whether path is selected by -paths.
func (c benchConfig) wants(path string) bool {
	if len(c.only) == 0 {
		return true
	}
	return slices.ContainsFunc(c.only, func(w string) bool { return strings.Contains(path, w) })
}

// benchReport is what `kvbm bench` prints; its JSON form is --json's.
type benchReport struct {
	Backend    string        `json:"backend"`
	GOMAXPROCS int           `json:"gomaxprocs"`
	Dir        string        `json:"dir"`
	Direct     bool          `json:"o_direct"` // the disk tier and its baseline use O_DIRECT
	CRC32C     string        `json:"crc32c"`   // how G3 and G4 bytes and their checked baseline are checksummed
	Reps       int           `json:"reps"`
	Seconds    float64       `json:"seconds"`
	Results    []benchResult `json:"results"`
}

// benchResult is one figure beside its baseline.
type benchResult struct {
	Path        string `json:"path"`
	BlockBytes  int    `json:"block_bytes"`
	Blocks      int    `json:"blocks"`
	Concurrency int    `json:"concurrency"`
	// Unit is "GB/s" (10⁹ bytes a second) or "us" (microseconds an
	// operation); Value and BaselineValue are medians in it.
	Unit          string  `json:"unit"`
	Value         float64 `json:"value"`
	Baseline      string  `json:"baseline"`
	BaselineValue float64 `json:"baseline_value"`
	// Ratio is the median over runs of baseline time / kvbm time; RatioMin
	// and RatioMax its spread.
	Ratio    float64 `json:"ratio"`
	RatioMin float64 `json:"ratio_min"`
	RatioMax float64 `json:"ratio_max"`
	Error    string  `json:"error,omitempty"`
}

// sample is one timed run of a path and, right after it, of its baseline.
type sample struct{ kvbm, base time.Duration }

// summarize turns runs into a result: throughput of bytes per run (unit
// GB/s), or time per op of ops per run (unit us).
func summarize(r benchResult, runs []sample, bytes int64, ops int) benchResult {
	var vals, bases, ratios []float64
	for _, s := range runs {
		if r.Unit == "us" {
			vals = append(vals, float64(s.kvbm.Nanoseconds())/1e3/float64(ops))
			bases = append(bases, float64(s.base.Nanoseconds())/1e3/float64(ops))
		} else {
			vals = append(vals, gbPerS(bytes, s.kvbm))
			bases = append(bases, gbPerS(bytes, s.base))
		}
		ratios = append(ratios, s.base.Seconds()/s.kvbm.Seconds())
	}
	r.Value, r.BaselineValue, r.Ratio = median(vals), median(bases), median(ratios)
	r.RatioMin, r.RatioMax = slices.Min(ratios), slices.Max(ratios)
	return r
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// runBench runs the grid, then the small transfers, in a fresh
// subdirectory of cfg.dir removed at the end.
func runBench(cfg benchConfig) (rep *benchReport, err error) {
	start := time.Now()
	if err := os.MkdirAll(cfg.dir, 0o700); err != nil {
		return nil, fmt.Errorf("-dir %q: %w", cfg.dir, err)
	}
	root, err := os.MkdirTemp(cfg.dir, "kvbm-bench-")
	if err != nil {
		return nil, fmt.Errorf("-dir %q: %w", cfg.dir, err)
	}
	defer func() { err = errors.Join(err, removeDir(root)) }()
	drv, err := cuda.Open("")
	if err != nil {
		return nil, fmt.Errorf("open device: %w", err)
	}
	if c, ok := drv.(io.Closer); ok {
		defer func() { err = errors.Join(err, c.Close()) }()
	}
	rep = &benchReport{Backend: drv.Name(), GOMAXPROCS: gomaxprocs(), CRC32C: crc32c.Implementation(), Dir: cfg.dir, Reps: cfg.reps, Results: []benchResult{}}
	rep.Direct = probeDisk(root).Direct

	p := newProgress(cfg.progress)
	defer p.done()
	for _, tokens := range cfg.tokens {
		for _, blocks := range cfg.blocks {
			for _, conc := range cfg.concurrency {
				if conc > blocks {
					continue
				}
				dir := filepath.Join(root, fmt.Sprintf("t%d-b%d-c%d", tokens, blocks, conc))
				results, err := benchGrid(drv, cfg, p, dir, tokens, blocks, conc)
				rep.Results = append(rep.Results, results...)
				if err != nil {
					return rep, err
				}
			}
		}
	}
	small, err := benchSmall(drv, cfg, p)
	rep.Results = append(rep.Results, small...)
	if err == nil {
		var net []benchResult
		net, err = benchRemote(drv, cfg, p)
		rep.Results = append(rep.Results, net...)
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, err
}

// progress is the line on stderr that says where a run is: rewritten in
// place on a terminal, else one line per path.
type progress struct {
	w        io.Writer
	terminal bool
	last     int
	lastPath string
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

// say reports run rep of path.
func (p *progress) say(path string, rep, reps int) {
	if p.w == nil {
		return
	}
	if !p.terminal {
		if path != p.lastPath {
			fmt.Fprintf(p.w, "kvbm bench: %s\n", path)
			p.lastPath = path
		}
		return
	}
	s := fmt.Sprintf("kvbm bench: %s, run %d/%d", path, rep, reps)
	if rep == 0 {
		s = fmt.Sprintf("kvbm bench: %s, warm-up", path)
	}
	fmt.Fprintf(p.w, "\r%s%s", s, strings.Repeat(" ", max(0, p.last-len([]rune(s)))))
	p.last = len([]rune(s))
}

// done clears the line.
func (p *progress) done() {
	if p.w != nil && p.terminal && p.last > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.last))
		p.last = 0
	}
}

func printBench(w io.Writer, r *benchReport) {
	direct := "O_DIRECT"
	if !r.Direct {
		direct = "buffered (no O_DIRECT there)"
	}
	fmt.Fprintf(w, "kvbm bench: device %s, GOMAXPROCS %d, disk %s (%s), crc32c %s; medians of %d runs, each beside its baseline run right after it\n",
		r.Backend, r.GOMAXPROCS, r.Dir, direct, r.CRC32C, r.Reps)
	cells := [][]string{{"path", "block", "blocks", "conc", "kvbm", "baseline", "baseline", "vs baseline", "min–max"}}
	for _, x := range r.Results {
		f := func(v float64) string {
			if x.Unit == "us" {
				return fmt.Sprintf("%.1f µs", v)
			}
			return fmt.Sprintf("%.2f GB/s", v)
		}
		if x.Error != "" {
			cells = append(cells, []string{x.Path, sizeString(x.BlockBytes), fmt.Sprint(x.Blocks), fmt.Sprint(x.Concurrency), "FAILED", x.Baseline, "", "", x.Error})
			continue
		}
		cells = append(cells, []string{x.Path, sizeString(x.BlockBytes), fmt.Sprint(x.Blocks), fmt.Sprint(x.Concurrency),
			f(x.Value), x.Baseline, f(x.BaselineValue), fmt.Sprintf("%.2f", x.Ratio), fmt.Sprintf("%.2f–%.2f", x.RatioMin, x.RatioMax)})
	}
	printCells(w, cells, 1)
	fmt.Fprintf(w, "%d figures in %.1f s\n", len(r.Results), r.Seconds)
}

// sizeString is a byte count in KiB or MiB.
func sizeString(b int) string {
	if b == 0 {
		return "-" // a figure of no bytes (a connect)
	}
	if b >= 1<<20 && b%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", b>>20)
	}
	return fmt.Sprintf("%d KiB", b>>10)
}
