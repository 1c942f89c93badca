package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/tcp"
	"github.com/kvbm/kvbm/core/remote/ucx"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/version"
)

// infoReport is what `kvbm info` prints; its JSON form is --json's.
type infoReport struct {
	Library    libraryInfo `json:"library"`
	Device     deviceInfo  `json:"device"`
	NVML       gpuReport   `json:"nvml"`
	NUMA       []numaNode  `json:"numa_nodes"`
	NUMAError  string      `json:"numa_error,omitempty"`
	Disk       diskReport  `json:"disk"`
	Transports []string    `json:"transports"`
	NICs       []nicInfo   `json:"nics"`
	// GPUNICTopology[i][j] is how GPU i reaches NIC j (PIX, PXB, PHB,
	// NODE, SYS), from the PCI tree in sysfs.
	GPUNICTopology [][]string `json:"gpu_nic_topology,omitempty"`
}

type libraryInfo struct {
	Version    string `json:"version"`
	ABIVersion int    `json:"abi_version"`
}

// deviceInfo is the device backend kvbm picks here: cuda.Default(), as the
// library would open it.
type deviceInfo struct {
	Backend string   `json:"backend"` // "cuda" or "emulated"
	Choice  string   `json:"kvbm_device"`
	Devices []device `json:"devices"`
	Error   string   `json:"error,omitempty"`
}

// device is one device of the backend (cuda.DeviceInfo).
type device struct {
	Ordinal     int    `json:"ordinal"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"memory_total_bytes"`
	PCIBusID    string `json:"pci_bus_id,omitempty"`
	NUMANode    int    `json:"numa_node"` // -1 when unknown
}

// transports are the data planes between instances: loopback (one
// process) always, each network transport linked in with whether it opens
// here, and which one KVBM_TRANSPORT selects for new workers.
func transports() []string {
	out := []string{"loopback (workers of one process)"}
	choice, err := remote.EnvChoice()
	status := remote.Status()
	names := make([]string, 0, len(status))
	for name := range status {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		line := name
		if err := status[name]; err != nil {
			line += " (unavailable: " + err.Error() + ")"
		} else if name == choice {
			line += " (selected)"
		}
		if name == "ucx" {
			line += "; " + ucxLibrary()
		}
		if name == "tcp" {
			if err := tcp.SameHostStatus(); err != nil {
				line += "; same host: " + err.Error()
			} else {
				line += "; same host: Unix socket, shared host memory, device memory by CUDA IPC (on the real driver with KVBM_CUDA_IPC=1)"
			}
		}
		out = append(out, line)
	}
	if err != nil {
		out = append(out, "KVBM_TRANSPORT: "+err.Error())
	}
	return append(out, remote.AutoWhy())
}

// ucxLibrary names the libucp that loads here, its version and the
// transport resources it finds (whatever the transport's own status).
func ucxLibrary() string {
	if err := ucx.Available(); err != nil {
		return "library: " + err.Error()
	}
	rs, err := ucx.Resources()
	if err != nil {
		return fmt.Sprintf("library UCX %s: %v", ucx.Version(), err)
	}
	return fmt.Sprintf("library UCX %s, resources %s; %s", ucx.Version(), strings.Join(rs, " "), ucxWorker())
}

// ucxWorkerWait bounds how long info waits for a UCX worker to open:
// UCX can block in ucp_init or ucp_worker_create on a host whose RDMA
// devices are not set up, and info must still answer (the blocked call
// is left behind; the command exits).
var ucxWorkerWait = 10 * time.Second

// ucxWorker is openUCXWorker's answer, or why it did not come within
// ucxWorkerWait.
func ucxWorker() string {
	ch := make(chan string, 1)
	go func() { ch <- openUCXWorker() }()
	timer := time.NewTimer(ucxWorkerWait)
	defer timer.Stop()
	select {
	case s := <-ch:
		return s
	case <-timer.C:
		return fmt.Sprintf("worker: did not open within %v: UCX blocks opening its devices "+
			"(check the RDMA devices, or name the ones to use with UCX_NET_DEVICES, UCX_TLS)", ucxWorkerWait)
	}
}

// openUCXWorker opens a UCX transport's worker, as its first export or
// connect would, and names what kvbm set for its context.
var openUCXWorker = func() string {
	t, err := ucx.New(ucx.Config{})
	if err != nil {
		return "worker: " + err.Error()
	}
	defer t.Close()
	opts, err := t.Probe()
	set := make([]string, 0, len(opts))
	for k, v := range opts {
		set = append(set, "UCX_"+k+"="+v)
	}
	sort.Strings(set)
	what := "kvbm sets " + strings.Join(set, " ")
	if len(set) == 0 {
		what = "kvbm sets nothing"
	}
	if err != nil {
		return what + "; the worker does not open: " + err.Error()
	}
	return what + "; the worker opens"
}

func infoCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbm info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", os.TempDir(), "directory the disk tier (G3) would use: its filesystem and whether O_DIRECT works there")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	r := gatherInfo(systemGPUs, "/sys", *dir)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	printInfo(stdout, r)
	return nil
}

// gatherInfo never fails: what cannot be learned is said in the report.
// gpus asks NVML.
func gatherInfo(gpus func() gpuReport, sysfs, dir string) infoReport {
	r := infoReport{
		Library:    libraryInfo{Version: version.String(), ABIVersion: version.ABI},
		Device:     deviceInfo{Choice: os.Getenv(cuda.EnvDevice), Devices: []device{}},
		Transports: transports(),
	}
	if r.Device.Choice == "" {
		r.Device.Choice = "auto"
	}
	if drv, err := cuda.Default(); err != nil {
		r.Device.Error = err.Error()
	} else {
		r.Device.Backend = drv.Name()
		n, err := drv.DeviceCount()
		if err != nil {
			r.Device.Error = fmt.Sprintf("device count: %v", err)
		}
		for i := range n {
			d, err := drv.Device(i)
			if err != nil {
				r.Device.Error = fmt.Sprintf("device %d: %v", i, err)
				break
			}
			r.Device.Devices = append(r.Device.Devices, device(d))
		}
	}
	r.NVML = gpus()
	var err error
	if r.NUMA, err = hostNUMANodes(sysfs); err != nil {
		r.NUMAError = err.Error()
	}
	r.Disk = probeDisk(dir)
	r.NICs = hostNICs(sysfs)
	r.GPUNICTopology = gpuNICTopology(sysfs, r.NVML.GPUs, r.NICs)
	return r
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func printInfo(w io.Writer, r infoReport) {
	fmt.Fprintf(w, "kvbm %s (C ABI %d)\n", r.Library.Version, r.Library.ABIVersion)
	if r.Device.Error != "" {
		fmt.Fprintf(w, "device backend: none (KVBM_DEVICE=%s): %s\n", r.Device.Choice, r.Device.Error)
	} else {
		fmt.Fprintf(w, "device backend: %s (KVBM_DEVICE=%s), %d device(s)\n", r.Device.Backend, r.Device.Choice, len(r.Device.Devices))
	}
	for _, d := range r.Device.Devices {
		fmt.Fprintf(w, "  device %d: %s, %s", d.Ordinal, d.Name, gib(d.TotalMemory))
		if d.PCIBusID != "" {
			fmt.Fprintf(w, ", PCI %s", d.PCIBusID)
		}
		if d.NUMANode >= 0 {
			fmt.Fprintf(w, ", NUMA node %d", d.NUMANode)
		}
		fmt.Fprintln(w)
	}
	g := r.NVML
	switch {
	case !g.Available:
		fmt.Fprintf(w, "GPUs: %s\n", g.Error)
	default:
		fmt.Fprintf(w, "GPUs (NVML %s, driver %s): %d\n", g.NVMLVersion, g.DriverVersion, len(g.GPUs))
		if g.Error != "" {
			fmt.Fprintf(w, "  %s\n", g.Error)
		}
		for _, d := range g.GPUs {
			numa := "unknown"
			if d.NUMANode >= 0 {
				numa = fmt.Sprint(d.NUMANode)
			}
			fmt.Fprintf(w, "  GPU %d: %s, memory %s total, %s free, PCI %s, NUMA node %s\n",
				d.Index, d.Name, gib(d.MemoryTotal), gib(d.MemoryFree), d.PCIBusID, numa)
			if d.Error != "" {
				fmt.Fprintf(w, "    (%s)\n", d.Error)
			}
		}
		if len(g.Topology) > 0 {
			fmt.Fprintln(w, "  topology (nvidia-smi topo -m):")
			cells := [][]string{{""}}
			for i := range g.Topology {
				cells[0] = append(cells[0], fmt.Sprintf("GPU%d", i))
			}
			for i, row := range g.Topology {
				cells = append(cells, append([]string{fmt.Sprintf("GPU%d", i)}, row...))
			}
			for _, c := range cells {
				for j := range c {
					c[j] = fmt.Sprintf("%-6s", c[j])
				}
				fmt.Fprintf(w, "    %s\n", strings.TrimRight(strings.Join(c, ""), " "))
			}
		}
	}
	printNICs(w, r)
	if r.NUMAError != "" {
		fmt.Fprintf(w, "NUMA: %s\n", r.NUMAError)
	} else {
		fmt.Fprintf(w, "NUMA nodes: %d\n", len(r.NUMA))
		for _, n := range r.NUMA {
			cpus := n.CPUs
			if cpus == "" {
				cpus = "none"
			}
			fmt.Fprintf(w, "  node %d: CPUs %s, memory %s\n", n.ID, cpus, gib(n.MemoryTotal))
		}
	}
	d := r.Disk
	if d.Error != "" {
		fmt.Fprintf(w, "disk tier (%s): %s\n", d.Dir, d.Error)
	} else {
		direct := "yes"
		if !d.Direct {
			direct = "no, buffered I/O (" + d.DirectError + ")"
		}
		fmt.Fprintf(w, "disk tier: %s on %s (%s at %s), %s free, O_DIRECT: %s\n",
			d.Dir, d.Filesystem, d.Device, d.MountPoint, gib(d.FreeBytes), direct)
	}
	fmt.Fprintf(w, "transports: %s\n", strings.Join(r.Transports, ", "))
}
