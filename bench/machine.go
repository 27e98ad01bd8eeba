package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// machine says what the numbers were measured on.
type machine struct {
	cpu   string
	cores int
	goVer string
}

func (m machine) String() string { return fmt.Sprintf("%s, %d cores, %s", m.cpu, m.cores, m.goVer) }

// short is the machine column of every table row.
func (m machine) short() string {
	cpu := strings.NewReplacer("(R)", "", "(TM)", "", " CPU", "", "Intel ", "", "AMD ", "").Replace(m.cpu)
	return fmt.Sprintf("%s ×%d, %s", strings.Join(strings.Fields(cpu), " "), m.cores, m.goVer)
}

func readMachine() machine {
	m := machine{cpu: "unknown CPU", cores: runtime.NumCPU(), goVer: runtime.Version()}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			m.cpu = strings.TrimSpace(v)
			break
		}
	}
	return m
}

// loadAverage is `uptime`'s line, or /proc/loadavg where uptime is missing:
// the machine is shared, and the report says how busy it was.
func loadAverage() string {
	if out, err := exec.Command("uptime").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		return "loadavg " + strings.TrimSpace(string(b))
	}
	return "unknown"
}
